#include "daemon/blocking_pool.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvtier::daemon {

BlockingPool::BlockingPool(const BlockingPoolOptions& options)
    : options_([&] {
        BlockingPoolOptions o = options;
        if (o.max_queued_per_tenant == 0 || o.max_queued_per_tenant > o.max_queued) {
          o.max_queued_per_tenant = o.max_queued;
        }
        if (o.max_running_per_tenant == 0 || o.max_running_per_tenant > o.threads) {
          o.max_running_per_tenant = o.threads;
        }
        return o;
      }()) {
  threads_.reserve(options_.threads);
  for (size_t i = 0; i < options_.threads; ++i) {
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

bool BlockingPool::Submit(const std::string& tenant, absl::AnyInvocable<void() &&> work,
                          uint64_t cost) {
  if (threads_.empty()) {
    std::move(work)();
    absl::MutexLock lock(&mu_);
    ++counts_.ran;
    return true;
  }
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Lane>& lane = lanes_[tenant];
  if (lane == nullptr) lane = std::make_unique<Lane>();
  if (counts_.queued >= options_.max_queued ||
      lane->items.size() >= options_.max_queued_per_tenant) {
    ++counts_.rejected;
    if (lane->items.empty() && lane->running == 0) lanes_.erase(tenant);
    return false;
  }
  // Bounded, so that one huge item costs a bounded number of turns.
  cost = std::clamp<uint64_t>(cost, 1, 64 * kQuantum);
  lane->items.push_back(Item{std::move(work), cost});
  if (!lane->active) {
    lane->active = true;
    active_.emplace_back(tenant, lane.get());
  }
  ++counts_.queued;
  if (counts_.queued > counts_.peak_queued) counts_.peak_queued = counts_.queued;
  return true;
}

bool BlockingPool::SubmitIfIdle(const std::string& tenant, absl::AnyInvocable<void() &&> work) {
  if (threads_.empty()) return false;
  absl::MutexLock lock(&mu_);
  // Only a thread that would otherwise sit idle takes it, and only within
  // the tenant's running cap.
  if (stopping_ || running_ + counts_.queued + helpers_.size() >= threads_.size()) return false;
  auto it = lanes_.find(tenant);
  const size_t mine = it == lanes_.end() ? 0 : it->second->running;
  size_t waiting_mine = 0;
  for (const auto& h : helpers_) waiting_mine += h.first == tenant ? 1 : 0;
  if (mine + waiting_mine >= options_.max_running_per_tenant) return false;
  helpers_.emplace_back(tenant, Item{std::move(work), 0});
  return true;
}

absl::Status BlockingPool::QueueFullStatus(const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = lanes_.find(tenant);
  if (it != lanes_.end() && it->second->items.size() >= options_.max_queued_per_tenant &&
      options_.max_queued_per_tenant < options_.max_queued) {
    return absl::ResourceExhaustedError(absl::StrCat(
        options_.queue_limit_per_tenant_key, ": ", options_.max_queued_per_tenant,
        " calls of this tenant already wait for ", options_.waits_for, "; retry later"));
  }
  return absl::ResourceExhaustedError(absl::StrCat(options_.queue_limit_key, ": ",
                                                   options_.max_queued, " calls already wait for ",
                                                   options_.waits_for, "; retry later"));
}

BlockingPoolStats BlockingPool::stats() const {
  absl::MutexLock lock(&mu_);
  BlockingPoolStats s = counts_;
  s.threads = threads_.size();
  return s;
}

bool BlockingPool::RunnableLocked() const {
  mu_.AssertHeld();
  if (!helpers_.empty()) return true;
  for (const auto& [tenant, lane] : active_) {
    if (stopping_ || lane->running < options_.max_running_per_tenant) return true;
  }
  return false;
}

bool BlockingPool::PickLocked(Item* item, Lane** picked, std::string* picked_tenant) {
  mu_.AssertHeld();
  bool eligible = false;  // else the rotation below would not end
  for (const auto& [tenant, lane] : active_) {
    eligible = eligible || stopping_ || lane->running < options_.max_running_per_tenant;
  }
  if (!eligible) return false;
  for (;;) {
    auto& [tenant, lane] = active_.front();
    const bool capped = !stopping_ && lane->running >= options_.max_running_per_tenant;
    if (capped || lane->deficit < lane->items.front().cost) {
      if (!capped) lane->deficit += kQuantum;
      active_.push_back(active_.front());
      active_.pop_front();
      continue;
    }
    lane->deficit -= lane->items.front().cost;
    *item = std::move(lane->items.front());
    lane->items.pop_front();
    --counts_.queued;
    *picked = lane;
    *picked_tenant = tenant;
    if (lane->items.empty()) {  // an idle lane keeps no credit
      lane->deficit = 0;
      lane->active = false;
      active_.pop_front();  // `tenant` and `lane` are not used past here
    }
    return true;
  }
}

void BlockingPool::DoneLocked(const std::string& tenant, Lane* lane) {
  mu_.AssertHeld();
  --running_;
  ++counts_.ran;
  if (--lane->running == 0 && !lane->active && lane->items.empty()) lanes_.erase(tenant);
}

void BlockingPool::Run() {
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return (stopping_ && counts_.queued == 0 && helpers_.empty()) || RunnableLocked();
  };
  while (true) {
    Item item;
    Lane* lane = nullptr;
    std::string tenant;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&ready));
      if (!helpers_.empty()) {
        tenant = std::move(helpers_.front().first);
        item = std::move(helpers_.front().second);
        helpers_.pop_front();
        std::unique_ptr<Lane>& l = lanes_[tenant];
        if (l == nullptr) l = std::make_unique<Lane>();
        lane = l.get();
      } else if (!PickLocked(&item, &lane, &tenant)) {
        return;  // stopping, and everything queued ran
      }
      ++lane->running;
      ++running_;
    }
    std::move(item.work)();
    absl::MutexLock lock(&mu_);
    DoneLocked(tenant, lane);
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
                 absl::FunctionRef<void(size_t)> fn, const std::string& tenant) {
  if (n == 0) return;
  if (parallelism <= 1 || n == 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  auto state = std::make_shared<ParallelState>(n);
  state->fn = &fn;
  const size_t helpers = std::min(parallelism, n) - 1;
  for (size_t h = 0; h < helpers; ++h) {
    if (!pool->SubmitIfIdle(tenant, [state] { state->RunClaimed(); })) break;
  }
  state->RunClaimed();
  absl::MutexLock lock(&state->mu);
  auto all_done = [&state]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
    return state->finished == state->n;
  };
  state->mu.Await(absl::Condition(&all_done));
}

}  // namespace kvtier::daemon
