// BlockingPool: the threads that run the RPC work which may wait on a disk
// (NVMe reads, writes and syncs, synced catalog writes), so that gRPC's
// callback threads never block on I/O and a slow disk delays only the calls
// that need it, not Select or Lookup.
//
//   if (!pool->Submit([this] { ...; reactor->Finish(status); })) {
//     reactor->Finish(pool->QueueFullStatus());
//   }
//
// What runs here: PutBlocks messages, GetBlocks responses, DeleteBlocks and
// RegisterProfile. Each streaming call has at most one item queued at a
// time (its reactor reads or writes the next message only after its item
// ran), so the queue is bounded by the number of calls in flight and,
// explicitly, by `max_queued` (server.io_queue_limit).
//
// Tenants share the threads fairly: each tenant has its own queue (a lane),
// and idle threads take work from the lanes by deficit round robin, each
// item costing its bytes (a PutBlocks message's size; kDefaultCost for
// calls without a size), a lane earning kQuantum per turn. A tenant's
// thousands of queued puts therefore delay another tenant's call by at
// most about one turn of each busy lane, not by the whole backlog. Per
// tenant, at most `max_running_per_tenant` items run at once (the
// runtime leaves one thread for the others when authentication is on:
// server.io_threads_per_tenant) and at most `max_queued_per_tenant` wait
// (server.io_queue_limit_per_tenant, then RESOURCE_EXHAUSTED naming it).
// Work submitted without a tenant shares the lane "".
//
// With threads == 0 Submit runs the work inline on the caller's thread (the
// behaviour before this pool; kept to measure the difference).
//
// Not index::WorkerPool (index/select/worker_pool.h), the Select path's pool of
// CPU threads: that one runs allocation-free fork-join loops that never
// block, in arrival order; this one runs tasks that wait on a disk, fairly
// between tenants. Its header says why they stay two types.
//
// Thread safety: Submit and stats are thread-safe. The destructor runs
// every queued item (ignoring the per-tenant running cap), then joins; no
// Submit may race with it.
#ifndef KVTIER_DAEMON_BLOCKING_POOL_H_
#define KVTIER_DAEMON_BLOCKING_POOL_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace kvtier::daemon {

struct BlockingPoolStats {
  uint64_t threads = 0;
  uint64_t queued = 0;       // waiting now
  uint64_t peak_queued = 0;  // most ever waiting
  uint64_t ran = 0;          // items finished
  uint64_t rejected = 0;     // Submit calls refused: queue full
};

struct BlockingPoolOptions {
  size_t threads = 4;
  size_t max_queued = 4096;           // all tenants together
  size_t max_queued_per_tenant = 0;   // 0: max_queued
  size_t max_running_per_tenant = 0;  // 0: threads
  // What QueueFullStatus names: the config keys of the two queue limits
  // and what the calls wait for.
  std::string queue_limit_key = "server.io_queue_limit";
  std::string queue_limit_per_tenant_key = "server.io_queue_limit_per_tenant";
  std::string waits_for = "block I/O";
};

class BlockingPool {
 public:
  // What an item without a size costs, and what a lane earns per turn.
  static constexpr uint64_t kDefaultCost = 64 << 10;
  static constexpr uint64_t kQuantum = 256 << 10;

  explicit BlockingPool(const BlockingPoolOptions& options);
  BlockingPool(size_t threads, size_t max_queued)
      : BlockingPool(MakeOptions(threads, max_queued)) {}
  ~BlockingPool();

  BlockingPool(const BlockingPool&) = delete;
  BlockingPool& operator=(const BlockingPool&) = delete;

  // Queues `work` in `tenant`'s lane (or runs it now when the pool has no
  // threads). False, and `work` dropped unrun, when max_queued items wait
  // in all or max_queued_per_tenant in the lane (QueueFullStatus(tenant)
  // says which).
  bool Submit(const std::string& tenant, absl::AnyInvocable<void() &&> work,
              uint64_t cost = kDefaultCost);
  bool Submit(absl::AnyInvocable<void() &&> work) { return Submit("", std::move(work)); }

  // Queues `work` only when a thread is idle, counting the items already
  // waiting, and `tenant` is below its running cap (so it never delays
  // other calls' work, and never counts against server.io_queue_limit);
  // false and `work` dropped otherwise. For optional helpers (ParallelFor).
  bool SubmitIfIdle(const std::string& tenant, absl::AnyInvocable<void() &&> work);
  bool SubmitIfIdle(absl::AnyInvocable<void() &&> work) {
    return SubmitIfIdle("", std::move(work));
  }

  // RESOURCE_EXHAUSTED naming options.queue_limit_per_tenant_key when
  // `tenant`'s lane is full, else options.queue_limit_key: what a call
  // refused by Submit should finish with.
  absl::Status QueueFullStatus(const std::string& tenant = "") const;

  BlockingPoolStats stats() const;

 private:
  static BlockingPoolOptions MakeOptions(size_t threads, size_t max_queued) {
    BlockingPoolOptions o;
    o.threads = threads;
    o.max_queued = max_queued;
    return o;
  }
  struct Item {
    absl::AnyInvocable<void() &&> work;
    uint64_t cost = 0;
  };
  struct Lane {
    std::deque<Item> items;
    uint64_t deficit = 0;
    size_t running = 0;   // items of this lane on a thread now
    bool active = false;  // in active_
  };
  // The next item by deficit round robin among lanes below their running
  // cap; false when none may run now.
  bool PickLocked(Item* item, Lane** lane, std::string* tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool RunnableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DoneLocked(const std::string& tenant, Lane* lane) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run();

  const BlockingPoolOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Lane>> lanes_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<std::string, Lane*>> active_ ABSL_GUARDED_BY(mu_);  // lanes with items
  std::deque<std::pair<std::string, Item>> helpers_ ABSL_GUARDED_BY(mu_);  // SubmitIfIdle
  // queued (items in every lane), peak_queued, ran and rejected; stats()
  // adds threads.
  BlockingPoolStats counts_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  size_t running_ ABSL_GUARDED_BY(mu_) = 0;  // items being run now
  std::vector<std::thread> threads_;
};

// Runs fn(i) once for every i in [0, n): on the calling thread and on up
// to parallelism - 1 helpers queued with pool->SubmitIfIdle (fewer when the
// pool has no threads or other work waits). Returns when every i has run.
// It cannot deadlock on a busy pool: the caller claims and runs indices
// itself and waits only for indices a running helper already claimed; a
// helper that starts after the last index was claimed does nothing. fn must
// be safe to call concurrently for different i.
// `tenant`: whose lane the helpers count against.
void ParallelFor(BlockingPool* pool, size_t n, size_t parallelism,
                 absl::FunctionRef<void(size_t)> fn, const std::string& tenant = "");

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_BLOCKING_POOL_H_
