#include "storage/common/checksum.h"

#include <xxhash.h>

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

}  // namespace
}  // namespace kvtier
