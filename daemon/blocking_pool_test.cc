#include "daemon/blocking_pool.h"

#include <atomic>
#include <future>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

TEST(BlockingPoolTest, NoThreadsRunsInline) {
  BlockingPool pool(0, 1);
  const std::thread::id caller = std::this_thread::get_id();
  std::thread::id ran_on;
  ASSERT_TRUE(pool.Submit([&] { ran_on = std::this_thread::get_id(); }));
  ASSERT_TRUE(pool.Submit([] {}));  // the queue limit does not apply inline
  EXPECT_EQ(ran_on, caller);
  EXPECT_EQ(pool.stats().ran, 2u);
  EXPECT_EQ(pool.stats().threads, 0u);
}

TEST(BlockingPoolTest, RunsOnItsThreadsAndRefusesBeyondTheQueueLimit) {
  BlockingPool pool(1, 2);
  absl::Notification started, release;
  ASSERT_TRUE(pool.Submit([&] {
    started.Notify();
    release.WaitForNotification();
  }));
  started.WaitForNotification();  // the only thread is busy
  std::atomic<int> ran{0};
  ASSERT_TRUE(pool.Submit([&] { ++ran; }));
  ASSERT_TRUE(pool.Submit([&] { ++ran; }));
  bool dropped_ran = false;
  EXPECT_FALSE(pool.Submit([&] { dropped_ran = true; }));
  BlockingPoolStats s = pool.stats();
  EXPECT_EQ(s.queued, 2u);
  EXPECT_EQ(s.peak_queued, 2u);
  EXPECT_EQ(s.rejected, 1u);
  EXPECT_THAT(std::string(pool.QueueFullStatus().message()),
              ::testing::HasSubstr("server.io_queue_limit: 2"));
  EXPECT_EQ(pool.QueueFullStatus().code(), absl::StatusCode::kResourceExhausted);
  release.Notify();
  absl::Notification last;
  // Space again once the thread drains the queue.
  while (!pool.Submit([&] { last.Notify(); })) std::this_thread::yield();
  last.WaitForNotification();
  EXPECT_EQ(ran.load(), 2);
  EXPECT_FALSE(dropped_ran);
}

TEST(BlockingPoolTest, DestructionRunsEverythingQueued) {
  std::atomic<int> ran{0};
  {
    BlockingPool pool(2, 1000);
    for (int i = 0; i < 500; ++i) {
      ASSERT_TRUE(pool.Submit([&] { ++ran; }));
    }
  }
  EXPECT_EQ(ran.load(), 500);
}

TEST(BlockingPoolTest, ManySubmittersManyThreads) {
  std::atomic<uint64_t> sum{0};
  {
    BlockingPool pool(4, 100000);
    std::vector<std::thread> submitters;
    for (int t = 0; t < 4; ++t) {
      submitters.emplace_back([&, t] {
        for (int i = 1; i <= 1000; ++i) {
          ASSERT_TRUE(pool.Submit([&sum, i] { sum += i; }));
        }
      });
    }
    for (auto& t : submitters) t.join();
  }
  EXPECT_EQ(sum.load(), 4u * 1000 * 1001 / 2);
}

}  // namespace
}  // namespace kvtier::daemon
