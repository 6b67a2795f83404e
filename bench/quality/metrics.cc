#include "bench/quality/metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace kvtier::quality {

ForcedBlocks ForcedBlocks::Make(int64_t num_blocks, int64_t sink_blocks, int64_t local_blocks) {
  ForcedBlocks f;
  f.num_blocks = num_blocks;
  f.sinks = std::clamp<int64_t>(sink_blocks, 0, num_blocks);
  f.locals = std::clamp<int64_t>(local_blocks, 0, num_blocks - f.sinks);
  return f;
}

std::vector<int64_t> TopBlocks(absl::Span<const double> score, const ForcedBlocks& forced,
                               int64_t budget) {
  const int64_t n = forced.num_blocks;
  std::vector<int64_t> out;
  if (budget >= n) {
    out.resize(n);
    std::iota(out.begin(), out.end(), 0);
    return out;
  }
  std::vector<int64_t> free;
  for (int64_t b = 0; b < n; ++b) {
    if (forced.Contains(b)) {
      out.push_back(b);
    } else {
      free.push_back(b);
    }
  }
  const size_t k = static_cast<size_t>(
      std::clamp<int64_t>(budget - forced.count(), 0, static_cast<int64_t>(free.size())));
  auto better = [&score](int64_t a, int64_t b) {
    return score[a] > score[b] || (score[a] == score[b] && a < b);
  };
  std::partial_sort(free.begin(), free.begin() + k, free.end(), better);
  out.insert(out.end(), free.begin(), free.begin() + k);
  std::sort(out.begin(), out.end());
  return out;
}

double SetMass(const float* mass, absl::Span<const int64_t> blocks) {
  double m = 0;
  for (int64_t b : blocks) m += mass[b];
  return m;
}

double FreeMass(const float* mass, absl::Span<const int64_t> blocks, const ForcedBlocks& forced) {
  double m = 0;
  for (int64_t b : blocks) {
    if (!forced.Contains(b)) m += mass[b];
  }
  return m;
}

double RelativeL2Error(const StepAttention& a, int32_t lh, absl::Span<const int64_t> blocks) {
  const int32_t D = a.head_dim;
  const double m = SetMass(a.Mass(lh), blocks);
  if (m <= 0) return 1.0;
  std::vector<double> o(D, 0.0);
  for (int64_t b : blocks) {
    const float* u = a.Partial(lh, b);
    for (int32_t i = 0; i < D; ++i) o[i] += u[i];
  }
  const float* full = a.Output(lh);
  double diff = 0, norm = 0;
  for (int32_t i = 0; i < D; ++i) {
    const double e = o[i] / m - full[i];
    diff += e * e;
    norm += static_cast<double>(full[i]) * full[i];
  }
  if (norm <= 0) return diff > 0 ? 1.0 : 0.0;
  return std::sqrt(diff / norm);
}

int64_t NewBlocks(absl::Span<const int64_t> prev, absl::Span<const int64_t> cur,
                  int64_t prev_num_blocks) {
  int64_t n = 0;
  size_t i = 0;
  for (int64_t b : cur) {
    if (b >= prev_num_blocks) continue;
    while (i < prev.size() && prev[i] < b) ++i;
    if (i >= prev.size() || prev[i] != b) ++n;
  }
  return n;
}

MetricAccumulator::MetricAccumulator(int32_t num_heads, int32_t group_size)
    : num_heads_(num_heads),
      group_size_(std::max(group_size, 1)),
      mass_s_(num_heads, 0.0),
      mass_sf_(num_heads, 0.0),
      mass_o_(num_heads, 0.0),
      mass_of_(num_heads, 0.0),
      l2_(num_heads, 0.0) {}

void MetricAccumulator::AddHead(const StepAttention& a, int32_t lh, const ForcedBlocks& forced,
                                absl::Span<const int64_t> chosen, absl::Span<const int64_t> oracle,
                                double* err) {
  const float* m = a.Mass(lh);
  mass_s_[lh] += SetMass(m, chosen);
  mass_sf_[lh] += FreeMass(m, chosen, forced);
  mass_o_[lh] += SetMass(m, oracle);
  mass_of_[lh] += FreeMass(m, oracle, forced);
  *err = RelativeL2Error(a, lh, chosen);
  l2_[lh] += *err;
}

