// WorkerPool: a fixed set of threads that help callers finish loops of
// independent items, shared by every Selector of a process (the daemon
// makes one for all Select streams: threads do not grow with streams).
//
// ParallelFor(count, max_slots, fn) runs fn(slot, item) for every item in
// [0, count) and returns when all are done. The calling thread works on its
// own loop as slot 0; idle pool threads join it as slots 1, 2, ... up to
// max_slots - 1, so a caller can keep per-slot scratch of max_slots
// entries. Items of one call never run on more than max_slots threads at
// once, and a call always makes progress on its caller's thread, even when
// every pool thread is busy with other calls (no deadlock, no waiting for a
// free thread).
//
// Fairness: every call names a lane (the daemon passes one per tenant). A
// pool thread that is free joins the waiting call whose lane has the fewest
// pool threads working for it at that moment, the oldest such call first,
// and helps it until its items run out or its slots are all taken. So a
// lane that floods the pool with calls holds the helpers only until they
// finish their current calls: another lane's call gets the next free one.
// Within a lane, calls are served in arrival order.
//
// Why this is not the daemon's BlockingPool (daemon/blocking_pool.h), the
// other pool of the process: the two do different work and one type would
// make each worse. This pool runs CPU-bound scoring loops that never block;
// a call's loop lives on its caller's stack and is joined without any
// allocation (the Select path allocates nothing once warm), pool threads
// hand out slot numbers for per-slot scratch, and calls are served in
// arrival order. BlockingPool runs owned tasks that wait on a disk, queued
// per tenant and served by deficit round robin with per-tenant caps and
// queue limits; its tasks are type-erased closures (an allocation each).
// Scoring on the I/O threads would put Select behind disk waits and
// tenants' put backlogs; disk waits on these threads would stall every
// Select stream's batches. index/ must not depend on daemon/, and
// BlockingPool's tenant lanes are daemon policy. What the two share is
// only the claim loop of a fork-join call (an atomic next-index counter,
// the caller working too), a few lines each.
//
// Thread safety: ParallelFor may be called from any number of threads at
// once. The destructor requires that no call is running; it joins the
// threads.
#ifndef KVTIER_INDEX_SELECT_WORKER_POOL_H_
#define KVTIER_INDEX_SELECT_WORKER_POOL_H_

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace kvtier::index {

class WorkerPool {
 public:
  // Not std::function: a capturing lambda would allocate on every call.
  using Fn = absl::FunctionRef<void(int32_t slot, int64_t item)>;

  // threads >= 0 pool threads (0: every call runs on its caller alone).
  explicit WorkerPool(int32_t threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int32_t threads() const { return static_cast<int32_t>(threads_.size()); }

  // See the file comment. max_slots >= 1; `lane` groups calls for the
  // fairness rule (any value; calls that do not care share lane 0).
  void ParallelFor(int64_t count, int32_t max_slots, const Fn& fn, uint64_t lane = 0);

  // Calls every pool thread has joined since construction (for tests).
  int64_t helped() const { return helped_.load(std::memory_order_relaxed); }

 private:
  // A call's loop; lives on its caller's stack and is linked into the
  // queue without allocating (ParallelFor allocates nothing).
  struct Job {
    const Fn* fn;
    int64_t count;
    int32_t max_slots;
    uint64_t lane;
    std::atomic<int64_t> next{0};
    std::atomic<int32_t> slots{1};  // slot 0 is the caller's
    int32_t helpers = 0;            // pool threads working on it; under mu_
    Job* later = nullptr;           // the queue's next call; under mu_
  };
  // Pool threads working for one lane. At most threads() lanes have any,
  // so a fixed table of threads() entries holds them without allocating.
  struct LaneLoad {
    uint64_t lane = 0;
    int32_t helpers = 0;  // 0: the entry is free
  };
  static void Drain(Job* job, int32_t slot);
  void Unlink(Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The queued call a free pool thread joins (first_ must not be null).
  Job* Pick() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int32_t HelpersOf(uint64_t lane) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddHelper(uint64_t lane, int32_t delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Loop();

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Calls pool threads may join, oldest first.
  Job* first_ ABSL_GUARDED_BY(mu_) = nullptr;
  Job* last_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<LaneLoad> lanes_ ABSL_GUARDED_BY(mu_);  // threads() entries
  std::atomic<int64_t> helped_{0};
  std::vector<std::thread> threads_;
};

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_SELECT_WORKER_POOL_H_
