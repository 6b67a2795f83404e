#include "index/select/rank.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

#include "index/select/selector.h"

namespace kvtier::index {

void RankScored(const RankOptions& o, const RankShape& sh, absl::Span<const float> affinity,
                absl::Span<const int32_t> scored, StabilityTracker* st, RankScratch* s,
                SelectResult* out) {
  const StabilityOptions& so = o.stability;
  const float w = o.use_stability ? so.weight : 0.0f;
  const int32_t window = so.window_steps;
  s->pool.clear();
  for (int32_t p : scored) {
    st->Observe(p, affinity[p] > so.theta);
    s->pool.push_back({(1.0f - w) * affinity[p] + w * st->Stability(p, window), p});
  }
  s->held.clear();
  if (o.use_stability && so.hold_threshold <= 1.0f) {
    st->CollectHeld(so.hold_threshold, window, &s->held);
  }
  for (int64_t p : s->held) {
    if (p < sh.sinks || p >= sh.local_first) continue;
    s->pool.push_back({w * st->Stability(p, window), static_cast<int32_t>(p)});
    ++out->held;
  }
  RankPool(o, sh, affinity, /*partitioned=*/false, st, s, out);
}

void RankPool(const RankOptions& o, const RankShape& sh, absl::Span<const float> affinity,
              bool partitioned, StabilityTracker* st, RankScratch* s, SelectResult* out) {
  const int32_t window = o.stability.window_steps;
  std::vector<ScoredIndex>& pool = s->pool;
  out->candidates = static_cast<int64_t>(pool.size());
  const size_t k = static_cast<size_t>(std::clamp<int64_t>(sh.free, 0, pool.size()));
  if (!partitioned && k < pool.size()) {
    if (o.recent_ties) {
      std::nth_element(pool.begin(), pool.begin() + k, pool.end(), ByBetterRecent());
    } else {
      std::nth_element(pool.begin(), pool.begin() + k, pool.end(), ByBetter());
    }
  }
  for (int64_t p = 0; p < sh.sinks; ++p) out->blocks.push_back(p);
  for (size_t i = 0; i < k; ++i) out->blocks.push_back(pool[i].index);
  for (int64_t p = sh.local_first; p < sh.n; ++p) out->blocks.push_back(p);
  std::sort(out->blocks.begin(), out->blocks.end());
  st->SetChosen(out->blocks);
  for (int64_t p : out->blocks) {
    out->scores.push_back(st->ObservedThisStep(p) ? affinity[p] : 0.0f);
  }

  // Prefetch: rising pages that lost this step.
  s->rising.clear();
  for (size_t i = k; i < pool.size(); ++i) {
    const int32_t p = pool[i].index;
    if (st->ObservedThisStep(p) && st->Rising(p, window)) {
      s->rising.push_back({st->Stability(p, window), p});
    }
  }
  auto more_stable = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  const size_t keep = static_cast<size_t>(
      std::clamp<int64_t>(o.max_prefetch, 0, static_cast<int64_t>(s->rising.size())));
  if (keep < s->rising.size()) {
    std::nth_element(s->rising.begin(), s->rising.begin() + keep, s->rising.end(), more_stable);
  }
  std::sort(s->rising.begin(), s->rising.begin() + keep, more_stable);
  for (size_t i = 0; i < keep; ++i) out->prefetch.push_back(s->rising[i].second);
}

void RankFlat(const RankOptions& o, const RankShape& sh, absl::Span<const float> affinity,
              StabilityTracker* st, RankScratch* s, std::vector<int32_t>* scored,
              SelectResult* out) {
  scored->clear();
  for (int64_t p = 0; p < sh.n; ++p) {
    if (p < sh.sinks || p >= sh.local_first) {
      st->Observe(p, affinity[p] > o.stability.theta);
    } else {
      scored->push_back(static_cast<int32_t>(p));
    }
  }
  RankScored(o, sh, affinity, *scored, st, s, out);
}

absl::Status SelectFlat(const RankOptions& o, int64_t sink_blocks, int64_t local_blocks,
                        absl::Span<const float> affinity, int64_t budget, int64_t step,
                        StabilityTracker* st, RankScratch* s, std::vector<int32_t>* scored,
                        SelectResult* out) {
  const int64_t n = static_cast<int64_t>(affinity.size());
  out->blocks.clear();
  out->scores.clear();
  out->prefetch.clear();
  out->candidates = out->held = 0;
  if (step < st->step() && st->begun()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step (", step, ") is before the last step begun (", st->step(), ")"));
  }
  st->Resize(n);
  if (absl::Status status = st->BeginStep(step); !status.ok()) return status;
  if (budget >= n) {
    for (int64_t p = 0; p < n; ++p) out->blocks.push_back(p);
    out->scores.assign(n, 0.0f);
    st->SetChosen(out->blocks);
    return absl::OkStatus();
  }
  RankShape sh;
  sh.n = n;
  sh.sinks = std::clamp<int64_t>(sink_blocks, 0, n);
  const int64_t locals = std::clamp<int64_t>(local_blocks, 0, n - sh.sinks);
  sh.local_first = n - locals;
  sh.free = budget - sh.sinks - locals;
  RankFlat(o, sh, affinity, st, s, scored, out);
  return absl::OkStatus();
}

}  // namespace kvtier::index
