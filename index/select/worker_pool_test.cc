#include "index/select/worker_pool.h"

#include <algorithm>
#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace kvtier::index {
namespace {

// Every item runs exactly once, on slots below max_slots.
TEST(WorkerPoolTest, EveryItemOnceWithinTheSlots) {
  WorkerPool pool(3);
  for (int32_t slots : {1, 2, 4, 8}) {
    std::vector<std::atomic<int>> seen(1000);
    std::atomic<int32_t> max_slot{0};
    pool.ParallelFor(1000, slots, [&](int32_t slot, int64_t i) {
      seen[i].fetch_add(1);
      int32_t m = max_slot.load();
      while (slot > m && !max_slot.compare_exchange_weak(m, slot)) {
      }
    });
    for (const auto& s : seen) ASSERT_EQ(s.load(), 1);
    EXPECT_LT(max_slot.load(), slots);
  }
}

// Two slots of one call never run at once on the same slot number: a
// caller keeps one scratch per slot.
TEST(WorkerPoolTest, ASlotIsNeverUsedByTwoThreadsAtOnce) {
  WorkerPool pool(4);
  std::vector<std::atomic<int>> busy(4);
  std::atomic<bool> clash{false};
  pool.ParallelFor(20000, 4, [&](int32_t slot, int64_t) {
    if (busy[slot].fetch_add(1) != 0) clash = true;
    busy[slot].fetch_sub(1);
  });
  EXPECT_FALSE(clash.load());
}

// Many callers at once share the pool; each finishes its own loop even
// when every pool thread is busy with another caller's (the caller works
// on its own loop).
TEST(WorkerPoolTest, ConcurrentCallersAllFinish) {
  WorkerPool pool(2);
  constexpr int kCallers = 16;
  std::vector<std::thread> callers;
  std::atomic<int64_t> total{0};
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 50; ++round) {
        pool.ParallelFor(64, 3, [&](int32_t, int64_t) { total.fetch_add(1); });
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), int64_t{kCallers} * 50 * 64);
}

// A call whose items block until another call's items ran cannot deadlock
// on a pool of one thread: the second caller runs its own items.
TEST(WorkerPoolTest, ProgressWithoutAFreePoolThread) {
  WorkerPool pool(1);
  absl::Notification first_started, second_done;
  std::thread first([&] {
    pool.ParallelFor(2, 2, [&](int32_t, int64_t i) {
      if (i == 0) {
        first_started.Notify();
        second_done.WaitForNotification();
      }
    });
  });
  first_started.WaitForNotification();
  int ran = 0;
  pool.ParallelFor(5, 2, [&](int32_t, int64_t) { ++ran; });  // may run all on this thread
  EXPECT_EQ(ran, 5);
  second_done.Notify();
  first.join();
}

// A free pool thread joins the call of the lane with the fewest helpers,
// not the oldest call: with both helpers on lane 1's call and another
// lane-1 call queued before a lane-2 call, the first helper to come free
// goes to lane 2.
TEST(WorkerPoolTest, AFreeHelperGoesToTheLaneWithFewestHelpers) {
  WorkerPool pool(2);
  absl::Mutex mu;
  // Per call: the slot each item ran on (-1: not started).
  std::vector<int32_t> slot_a(3, -1), slot_a2(2, -1), slot_b(2, -1);
  bool release_all = false;
  int64_t release_a_item = -1;  // the lane-1 helper item let go first
  auto run = [&](std::vector<int32_t>* slots, int64_t item, int32_t slot, bool is_a) {
    absl::MutexLock lock(&mu);
    (*slots)[item] = slot;
    const auto released = [&] { return release_all || (is_a && release_a_item == item); };
    mu.Await(absl::Condition(&released));
  };
  auto started = [&](const std::vector<int32_t>& slots, size_t n) {
    absl::MutexLock lock(&mu);
    const auto enough = [&] {
      return static_cast<size_t>(
                 std::count_if(slots.begin(), slots.end(), [](int32_t s) { return s >= 0; })) >= n;
    };
    return mu.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30));
  };
  std::thread a([&] {
    pool.ParallelFor(
        3, 3, [&](int32_t slot, int64_t i) { run(&slot_a, i, slot, true); }, 1);
  });
  ASSERT_TRUE(started(slot_a, 3)) << "both helpers joined lane 1's call";
  std::thread a2([&] {
    pool.ParallelFor(
        2, 2, [&](int32_t slot, int64_t i) { run(&slot_a2, i, slot, false); }, 1);
  });
  ASSERT_TRUE(started(slot_a2, 1));  // queued, its caller on item 0
  std::thread b([&] {
    pool.ParallelFor(
        2, 2, [&](int32_t slot, int64_t i) { run(&slot_b, i, slot, false); }, 2);
  });
  ASSERT_TRUE(started(slot_b, 1));  // queued after lane 1's second call
  {
    absl::MutexLock lock(&mu);
    for (int64_t i = 0; i < 3; ++i) {
      if (slot_a[i] > 0) release_a_item = i;  // an item on a pool thread
    }
  }
  const bool b_helped = started(slot_b, 2);
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(b_helped) << "lane 2's call got no helper";
    EXPECT_GE(slot_b[1], 1) << "lane 2's second item ran on a pool thread";
    EXPECT_EQ(slot_a2[1], -1) << "lane 1's queued call waited";
    release_all = true;
  }
  a.join();
  a2.join();
  b.join();
  EXPECT_GE(slot_a2[1], 0);
}

TEST(WorkerPoolTest, NoThreadsRunsOnTheCaller) {
  WorkerPool pool(0);
  std::set<std::thread::id> ids;
  pool.ParallelFor(10, 4, [&](int32_t slot, int64_t) {
    EXPECT_EQ(slot, 0);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ids.size(), 1u);
  EXPECT_EQ(*ids.begin(), std::this_thread::get_id());
}

}  // namespace
}  // namespace kvtier::index
