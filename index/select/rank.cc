#include "index/select/rank.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

#include "index/select/selector.h"

namespace kvtier::index {

void RankScored(const RankOptions& o, const RankInput& in, absl::Span<const int32_t> scored,
                RankScratch* s, SelectResult* out) {
  const RankShape& sh = in.shape;
  const absl::Span<const float> affinity = in.affinity;
  StabilityTracker* st = in.tracker;
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
  RankPool(o, in, /*partitioned=*/false, s, out);
}

void RankPool(const RankOptions& o, const RankInput& in, bool partitioned, RankScratch* s,
              SelectResult* out) {
  const RankShape& sh = in.shape;
  StabilityTracker* st = in.tracker;
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
    out->scores.push_back(st->ObservedThisStep(p) ? in.affinity[p] : 0.0f);
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

void RankFlat(const RankOptions& o, const RankInput& in, RankScratch* s, SelectResult* out) {
  const RankShape& sh = in.shape;
  std::vector<int32_t>& scored = s->scored;
  scored.clear();
  for (int64_t p = 0; p < sh.n; ++p) {
    if (p < sh.sinks || p >= sh.local_first) {
      in.tracker->Observe(p, in.affinity[p] > o.stability.theta);
    } else {
      scored.push_back(static_cast<int32_t>(p));
    }
  }
  RankScored(o, in, scored, s, out);
}

absl::Status SelectFlat(const RankOptions& o, const FlatStep& f, StabilityTracker* st,
                        RankScratch* s, SelectResult* out) {
  const int64_t n = static_cast<int64_t>(f.affinity.size());
  out->blocks.clear();
  out->scores.clear();
  out->prefetch.clear();
  out->candidates = out->held = 0;
  if (st->begun() && f.step < st->step()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step (", f.step, ") is before the last step begun (", st->step(), ")"));
  }
  st->Resize(n);
  if (absl::Status status = st->BeginStep(f.step); !status.ok()) return status;
  if (f.budget >= n) {
    for (int64_t p = 0; p < n; ++p) out->blocks.push_back(p);
    out->scores.assign(n, 0.0f);
    st->SetChosen(out->blocks);
    return absl::OkStatus();
  }
  RankInput in;
  in.shape.n = n;
  in.shape.sinks = std::clamp<int64_t>(f.sink_blocks, 0, n);
  const int64_t locals = std::clamp<int64_t>(f.local_blocks, 0, n - in.shape.sinks);
  in.shape.local_first = n - locals;
  in.shape.free = f.budget - in.shape.sinks - locals;
  in.affinity = f.affinity;
  in.tracker = st;
  RankFlat(o, in, s, out);
  return absl::OkStatus();
}

}  // namespace kvtier::index
