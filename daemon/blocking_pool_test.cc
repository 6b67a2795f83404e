#include "daemon/blocking_pool.h"

#include <atomic>
#include <future>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/synchronization/mutex.h"
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

TEST(ParallelForTest, RunsEveryIndexOnceWithAndWithoutHelpers) {
  for (size_t threads : {0u, 1u, 3u}) {
    for (size_t parallelism : {1u, 2u, 4u, 8u}) {
      SCOPED_TRACE(testing::Message() << threads << " threads, parallelism " << parallelism);
      BlockingPool pool(threads, 16);
      std::vector<std::atomic<int>> seen(257);
      ParallelFor(&pool, seen.size(), parallelism, [&](size_t i) { ++seen[i]; });
      for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i].load(), 1) << i;
      ParallelFor(&pool, 0, parallelism, [&](size_t) { FAIL() << "no index to run"; });
    }
  }
}

// Two indices that each wait for the other can only finish when they run at
// the same time: a helper really runs beside the caller.
TEST(ParallelForTest, HelpersRunBesideTheCaller) {
  BlockingPool pool(2, 16);
  absl::Mutex mu;
  int arrived = 0;
  std::atomic<int> met{0};
  ParallelFor(&pool, 2, 2, [&](size_t) {
    absl::MutexLock lock(&mu);
    ++arrived;
    auto both_here = [&arrived]() { return arrived == 2; };
    // Bounded: a serial run fails here instead of hanging.
    if (mu.AwaitWithTimeout(absl::Condition(&both_here), absl::Seconds(30))) ++met;
  });
  EXPECT_EQ(met.load(), 2);
}

// A pool whose threads are all busy gets no helpers queued (they would
// wait behind other calls' work): the caller runs every index itself and
// returns while the pool is still blocked.
TEST(ParallelForTest, BusyPoolLeavesTheWorkToTheCaller) {
  BlockingPool pool(1, 16);
  absl::Notification release, started;
  ASSERT_TRUE(pool.Submit([&] {
    started.Notify();
    release.WaitForNotification();
  }));
  started.WaitForNotification();
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> elsewhere{0}, ran{0};
  ParallelFor(&pool, 64, 4, [&](size_t) {
    ++ran;
    if (std::this_thread::get_id() != caller) ++elsewhere;
  });
  EXPECT_EQ(ran.load(), 64);
  EXPECT_EQ(elsewhere.load(), 0);
  EXPECT_EQ(pool.stats().queued, 0u);
  release.Notify();
}

}  // namespace
}  // namespace kvtier::daemon
