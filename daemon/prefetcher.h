// Prefetcher: brings blocks from NVMe into host memory (BlockStore::Prefetch,
// no pin) on a background thread: blocks whose stability is rising, and
// blocks a Select chose that were on NVMe only (answered PENDING), so that
// Select promotes them to the device tier from memory and never reads NVMe
// on its own (gRPC) thread. It also promotes blocks into the device arena
// (SubmitPromotion): those a Select chose but left in host memory because
// its inline promotion budget was spent (select.inline_promotion_bytes);
// they are pinned for the copy and released at once, so the next Select
// finds them resident. The two kinds run on two threads of their own (a
// burst of promotions never holds up NVMe prefetches, nor the reverse);
// each kind's batches are processed in submission order.
//
// Bounded: at most max_pending_keys keys wait; a Submit beyond that drops
// its keys (prefetching is a hint).
//
// Thread safety: Submit may be called from any thread. The destructor stops
// the worker after the batch in progress.
#ifndef KVTIER_DAEMON_PREFETCHER_H_
#define KVTIER_DAEMON_PREFETCHER_H_

#include <cstdint>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "storage/store/block_store.h"

namespace kvtier::daemon {

class Prefetcher {
 public:
  // store is not owned and outlives the prefetcher.
  Prefetcher(BlockStore* store, size_t max_pending_keys);
  ~Prefetcher();

  // Queues keys; returns false (and queues none) when that would exceed
  // max_pending_keys.
  bool Submit(std::vector<BlockKey> keys);
  // As Submit, returning a ticket for WaitFor (0 when the keys were
  // dropped or there were none).
  uint64_t Enqueue(std::vector<BlockKey> keys);
  // Queues keys (of one tenant) to be brought into that tenant's device
  // arena, from NVMe through host memory where needed; same bound.
  bool SubmitPromotion(std::vector<BlockKey> keys);
  // Waits until the batch of `ticket` (and every earlier Enqueue/Submit
  // batch) was prefetched, or `timeout` passed; true when it was.
  bool WaitFor(uint64_t ticket, absl::Duration timeout);

  // Blocks until no key is queued or being prefetched.
  void WaitIdle();

  uint64_t promoted() const;            // blocks brought into host memory so far
  uint64_t promoted_to_device() const;  // blocks SubmitPromotion brought into the arena
  uint64_t dropped() const;             // keys dropped because the queue was full

 private:
  struct Batch {
    std::vector<BlockKey> keys;
    bool to_device = false;
  };
  // One worker per kind of batch: host prefetches (lane 0) and device
  // promotions (lane 1).
  void Loop(int lane);
  uint64_t EnqueueBatch(Batch batch);
  // Pins the batch's keys (memory_only) and releases them; returns how many
  // were pinned, i.e. are now in the arena.
  size_t PromoteToDevice(const std::vector<BlockKey>& keys);

  BlockStore* const store_;
  const size_t max_pending_keys_;
  mutable absl::Mutex mu_;
  std::deque<Batch> queues_[2] ABSL_GUARDED_BY(mu_);  // by lane
  size_t pending_keys_ ABSL_GUARDED_BY(mu_) = 0;      // queued or being prefetched
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t promoted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t promoted_to_device_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  // Tickets: host prefetch batches only.
  uint64_t submitted_batches_ ABSL_GUARDED_BY(mu_) = 0;  // the last ticket handed out
  uint64_t done_batches_ ABSL_GUARDED_BY(mu_) = 0;       // tickets up to this are done
  std::thread workers_[2];
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_PREFETCHER_H_
