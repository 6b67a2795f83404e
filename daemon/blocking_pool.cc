#include "daemon/blocking_pool.h"

#include <pthread.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace kvtier::daemon {

BlockingPool::BlockingPool(size_t threads, size_t max_queued) : max_queued_(max_queued) {
  threads_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) {
    threads_.emplace_back([this, i] {
      pthread_setname_np(pthread_self(), absl::StrCat("kvtier-io-", i).c_str());
      Run();
    });
  }
}

BlockingPool::~BlockingPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

bool BlockingPool::Submit(absl::AnyInvocable<void() &&> work) {
  if (threads_.empty()) {
    std::move(work)();
    absl::MutexLock lock(&mu_);
    ++ran_;
    return true;
  }
  absl::MutexLock lock(&mu_);
  if (queue_.size() >= max_queued_) {
    ++rejected_;
    return false;
  }
  queue_.push_back(std::move(work));
  if (queue_.size() > peak_queued_) peak_queued_ = queue_.size();
  return true;
}

absl::Status BlockingPool::QueueFullStatus() const {
  return absl::ResourceExhaustedError(
      absl::StrCat("server.io_queue_limit: ", max_queued_,
                   " calls already wait for block I/O; retry later"));
}

BlockingPoolStats BlockingPool::stats() const {
  absl::MutexLock lock(&mu_);
  BlockingPoolStats s;
  s.threads = threads_.size();
  s.queued = queue_.size();
  s.peak_queued = peak_queued_;
  s.ran = ran_;
  s.rejected = rejected_;
  return s;
}

void BlockingPool::Run() {
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
  while (true) {
    absl::AnyInvocable<void() &&> work;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, and everything queued ran
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    std::move(work)();
    absl::MutexLock lock(&mu_);
    ++ran_;
  }
}

}  // namespace kvtier::daemon
