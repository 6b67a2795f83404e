#include "storage/common/checksum.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

// BlockChecksum must be XXH3_64bits exactly: checksums taken by one side (a
// client's optional xxh3, records written by an earlier build) are verified
// by the other.
TEST(ChecksumTest, SameAsXxh3AtEverySizeAndAlignment) {
  std::mt19937_64 rng(1);
  std::vector<uint8_t> src((1 << 20) + 64);
  for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
  for (size_t size : {size_t{0}, size_t{1}, size_t{17}, size_t{240}, size_t{4096},
                      size_t{(64 << 10) + 1}, size_t{256 << 10}, size_t{1 << 20}}) {
    for (size_t offset : {size_t{0}, size_t{3}}) {
      const uint8_t* p = src.data() + offset;
      EXPECT_EQ(BlockChecksum({p, size}), XXH3_64bits(p, size)) << size << " @ " << offset;
    }
  }
}

// The fused copy writes exactly the source and returns the same checksum as
// hashing the copy afterwards, across the chunk boundaries it works in.
TEST(ChecksumTest, CopyWithChecksumCopiesAndHashesAtEverySize) {
  std::mt19937_64 rng(2);
  std::vector<uint8_t> src((2 << 20) + 64);
  for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
  for (size_t size : {size_t{0}, size_t{1}, size_t{240}, size_t{32 << 10}, size_t{(32 << 10) + 1},
                      size_t{(64 << 10) - 7}, size_t{256 << 10}, size_t{(2 << 20) + 5}}) {
    for (size_t offset : {size_t{0}, size_t{3}}) {
      const uint8_t* p = src.data() + offset;
      std::vector<uint8_t> dst(size + 1, 0xA5);
      const uint64_t sum = CopyWithChecksum({p, size}, dst.data());
      EXPECT_EQ(sum, XXH3_64bits(p, size)) << size << " @ " << offset;
      EXPECT_TRUE(std::equal(p, p + size, dst.begin())) << size << " @ " << offset;
      EXPECT_EQ(dst[size], 0xA5) << "wrote past the end at " << size;
    }
  }
}

// `src` cut at `cuts` random places (pieces may be empty), in order.
std::vector<absl::Span<const uint8_t>> CutIntoPieces(const std::vector<uint8_t>& src, size_t cuts,
                                                     std::mt19937_64& rng) {
  std::vector<size_t> at = {0, src.size()};
  for (size_t i = 0; i < cuts; ++i) at.push_back(rng() % (src.size() + 1));
  std::sort(at.begin(), at.end());
  std::vector<absl::Span<const uint8_t>> pieces;
  pieces.reserve(at.size() - 1);
  for (size_t i = 0; i + 1 < at.size(); ++i) {
    pieces.emplace_back(src.data() + at[i], at[i + 1] - at[i]);
  }
  return pieces;
}

// Pieces of every size, including empty ones and ones across the chunk
// size, gather into the concatenation and hash as one payload.
TEST(ChecksumTest, GatherWithChecksumEqualsOneCopyOfTheConcatenation) {
  std::mt19937_64 rng(3);
  std::vector<uint8_t> src((1 << 20) + 77);
  for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
  for (size_t cuts : {size_t{0}, size_t{1}, size_t{2}, size_t{7}, size_t{40}}) {
    const std::vector<absl::Span<const uint8_t>> pieces = CutIntoPieces(src, cuts, rng);
    std::vector<uint8_t> dst(src.size() + 1, 0xA5);
    EXPECT_EQ(GatherWithChecksum(pieces, dst.data()), XXH3_64bits(src.data(), src.size())) << cuts;
    EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin())) << cuts;
    EXPECT_EQ(dst[src.size()], 0xA5);
  }
}

// The visiting gather: the same bytes and checksum, and a call after each
// chunk with the bytes written so far, growing by at most a chunk (less at
// a piece's end) and ending at the total.
TEST(ChecksumTest, GatherWithChecksumReportsEveryChunkAsWritten) {
  std::mt19937_64 rng(5);
  std::vector<uint8_t> src((300 << 10) + 13);
  for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
  for (size_t cuts : {size_t{0}, size_t{3}, size_t{25}}) {
    const std::vector<absl::Span<const uint8_t>> pieces = CutIntoPieces(src, cuts, rng);
    std::vector<uint8_t> dst(src.size() + 1, 0xA5);
    std::vector<size_t> seen;
    const uint64_t sum = GatherWithChecksum(pieces, dst.data(), [&](size_t written) {
      // Everything reported is already in place.
      EXPECT_TRUE(std::equal(src.begin(), src.begin() + written, dst.begin())) << written;
      seen.push_back(written);
    });
    EXPECT_EQ(sum, XXH3_64bits(src.data(), src.size())) << cuts;
    EXPECT_EQ(dst[src.size()], 0xA5);
    ASSERT_FALSE(seen.empty());
    EXPECT_EQ(seen.back(), src.size());
    size_t before = 0;
    for (size_t w : seen) {
      EXPECT_GT(w, before);
      EXPECT_LE(w - before, kChecksumChunkBytes);
      before = w;
    }
    EXPECT_GE(seen.size(), src.size() / kChecksumChunkBytes);
  }
}

}  // namespace
}  // namespace kvtier
