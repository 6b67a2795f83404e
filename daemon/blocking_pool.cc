#include "daemon/blocking_pool.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <memory>
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

bool BlockingPool::SubmitIfIdle(absl::AnyInvocable<void() &&> work) {
  if (threads_.empty()) return false;
  absl::MutexLock lock(&mu_);
  // Only a thread that would otherwise sit idle takes it.
  if (stopping_ || running_ + queue_.size() >= threads_.size()) return false;
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
      ++running_;
    }
    std::move(work)();
    absl::MutexLock lock(&mu_);
    --running_;
    ++ran_;
  }
}

namespace {

// What the caller and its helpers share; helpers hold it by shared_ptr, so
// one that starts after ParallelFor returned finds next >= n and leaves.
struct ParallelState {
  explicit ParallelState(size_t n) : n(n) {}
  const size_t n;
  std::atomic<size_t> next{0};
  // Valid while an index is claimed and not finished (ParallelFor waits).
  const absl::FunctionRef<void(size_t)>* fn = nullptr;
  absl::Mutex mu;
  size_t finished ABSL_GUARDED_BY(mu) = 0;

  void RunClaimed() {
    size_t done = 0;
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      (*fn)(i);
      ++done;
    }
    if (done == 0) return;
    absl::MutexLock lock(&mu);
    finished += done;
  }
};

}  // namespace

void ParallelFor(BlockingPool* pool, size_t n, size_t parallelism,
                 absl::FunctionRef<void(size_t)> fn) {
  if (n == 0) return;
  if (parallelism <= 1 || n == 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  auto state = std::make_shared<ParallelState>(n);
  state->fn = &fn;
  const size_t helpers = std::min(parallelism, n) - 1;
  for (size_t h = 0; h < helpers; ++h) {
    if (!pool->SubmitIfIdle([state] { state->RunClaimed(); })) break;
  }
  state->RunClaimed();
  absl::MutexLock lock(&state->mu);
  auto all_done = [&state]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
    return state->finished == state->n;
  };
  state->mu.Await(absl::Condition(&all_done));
}

}  // namespace kvtier::daemon
