#include "index/select/worker_pool.h"

#include <algorithm>

namespace kvtier::index {

WorkerPool::WorkerPool(int32_t threads) {
  {
    absl::MutexLock lock(&mu_);
    lanes_.resize(static_cast<size_t>(std::max(threads, 0)));
  }
  for (int32_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::Drain(Job* job, int32_t slot) {
  for (int64_t i = job->next.fetch_add(1, std::memory_order_relaxed); i < job->count;
       i = job->next.fetch_add(1, std::memory_order_relaxed)) {
    (*job->fn)(slot, i);
  }
}

void WorkerPool::ParallelFor(int64_t count, int32_t max_slots, const Fn& fn, uint64_t lane) {
  if (count <= 0) return;
  if (threads_.empty() || max_slots <= 1 || count == 1) {
    for (int64_t i = 0; i < count; ++i) fn(0, i);
    return;
  }
  Job job;
  job.fn = &fn;
  job.count = count;
  job.max_slots = max_slots;
  job.lane = lane;
  {
    absl::MutexLock lock(&mu_);
    if (last_ != nullptr) {
      last_->later = &job;
    } else {
      first_ = &job;
    }
    last_ = &job;
  }
  Drain(&job, 0);
  // Every item is taken. Withdraw the job so no thread joins it late, then
  // wait for the helpers still running items of it.
  absl::MutexLock lock(&mu_);
  Unlink(&job);
  mu_.Await(absl::Condition(
      +[](Job* j) { return j->helpers == 0; }, &job));
}

void WorkerPool::Unlink(Job* job) {
  Job* before = nullptr;
  for (Job* j = first_; j != nullptr; before = j, j = j->later) {
    if (j != job) continue;
    (before != nullptr ? before->later : first_) = j->later;
    if (last_ == j) last_ = before;
    j->later = nullptr;
    return;
  }
}

int32_t WorkerPool::HelpersOf(uint64_t lane) const {
  for (const LaneLoad& l : lanes_) {
    if (l.helpers > 0 && l.lane == lane) return l.helpers;
  }
  return 0;
}

void WorkerPool::AddHelper(uint64_t lane, int32_t delta) {
  LaneLoad* free_entry = nullptr;
  for (LaneLoad& l : lanes_) {
    if (l.helpers > 0 && l.lane == lane) {
      l.helpers += delta;
      return;
    }
    if (l.helpers == 0 && free_entry == nullptr) free_entry = &l;
  }
  // A lane without helpers gains its first: at most threads() lanes have
  // any, and this thread is not counted yet, so an entry is free.
  free_entry->lane = lane;
  free_entry->helpers = delta;
}

WorkerPool::Job* WorkerPool::Pick() {
  Job* best = first_;
  int32_t best_load = HelpersOf(best->lane);
  for (Job* j = first_->later; j != nullptr && best_load > 0; j = j->later) {
    const int32_t load = HelpersOf(j->lane);
    if (load < best_load) {
      best = j;
      best_load = load;
    }
  }
  return best;
}

void WorkerPool::Loop() {
  for (;;) {
    Job* job = nullptr;
    int32_t slot = 0;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkerPool* p)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->stop_ || p->first_ != nullptr; },
          this));
      if (stop_) return;
      job = Pick();
      slot = job->slots.fetch_add(1, std::memory_order_relaxed);
      if (slot + 1 >= job->max_slots || job->next.load(std::memory_order_relaxed) >= job->count) {
        // This thread takes the job's last slot (or there is nothing left):
        // no other pool thread may join it.
        Unlink(job);
      }
      if (slot >= job->max_slots) continue;
      ++job->helpers;  // keeps the job (on its caller's stack) alive
      AddHelper(job->lane, 1);
    }
    helped_.fetch_add(1, std::memory_order_relaxed);
    Drain(job, slot);  // without mu_
    absl::MutexLock lock(&mu_);
    AddHelper(job->lane, -1);
    --job->helpers;
  }
}

}  // namespace kvtier::index
