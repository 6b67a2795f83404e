#include "daemon/prefetcher.h"

#include <string>
#include <utility>

namespace kvtier::daemon {

Prefetcher::Prefetcher(BlockStore* store, size_t max_pending_keys)
    : store_(store), max_pending_keys_(max_pending_keys) {
  for (int lane = 0; lane < 2; ++lane) workers_[lane] = std::thread([this, lane] { Loop(lane); });
}

Prefetcher::~Prefetcher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& worker : workers_) worker.join();
}

bool Prefetcher::Submit(std::vector<BlockKey> keys) {
  if (keys.empty()) return true;
  return Enqueue(std::move(keys)) != 0;
}

uint64_t Prefetcher::Enqueue(std::vector<BlockKey> keys) {
  return EnqueueBatch(Batch{std::move(keys), /*to_device=*/false});
}

bool Prefetcher::SubmitPromotion(std::vector<BlockKey> keys) {
  if (keys.empty()) return true;
  return EnqueueBatch(Batch{std::move(keys), /*to_device=*/true}) != 0;
}

uint64_t Prefetcher::EnqueueBatch(Batch batch) {
  if (batch.keys.empty()) return 0;
  absl::MutexLock lock(&mu_);
  if (stopping_ || pending_keys_ + batch.keys.size() > max_pending_keys_) {
    dropped_ += batch.keys.size();
    return 0;
  }
  pending_keys_ += batch.keys.size();
  const bool to_device = batch.to_device;
  queues_[to_device ? 1 : 0].push_back(std::move(batch));
  // A promotion has no ticket of its own (any non-zero value says queued).
  return to_device ? 1 : ++submitted_batches_;
}

size_t Prefetcher::PromoteToDevice(const std::vector<BlockKey>& keys) {
  store_->Prefetch(keys);  // NVMe-only ones first into host memory
  std::vector<absl::StatusOr<DeviceHandle>> handles;
  const std::string& tenant = keys.front().tenant;
  absl::StatusOr<uint64_t> lease =
      store_->AcquireHandles(tenant, keys, /*ttl_ms=*/0, &handles, {.memory_only = true});
  if (!lease.ok() || *lease == 0) return 0;
  size_t pinned = 0;
  for (const auto& h : handles) pinned += h.ok();
  store_->Release(tenant, *lease).IgnoreError();
  return pinned;
}

bool Prefetcher::WaitFor(uint64_t ticket, absl::Duration timeout) {
  if (ticket == 0) return false;
  struct Args {
    const uint64_t* done;
    uint64_t ticket;
  } args{&done_batches_, ticket};
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(
                                  +[](Args* a) { return *a->done >= a->ticket; }, &args),
                              timeout);
}

void Prefetcher::Loop(int lane) {
  std::deque<Batch>* queue = &queues_[lane];
  struct Ready {
    const bool* stopping;
    const std::deque<Batch>* queue;
  } ready{&stopping_, queue};
  for (;;) {
    Batch batch;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Ready* r) { return *r->stopping || !r->queue->empty(); }, &ready));
      if (stopping_) return;
      batch = std::move(queue->front());
      queue->pop_front();
    }
    const size_t promoted =
        batch.to_device ? PromoteToDevice(batch.keys) : store_->Prefetch(batch.keys);
    absl::MutexLock lock(&mu_);
    pending_keys_ -= batch.keys.size();
    (batch.to_device ? promoted_to_device_ : promoted_) += promoted;
    if (!batch.to_device) ++done_batches_;
  }
}

void Prefetcher::WaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](size_t* pending) { return *pending == 0; }, &pending_keys_));
}

uint64_t Prefetcher::promoted() const {
  absl::MutexLock lock(&mu_);
  return promoted_;
}

uint64_t Prefetcher::promoted_to_device() const {
  absl::MutexLock lock(&mu_);
  return promoted_to_device_;
}

uint64_t Prefetcher::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

}  // namespace kvtier::daemon
