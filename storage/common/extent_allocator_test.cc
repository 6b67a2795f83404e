#include "storage/common/extent_allocator.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

TEST(ExtentAllocatorTest, AllocatesAlignedUntilFull) {
  ExtentAllocator a(10 * 4096 + 100, 4096);
  EXPECT_EQ(a.capacity_bytes(), 10 * 4096u);
  std::vector<uint64_t> offsets;
  for (int i = 0; i < 10; ++i) {
    auto off = a.Allocate(4000);
    ASSERT_TRUE(off.has_value());
    EXPECT_EQ(*off % 4096, 0u);
    offsets.push_back(*off);
  }
  EXPECT_FALSE(a.Allocate(1).has_value());
  EXPECT_EQ(a.used_bytes(), a.capacity_bytes());
  for (uint64_t off : offsets) a.Free(off, 4000);
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.largest_free_bytes(), a.capacity_bytes());
}

TEST(ExtentAllocatorTest, CoalescesNeighbours) {
  ExtentAllocator a(4 * 1024, 1024);
  auto x = a.Allocate(1024), y = a.Allocate(1024), z = a.Allocate(1024);
  ASSERT_TRUE(x && y && z);
  a.Free(*x, 1024);
  a.Free(*z, 1024);
  EXPECT_EQ(a.largest_free_bytes(), 2048u);  // z merged with the tail
  EXPECT_FALSE(a.Allocate(3 * 1024).has_value());
  a.Free(*y, 1024);
  EXPECT_EQ(a.largest_free_bytes(), 4096u);
  EXPECT_TRUE(a.Allocate(4096).has_value());
}

TEST(ExtentAllocatorTest, ReserveRebuildsState) {
  ExtentAllocator a(8 * 512, 512);
  EXPECT_TRUE(a.Reserve(1024, 512));
  EXPECT_FALSE(a.Reserve(1024, 512));   // already used
  EXPECT_FALSE(a.Reserve(100, 512));    // unaligned
  EXPECT_FALSE(a.Reserve(3584, 1024));  // past the end
  EXPECT_EQ(a.used_bytes(), 512u);
  auto off = a.Allocate(512);
  ASSERT_TRUE(off.has_value());
  EXPECT_NE(*off, 1024u);
}

TEST(ExtentAllocatorTest, RandomisedNeverOverlaps) {
  ExtentAllocator a(1 << 20, 256);
  std::mt19937 rng(7);
  std::vector<std::pair<uint64_t, uint64_t>> live;
  std::vector<uint8_t> owner(1 << 20, 0);
  for (int i = 0; i < 5000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      uint64_t size = 1 + rng() % 20000;
      auto off = a.Allocate(size);
      if (!off) continue;
      for (uint64_t b = *off; b < *off + a.RoundUp(size); ++b) {
        ASSERT_EQ(owner[b], 0) << "overlap at " << b;
        owner[b] = 1;
      }
      live.push_back({*off, size});
    } else {
      size_t k = rng() % live.size();
      auto [off, size] = live[k];
      for (uint64_t b = off; b < off + a.RoundUp(size); ++b) owner[b] = 0;
      a.Free(off, size);
      live.erase(live.begin() + k);
    }
  }
  uint64_t used = 0;
  for (auto& [off, size] : live) used += a.RoundUp(size);
  EXPECT_EQ(used, a.used_bytes());
}

}  // namespace
}  // namespace kvtier
