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
  for (size_t size : {size_t{0}, size_t{1}, size_t{240}, size_t{32 << 10},
                      size_t{(32 << 10) + 1}, size_t{(64 << 10) - 7}, size_t{256 << 10},
                      size_t{(2 << 20) + 5}}) {
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

}  // namespace
}  // namespace kvtier
