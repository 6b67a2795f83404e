#include "daemon/blocking_pool.h"

#include <atomic>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testutil/status_matchers.h"

using ::kvtier::testing::StatusIs;

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
  EXPECT_THAT(pool.QueueFullStatus(), StatusIs(absl::StatusCode::kResourceExhausted));
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

// Fair queuing: one thread, a gate holding it, then tenant a's backlog of
// 1000 items and b's one item: b's runs among the first few, not after
// a's backlog.
TEST(BlockingPoolTest, OneTenantsBacklogDoesNotDelayAnother) {
  // Declared before the pool: its destructor runs what is still queued.
  absl::Mutex mu;
  size_t ran = 0;
  size_t b_position = 0;
  absl::Notification gate, gate_started, b_ran;
  BlockingPool pool(BlockingPoolOptions{1, 4096, 0, 0});
  ASSERT_TRUE(pool.Submit("gate", [&] {
    gate_started.Notify();
    gate.WaitForNotification();
  }));
  gate_started.WaitForNotification();
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(pool.Submit("a", [&] {
      absl::MutexLock lock(&mu);
      ++ran;
    }));
  }
  ASSERT_TRUE(pool.Submit("b", [&] {
    absl::MutexLock lock(&mu);
    b_position = ++ran;
    b_ran.Notify();
  }));
  gate.Notify();
  b_ran.WaitForNotification();
  absl::MutexLock lock(&mu);
  // a earns one quantum (4 default-cost items) per turn.
  EXPECT_LE(b_position, 1 + BlockingPool::kQuantum / BlockingPool::kDefaultCost);
}

// An item's cost is its bytes: a's 4 MiB items take turns with b's 64 KiB
// ones by bytes, so b runs many items per item of a.
TEST(BlockingPoolTest, TurnsAreSharedByBytes) {
  absl::Mutex mu;
  std::string order;
  absl::Notification gate, gate_started, done;
  int left = 20;
  auto record = [&](char c) {
    absl::MutexLock lock(&mu);
    order.push_back(c);
    if (--left == 0) done.Notify();
  };
  BlockingPool pool(BlockingPoolOptions{1, 4096, 0, 0});
  ASSERT_TRUE(pool.Submit("gate", [&] {
    gate_started.Notify();
    gate.WaitForNotification();
  }));
  gate_started.WaitForNotification();
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(pool.Submit(
        "a", [&] { record('a'); }, 4 << 20));
  for (int i = 0; i < 16; ++i)
    ASSERT_TRUE(pool.Submit(
        "b", [&] { record('b'); }, 64 << 10));
  gate.Notify();
  done.WaitForNotification();
  absl::MutexLock lock(&mu);
  // Every b item runs before a's second (a needs 16 turns per item).
  EXPECT_EQ(order.find('b'), order.find_first_not_of('a')) << order;
  EXPECT_LT(order.rfind('b'), order.find('a', order.find('a') + 1)) << order;
}

// The per-tenant running cap leaves a thread for the others: a holds one
// of two threads with a blocked item and has more queued; b's item runs
// on the second thread while a's first is still blocked.
TEST(BlockingPoolTest, ARunningCapLeavesAThreadForOtherTenants) {
  absl::Notification release_a, a_started;
  std::atomic<int> a_ran{0};
  std::promise<int> b_saw;
  BlockingPool pool(BlockingPoolOptions{2, 4096, 0, 1});
  ASSERT_TRUE(pool.Submit("a", [&] {
    a_started.Notify();
    release_a.WaitForNotification();
    ++a_ran;
  }));
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(pool.Submit("a", [&] { ++a_ran; }));
  a_started.WaitForNotification();
  ASSERT_TRUE(pool.Submit("b", [&] { b_saw.set_value(a_ran.load()); }));
  EXPECT_EQ(b_saw.get_future().get(), 0);  // a's first still blocked, none of a's queue ran
  release_a.Notify();
}

TEST(BlockingPoolTest, PerTenantQueueLimitNamesItsKey) {
  absl::Notification gate, gate_started;
  BlockingPool pool(BlockingPoolOptions{1, 100, 3, 0});
  ASSERT_TRUE(pool.Submit("a", [&] {
    gate_started.Notify();
    gate.WaitForNotification();
  }));
  gate_started.WaitForNotification();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pool.Submit("a", [] {}));
  EXPECT_FALSE(pool.Submit("a", [] {}));
  EXPECT_THAT(std::string(pool.QueueFullStatus("a").message()),
              ::testing::HasSubstr("server.io_queue_limit_per_tenant"));
  EXPECT_TRUE(pool.Submit("b", [] {}));  // another tenant still queues
  gate.Notify();
}

// The Select pool names its own keys (Runtime::select_pool).
TEST(BlockingPoolTest, QueueFullNamesTheConfiguredKeys) {
  absl::Notification gate, gate_started;
  BlockingPoolOptions o{1, 2, 1, 0};
  o.queue_limit_key = "select.queue_limit";
  o.queue_limit_per_tenant_key = "select.queue_limit_per_tenant";
  o.waits_for = "a Select thread";
  BlockingPool pool(o);
  ASSERT_TRUE(pool.Submit("a", [&] {
    gate_started.Notify();
    gate.WaitForNotification();
  }));
  gate_started.WaitForNotification();
  ASSERT_TRUE(pool.Submit("a", [] {}));
  EXPECT_FALSE(pool.Submit("a", [] {}));
  EXPECT_THAT(pool.QueueFullStatus("a"), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(pool.QueueFullStatus("a").message()),
              ::testing::HasSubstr("select.queue_limit_per_tenant: 1 calls of this tenant "
                                   "already wait for a Select thread"));
  ASSERT_TRUE(pool.Submit("b", [] {}));
  EXPECT_FALSE(pool.Submit("c", [] {}));
  EXPECT_THAT(std::string(pool.QueueFullStatus("c").message()),
              ::testing::HasSubstr("select.queue_limit: 2"));
  gate.Notify();
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
      SCOPED_TRACE(::testing::Message() << threads << " threads, parallelism " << parallelism);
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