void MetricAccumulator::AddStep(const StepAttention& a, const ForcedBlocks& forced,
                                absl::Span<const int64_t> chosen, absl::Span<const int64_t> oracle,
                                int64_t new_blocks, double latency_us) {
  double group_worst = 0;
  for (int32_t lh = 0; lh < num_heads_; ++lh) {
    double err;
    AddHead(a, lh, forced, chosen, oracle, &err);
    group_worst = std::max(group_worst, err);
    if ((lh + 1) % group_size_ == 0) {
      gqa_worst_sum_ += group_worst;
      group_worst = 0;
    }
  }
  // Overlap on the free part of the oracle.
  int64_t free_oracle = 0, hit = 0;
  size_t i = 0;
  for (int64_t b : oracle) {
    if (forced.Contains(b)) continue;
    ++free_oracle;
    while (i < chosen.size() && chosen[i] < b) ++i;
    if (i < chosen.size() && chosen[i] == b) ++hit;
  }
  if (free_oracle > 0) {
    overlap_sum_ += static_cast<double>(hit) / free_oracle;
    ++overlap_steps_;
  }
  churn_sum_ += new_blocks;
  latency_sum_us_ += latency_us;
  budget_sum_ += chosen.size();
  ++steps_;
}

void MetricAccumulator::AddPerHeadStep(const StepAttention& a, const ForcedBlocks& forced,
                                       const std::vector<std::vector<int64_t>>& per_head,
                                       absl::Span<const int64_t> oracle) {
  double group_worst = 0;
  double budget = 0;
  for (int32_t lh = 0; lh < num_heads_; ++lh) {
    double err;
    AddHead(a, lh, forced, per_head[lh], oracle, &err);
    budget += per_head[lh].size();
    group_worst = std::max(group_worst, err);
    if ((lh + 1) % group_size_ == 0) {
      gqa_worst_sum_ += group_worst;
      group_worst = 0;
    }
  }
  budget_sum_ += budget / num_heads_;
  ++steps_;
}

absl::Status MetricAccumulator::Merge(const MetricAccumulator& o) {
  if (o.num_heads_ != num_heads_ || o.group_size_ != group_size_) {
    return absl::InvalidArgumentError(absl::StrCat("cannot merge metrics of ", o.num_heads_,
                                                   " heads (group ", o.group_size_, ") into ",
                                                   num_heads_, " heads (group ", group_size_, ")"));
  }
  for (int32_t lh = 0; lh < num_heads_; ++lh) {
    mass_s_[lh] += o.mass_s_[lh];
    mass_sf_[lh] += o.mass_sf_[lh];
    mass_o_[lh] += o.mass_o_[lh];
    mass_of_[lh] += o.mass_of_[lh];
    l2_[lh] += o.l2_[lh];
  }
  steps_ += o.steps_;
  gqa_worst_sum_ += o.gqa_worst_sum_;
  overlap_sum_ += o.overlap_sum_;
  overlap_steps_ += o.overlap_steps_;
  churn_sum_ += o.churn_sum_;
  latency_sum_us_ += o.latency_sum_us_;
  budget_sum_ += o.budget_sum_;
  return absl::OkStatus();
}

MetricSummary MetricAccumulator::Summarise(int64_t block_bytes) const {
  MetricSummary s;
  s.steps = steps_;
  if (steps_ == 0) return s;
  const double steps = static_cast<double>(steps_);
  auto sum = [](const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); };
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 1.0; };
  const double heads = static_cast<double>(num_heads_);
  s.budget_blocks = budget_sum_ / steps;
  s.recall = sum(mass_s_) / (steps * heads);
  s.recall_free = sum(mass_sf_) / (steps * heads);
  s.oracle_ratio = ratio(sum(mass_s_), sum(mass_o_));
  s.share = ratio(sum(mass_sf_), sum(mass_of_));
  s.rel_l2 = sum(l2_) / (steps * heads);
  s.recall_worst = s.recall_free_worst = s.oracle_ratio_worst = s.share_worst = 1e300;
  s.rel_l2_worst = 0;
  for (int32_t lh = 0; lh < num_heads_; ++lh) {
    s.recall_worst = std::min(s.recall_worst, mass_s_[lh] / steps);
    s.recall_free_worst = std::min(s.recall_free_worst, mass_sf_[lh] / steps);
    s.oracle_ratio_worst = std::min(s.oracle_ratio_worst, ratio(mass_s_[lh], mass_o_[lh]));
    s.share_worst = std::min(s.share_worst, ratio(mass_sf_[lh], mass_of_[lh]));
    s.rel_l2_worst = std::max(s.rel_l2_worst, l2_[lh] / steps);
  }
  s.rel_l2_gqa_worst = gqa_worst_sum_ / (steps * heads / group_size_);
  s.overlap = overlap_steps_ > 0 ? overlap_sum_ / overlap_steps_ : 1.0;
  s.churn_blocks = churn_sum_ / steps;
  s.bytes_per_step = s.churn_blocks * static_cast<double>(block_bytes);
  s.latency_us = latency_sum_us_ / steps;
  return s;
}

}  // namespace kvtier::quality
