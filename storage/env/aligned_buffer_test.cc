#include "storage/env/aligned_buffer.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/testutil/status_matchers.h"

using ::kvtier::testing::StatusIs;

namespace kvtier {
namespace {

TEST(AlignedBufferTest, AllocatesAlignedZeroedRoundedMemory) {
  absl::StatusOr<AlignedBuffer> buffer = AlignedBuffer::Allocate(5000);
  ASSERT_OK(buffer) << buffer.status();
  EXPECT_EQ(buffer->size(), 8192u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer->data()) % 4096, 0u);
  for (uint8_t byte : buffer->span()) ASSERT_EQ(byte, 0);

  AlignedBuffer moved = std::move(buffer).value();
  EXPECT_EQ(moved.size(), 8192u);
}

TEST(AlignedBufferTest, ZeroSizeIsInvalid) {
  EXPECT_THAT(AlignedBuffer::Allocate(0).status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(AlignedBufferPoolTest, AcquireReleaseAndContains) {
  auto pool = AlignedBufferPool::Create(64 * 1024);
  ASSERT_OK(pool) << pool.status();
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
  ASSERT_OK(pool);
  auto held = (*pool)->TryAcquire(8192);
  ASSERT_TRUE(held.has_value());
  absl::Span<uint8_t> got;
  std::thread waiter([&] { got = (*pool)->Acquire(4096); });
  (*pool)->Release(*held);
  waiter.join();
  EXPECT_EQ(got.size(), 4096u);
  (*pool)->Release(got);
}

// Regression: the wait condition once allocated as a side effect, and absl
// evaluates conditions more than once, so contended Acquire calls leaked
// slices until every thread blocked forever.
TEST(AlignedBufferPoolTest, ContendedBlockingAcquireLeaksNothing) {
  auto pool = AlignedBufferPool::Create(16 * 1024);
  ASSERT_OK(pool);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        absl::Span<uint8_t> slice = (*pool)->Acquire(4096 * (1 + (i + t) % 3));
        // Hold the slice for a while so that other threads queue up.
        std::memset(slice.data(), i, slice.size());
        std::this_thread::yield();
        (*pool)->Release(slice);
      }
    });
  }
  // The old bug ends in a deadlock: fail loudly instead of hanging the suite.
  absl::Notification joined;
  std::thread joiner([&] {
    for (auto& thread : threads) thread.join();
    joined.Notify();
  });
  if (!joined.WaitForNotificationWithTimeout(absl::Seconds(60))) {
    std::fprintf(stderr, "AlignedBufferPool::Acquire deadlocked\n");
    std::abort();
  }
  joiner.join();
  EXPECT_EQ((*pool)->used_bytes(), 0u);
  EXPECT_TRUE((*pool)->TryAcquire(16 * 1024).has_value());
}

}  // namespace
}  // namespace kvtier
