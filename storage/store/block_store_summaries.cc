// BlockStoreImpl deferred summaries (BlockStoreOptions::defer_summaries): a
// non-durable put of a new block is acknowledged with its summary still to
// compute; the summary thread computes it from the host copy, which stays
// in place meanwhile (the entry is busy). Whoever needs the summary first
// (GetSummaries, PersistLocked) gets it at once through
// EnsureSummaryLocked. The rest of the implementation is in
// block_store_impl.cc.
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "storage/common/mutex_unlock.h"
#include "storage/store/block_store_impl.h"
#include "storage/store/store_internal.h"

namespace kvtier {

using store_internal::Describe;

void BlockStoreImpl::SetSummaryLocked(Entry* e, std::string summary) {
  mu_.AssertHeld();
  if (summary.size() > kMaxSummaryBytes) {
    LogLocked(absl::StrCat("summary of ", Describe(e->key), ": ", summary.size(),
                           " bytes exceed kMaxSummaryBytes; kept without one"));
    summary.clear();
  }
  summary_bytes_ -= e->summary.capacity();
  e->summary = std::move(summary);
  e->summary.shrink_to_fit();
  summary_bytes_ += e->summary.capacity();
  e->summary_state = Entry::SummaryState::kNone;
  --deferred_summaries_;
  deferred_summary_bytes_ -= e->size_bytes;
  --e->busy;  // taken when the put deferred it
  idle_cv_.SignalAll();
}

void BlockStoreImpl::ComputeSummaryLocked(Entry* e) {
  mu_.AssertHeld();
  e->summary_state = Entry::SummaryState::kComputing;
  ++e->busy;  // ours while unlocked
  const BlockKey key = e->key;
  std::optional<HostSlot> host = e->quarantined ? std::nullopt : e->host;
  const ModelProfile profile = *ProfileOfLocked(key.tenant, key.profile_id);
  absl::StatusOr<std::string> summary =
      absl::FailedPreconditionError("no intact host copy to summarise");
  if (host) {
    auto data = host_->Data(*host);
    MutexUnlock unlocked(&mu_);
    if (data.ok()) {
      summary = options_.summarize(
          profile,
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(data->data()), data->size()));
    } else {
      summary = data.status();
    }
  }
  --e->busy;
  if (!summary.ok()) {
    LogLocked(absl::StrCat("summary of ", Describe(key), ": ", summary.status().message(),
                           "; kept without one (it cannot join a context)"));
  }
  SetSummaryLocked(e, summary.ok() ? std::move(*summary) : std::string());
}

void BlockStoreImpl::EnsureSummaryLocked(Entry* e) {
  mu_.AssertHeld();
  using State = Entry::SummaryState;
  if (e->summary_state == State::kQueued) {
    ComputeSummaryLocked(e);  // the thread will find it done
  } else if (e->summary_state == State::kComputing) {
    // Someone is on it. Busy meanwhile, so that nothing frees e.
    ++e->busy;
    mu_.Await(absl::Condition(
        +[](Entry* x) { return x->summary_state == State::kNone; }, e));
    --e->busy;
    idle_cv_.SignalAll();
  }
}

void BlockStoreImpl::SummaryLoop() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    mu_.Await(absl::Condition(
        +[](BlockStoreImpl* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return s->summary_stop_ || !s->summary_queue_.empty();
        },
        this));
    if (summary_queue_.empty()) return;  // stopping, and nothing left
    const BlockKey key = std::move(summary_queue_.front());
    summary_queue_.pop_front();
    auto it = entries_.find(key);
    // Busy since its put: still there, unless someone already took it.
    if (it == entries_.end() || it->second->summary_state != Entry::SummaryState::kQueued) {
      continue;
    }
    ComputeSummaryLocked(it->second.get());
  }
}

void BlockStoreImpl::StopSummaryThread() {
  if (!summary_thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    summary_stop_ = true;
  }
  summary_thread_.join();  // after the queue is empty
}

}  // namespace kvtier
