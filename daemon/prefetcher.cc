#include "daemon/prefetcher.h"

#include <utility>

namespace kvtier::daemon {

Prefetcher::Prefetcher(BlockStore* store, size_t max_pending_keys)
    : store_(store), max_pending_keys_(max_pending_keys) {
  worker_ = std::thread([this] { Loop(); });
}

Prefetcher::~Prefetcher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  worker_.join();
}

bool Prefetcher::Submit(std::vector<BlockKey> keys) {
  if (keys.empty()) return true;
  return Enqueue(std::move(keys)) != 0;
}

uint64_t Prefetcher::Enqueue(std::vector<BlockKey> keys) {
  if (keys.empty()) return 0;
  absl::MutexLock lock(&mu_);
  if (stopping_ || pending_keys_ + keys.size() > max_pending_keys_) {
    dropped_ += keys.size();
    return 0;
  }
  pending_keys_ += keys.size();
  queue_.push_back(std::move(keys));
  return ++submitted_batches_;
}

bool Prefetcher::WaitFor(uint64_t ticket, absl::Duration timeout) {
  if (ticket == 0) return false;
  struct Args {
    const uint64_t* done;
    uint64_t ticket;
  } args{&done_batches_, ticket};
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(
      absl::Condition(+[](Args* a) { return *a->done >= a->ticket; }, &args), timeout);
}

void Prefetcher::Loop() {
  for (;;) {
    std::vector<BlockKey> batch;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &Prefetcher::ReadyLocked));
      if (stopping_) return;
      batch = std::move(queue_.front());
      queue_.pop_front();
    }
    const size_t promoted = store_->Prefetch(batch);
    absl::MutexLock lock(&mu_);
    pending_keys_ -= batch.size();
    promoted_ += promoted;
    ++done_batches_;
  }
}

bool Prefetcher::ReadyLocked() const { return stopping_ || !queue_.empty(); }

void Prefetcher::WaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](size_t* pending) { return *pending == 0; }, &pending_keys_));
}

uint64_t Prefetcher::promoted() const {
  absl::MutexLock lock(&mu_);
  return promoted_;
}

uint64_t Prefetcher::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

}  // namespace kvtier::daemon
