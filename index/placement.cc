#include "index/placement.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "index/kernels/simd.h"
#include "index/summary/block_layout.h"
#include "index/validate.h"

namespace kvtier::index {

absl::StatusOr<std::vector<int32_t>> RankForDemotion(const DemotionInput& in,
                                                     const DemotionWeights& weights,
                                                     std::vector<float>* priority) {
  if (in.dim < 1 || in.dim > kMaxHeadDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("dim (", in.dim, ") must be in [1, ", kMaxHeadDim, "]"));
  }
  const size_t D = static_cast<size_t>(in.dim);
  const size_t n = in.last_access.size();
  if (n == 0) {
    return absl::InvalidArgumentError("no blocks to rank (last_access empty)");
  }
  if (n > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("too many blocks to rank");
  }
  if (in.vectors.size() != n * D) {
    return absl::InvalidArgumentError(
        absl::StrCat("vectors has ", in.vectors.size(), " elements, expected ", n, " x ", D));
  }
  if (!in.stability.empty() && in.stability.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("stability has ", in.stability.size(), " entries, expected ", n));
  }
  for (size_t i = 0; i < in.stability.size(); ++i) {
    if (!(in.stability[i] >= 0.0f && in.stability[i] <= 1.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("stability[", i, "] (", in.stability[i], ") must be in [0, 1]"));
    }
  }
  if (!std::isfinite(weights.redundancy_weight) || !std::isfinite(weights.age_weight) ||
      !std::isfinite(weights.stability_weight)) {
    return absl::InvalidArgumentError("weights must be finite");
  }
  if (absl::Status s = CheckFinite("vectors", in.vectors.data(), n * D); !s.ok()) {
    return s;
  }
  std::vector<float> norms(n);
  for (size_t b = 0; b < n; ++b) {
    const float* v = in.vectors.data() + b * D;
    norms[b] = std::sqrt(simd::Dot(v, v, D));
  }
  std::vector<float> m(D, 0.0f);
  if (!in.context_mean.empty()) {
    if (absl::Status s = CheckVector("context_mean", in.context_mean, in.dim, false); !s.ok()) {
      return s;
    }
    m.assign(in.context_mean.begin(), in.context_mean.end());
  } else {
    for (size_t b = 0; b < n; ++b) {
      if (norms[b] <= 0) continue;
      const float* v = in.vectors.data() + b * D;
      for (size_t d = 0; d < D; ++d) m[d] += v[d] / norms[b];
    }
  }
  const float mn = std::sqrt(simd::Dot(m.data(), m.data(), D));

  const auto [oldest_it, newest_it] =
      std::minmax_element(in.last_access.begin(), in.last_access.end());
  const double oldest = static_cast<double>(*oldest_it);
  const double span = static_cast<double>(*newest_it) - oldest;

  std::vector<float> prio(n);
  for (size_t b = 0; b < n; ++b) {
    float cos = 0;
    if (norms[b] > 0 && mn > 0) {
      cos = simd::Dot(in.vectors.data() + b * D, m.data(), D) / (norms[b] * mn);
    }
    const float redundancy = 0.5f * (1.0f + std::clamp(cos, -1.0f, 1.0f));
    const float age =
        span > 0
            ? static_cast<float>((oldest + span - static_cast<double>(in.last_access[b])) / span)
            : 0.0f;
    const float stab = in.stability.empty() ? 0.0f : in.stability[b];
    prio[b] = weights.redundancy_weight * redundancy + weights.age_weight * age -
              weights.stability_weight * stab;
  }
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    if (prio[a] != prio[b]) return prio[a] > prio[b];
    if (in.last_access[a] != in.last_access[b]) {
      return in.last_access[a] < in.last_access[b];
    }
    return a < b;
  });
  if (priority != nullptr) *priority = std::move(prio);
  return order;
}

}  // namespace kvtier::index
