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
// With threads == 0 Submit runs the work inline on the caller's thread (the
// behaviour before this pool; kept to measure the difference).
//
// Thread safety: Submit and stats are thread-safe. The destructor runs
// every queued item, then joins; no Submit may race with it.
#ifndef KVTIER_DAEMON_BLOCKING_POOL_H_
#define KVTIER_DAEMON_BLOCKING_POOL_H_

#include <cstdint>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
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

class BlockingPool {
 public:
  BlockingPool(size_t threads, size_t max_queued);
  ~BlockingPool();

  BlockingPool(const BlockingPool&) = delete;
  BlockingPool& operator=(const BlockingPool&) = delete;

  // Queues `work` (or runs it now when the pool has no threads). False,
  // and `work` dropped unrun, when max_queued items already wait.
  bool Submit(absl::AnyInvocable<void() &&> work);

  // Queues `work` only when a thread is idle, counting the items already
  // waiting (so it never delays other calls' work, and never counts against
  // server.io_queue_limit); false and `work` dropped otherwise. For
  // optional helpers (ParallelFor).
  bool SubmitIfIdle(absl::AnyInvocable<void() &&> work);

  // RESOURCE_EXHAUSTED naming server.io_queue_limit: what a call refused
  // by Submit should finish with.
  absl::Status QueueFullStatus() const;

  BlockingPoolStats stats() const;

 private:
  void Run();

  const size_t max_queued_;
  mutable absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t peak_queued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t ran_ ABSL_GUARDED_BY(mu_) = 0;
  size_t running_ ABSL_GUARDED_BY(mu_) = 0;  // items being run now
  uint64_t rejected_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> threads_;
};

// Runs fn(i) once for every i in [0, n): on the calling thread and on up
// to parallelism - 1 helpers queued with pool->SubmitIfIdle (fewer when the
// pool has no threads or other work waits). Returns when every i has run.
// It cannot deadlock on a busy pool: the caller claims and runs indices
// itself and waits only for indices a running helper already claimed; a
// helper that starts after the last index was claimed does nothing. fn must
// be safe to call concurrently for different i.
void ParallelFor(BlockingPool* pool, size_t n, size_t parallelism,
                 absl::FunctionRef<void(size_t)> fn);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_BLOCKING_POOL_H_
