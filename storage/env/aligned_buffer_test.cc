#include "storage/env/aligned_buffer.h"

#include <cstdint>
#include <thread>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

TEST(AlignedBufferTest, AllocatesAlignedZeroedRoundedMemory) {
  absl::StatusOr<AlignedBuffer> buffer = AlignedBuffer::Allocate(5000);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(buffer->size(), 8192u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer->data()) % 4096, 0u);
  for (uint8_t byte : buffer->span()) ASSERT_EQ(byte, 0);

  AlignedBuffer moved = std::move(buffer).value();
  EXPECT_EQ(moved.size(), 8192u);
}

TEST(AlignedBufferTest, ZeroSizeIsInvalid) {
  EXPECT_EQ(AlignedBuffer::Allocate(0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(AlignedBufferPoolTest, AcquireReleaseAndContains) {
  auto pool = AlignedBufferPool::Create(64 * 1024);
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto a = (*pool)->TryAcquire(100);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->size(), 4096u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 4096, 0u);
  EXPECT_TRUE((*pool)->Contains(a->data(), a->size()));
  uint8_t outside = 0;
  EXPECT_FALSE((*pool)->Contains(&outside, 1));

  auto b = (*pool)->TryAcquire(60 * 1024);
  ASSERT_TRUE(b.has_value());
  EXPECT_FALSE((*pool)->TryAcquire(4096).has_value()) << "pool is full";
  EXPECT_FALSE((*pool)->TryAcquire(128 * 1024).has_value()) << "above capacity";
  (*pool)->Release(*a);
  (*pool)->Release(*b);
  EXPECT_EQ((*pool)->used_bytes(), 0u);
  EXPECT_TRUE((*pool)->TryAcquire(64 * 1024).has_value());
}

TEST(AlignedBufferPoolTest, BlockingAcquireReturnsOnceSpaceIsReleased) {
  auto pool = AlignedBufferPool::Create(8192);
  ASSERT_TRUE(pool.ok());
  auto held = (*pool)->TryAcquire(8192);
  ASSERT_TRUE(held.has_value());
  absl::Span<uint8_t> got;
  std::thread waiter([&] { got = (*pool)->Acquire(4096); });
  (*pool)->Release(*held);
  waiter.join();
  EXPECT_EQ(got.size(), 4096u);
  (*pool)->Release(got);
}

}  // namespace
}  // namespace kvtier
