#include "index/summary/summary.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "index/summary/summary_builder.h"

namespace kvtier::index {

float QuantizeInt8(const float* v, size_t n, int8_t* q) {
  float m = 0.0f;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(v[i]));
  if (!(m > 0)) {
    std::fill(q, q + n, int8_t{0});
    return 0.0f;
  }
  // In double: 127 / m overflows float for m below 127 / FLT_MAX (tiny
  // keys), and 0 * inf would be NaN.
  const double inv = 127.0 / static_cast<double>(m);
  for (size_t i = 0; i < n; ++i) {
    const double x = std::nearbyint(static_cast<double>(v[i]) * inv);
    q[i] = static_cast<int8_t>(std::clamp(x, -127.0, 127.0));
  }
  return static_cast<float>(static_cast<double>(m) / 127.0);
}

absl::StatusOr<BlockSummary> ComputeBlockSummary(const BlockLayout& layout,
                                                 absl::string_view payload,
                                                 const SummaryOptions& options,
                                                 HeadStats* head_stats) {
  // The layout, then the payload's size, then the options (the order the
  // errors have always come in).
  if (absl::Status s = ValidateLayout(layout); !s.ok()) return s;
  if (static_cast<int64_t>(payload.size()) != PayloadSizeBytes(layout)) {
    return absl::InvalidArgumentError(absl::StrCat("payload size (", payload.size(),
                                                   " bytes) does not match the layout (",
                                                   PayloadSizeBytes(layout), " bytes)"));
  }
  absl::StatusOr<BlockSummaryBuilder> builder =
      BlockSummaryBuilder::Create(layout, options, head_stats);
  if (!builder.ok()) return builder.status();
  return builder->Finish(payload);
}

HeadVarianceTracker::HeadVarianceTracker(int32_t num_layers, int32_t num_kv_heads,
                                         int32_t head_dim) {
  const size_t heads = static_cast<size_t>(std::max(num_layers, 0)) * std::max(num_kv_heads, 0);
  stats_.num_layers = num_layers;
  stats_.num_kv_heads = num_kv_heads;
  stats_.head_dim = head_dim;
  stats_.count.assign(heads, 0);
  stats_.mean.assign(heads * std::max(head_dim, 0), 0.0);
  stats_.m2.assign(heads, 0.0);
}

absl::Status HeadVarianceTracker::Merge(const HeadStats& in) {
  const size_t heads = stats_.count.size();
  const size_t D = static_cast<size_t>(stats_.head_dim);
  if (in.num_layers != stats_.num_layers || in.num_kv_heads != stats_.num_kv_heads ||
      in.head_dim != stats_.head_dim || in.count.size() != heads || in.mean.size() != heads * D ||
      in.m2.size() != heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_stats shape (", in.num_layers, " layers x ", in.num_kv_heads,
                     " heads x ", in.head_dim, " dims) does not match the tracker (",
                     stats_.num_layers, " x ", stats_.num_kv_heads, " x ", stats_.head_dim, ")"));
  }
  for (size_t i = 0; i < heads; ++i) {
    if (in.count[i] < 0 || !std::isfinite(in.m2[i]) || in.m2[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("head_stats entry ", i, " is invalid"));
    }
  }
  for (size_t i = 0; i < heads; ++i) {
    const int64_t nb = in.count[i];
    if (nb == 0) continue;
    const int64_t na = stats_.count[i];
    const double n = static_cast<double>(na + nb);
    double* ma = &stats_.mean[i * D];
    const double* mb = &in.mean[i * D];
    double delta2 = 0;
    for (size_t d = 0; d < D; ++d) {
      const double delta = mb[d] - ma[d];
      delta2 += delta * delta;
      ma[d] += delta * (static_cast<double>(nb) / n);
    }
    stats_.m2[i] += in.m2[i] + delta2 * (static_cast<double>(na) * nb / n);
    stats_.count[i] = na + nb;
  }
  return absl::OkStatus();
}

double HeadVarianceTracker::Variance(int32_t layer, int32_t head) const {
  const size_t i = static_cast<size_t>(layer) * stats_.num_kv_heads + head;
  if (i >= stats_.count.size() || stats_.count[i] == 0) return 0.0;
  return stats_.m2[i] / (static_cast<double>(stats_.count[i]) * stats_.head_dim);
}

int64_t HeadVarianceTracker::Count(int32_t layer, int32_t head) const {
  const size_t i = static_cast<size_t>(layer) * stats_.num_kv_heads + head;
  return i < stats_.count.size() ? stats_.count[i] : 0;
}

HeadWeights HeadVarianceTracker::ComputeWeights() {
  HeadWeights w;
  w.version = ++version_;
  w.num_layers = stats_.num_layers;
  w.num_kv_heads = stats_.num_kv_heads;
  const size_t heads = stats_.count.size();
  std::vector<double> var(heads);
  double total = 0;
  for (int32_t l = 0; l < stats_.num_layers; ++l) {
    for (int32_t h = 0; h < stats_.num_kv_heads; ++h) {
      const size_t i = static_cast<size_t>(l) * stats_.num_kv_heads + h;
      var[i] = Variance(l, h);
      total += var[i];
    }
  }
  w.weights.resize(heads, 1.0f);
  if (total > 0 && heads > 0) {
    const double mean = total / static_cast<double>(heads);
    for (size_t i = 0; i < heads; ++i) {
      w.weights[i] = static_cast<float>(var[i] / mean);
    }
  }
  return w;
}

absl::StatusOr<std::vector<float>> WeightedAnchor(const std::vector<float>& per_head_anchor,
                                                  int32_t head_dim, const HeadWeights& weights) {
  const size_t heads =
      static_cast<size_t>(weights.num_layers) * static_cast<size_t>(weights.num_kv_heads);
  if (head_dim < 1 || weights.weights.size() != heads || heads == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights shape (", weights.num_layers, " x ", weights.num_kv_heads, ", ",
                     weights.weights.size(), " weights) or head_dim (", head_dim, ") is invalid"));
  }
  const size_t D = static_cast<size_t>(head_dim);
  if (per_head_anchor.size() != heads * D) {
    return absl::InvalidArgumentError(absl::StrCat("per_head_anchor has ", per_head_anchor.size(),
                                                   " elements, expected ", heads * D,
                                                   " (layers x kv_heads x head_dim)"));
  }
  std::vector<double> acc(D, 0.0);
  double total = 0;
  for (size_t i = 0; i < heads; ++i) {
    const double w = weights.weights[i];
    if (!std::isfinite(w) || w < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights.weights[", i, "] must be finite and >= 0"));
    }
    total += w;
    for (size_t d = 0; d < D; ++d) {
      const float a = per_head_anchor[i * D + d];
      if (!std::isfinite(a)) {
        return absl::InvalidArgumentError(
            absl::StrCat("per_head_anchor[", i * D + d, "] is not finite"));
      }
      acc[d] += w * a;
    }
  }
  if (total <= 0) return absl::InvalidArgumentError("weights sum to 0");
  std::vector<float> out(D);
  for (size_t d = 0; d < D; ++d) out[d] = static_cast<float>(acc[d] / total);
  return out;
}

}  // namespace kvtier::index
