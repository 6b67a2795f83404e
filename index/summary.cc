#include "index/summary.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "index/simd.h"

namespace kvtier::index {
namespace {

// Converts `n` elements of `dtype` starting at `src` to floats.
void ToFloat(Dtype dtype, const char* src, float* dst, size_t n) {
  switch (dtype) {
    case Dtype::kFp16:
      simd::HalfToFloatN(src, dst, n);
      return;
    case Dtype::kBf16:
      simd::BfloatToFloatN(src, dst, n);
      return;
    case Dtype::kFp32:
      std::copy_n(reinterpret_cast<const char*>(src), n * sizeof(float),
                  reinterpret_cast<char*>(dst));
      return;
  }
}

absl::Status CheckWeights(const BlockLayout& layout, const HeadWeights& w) {
  if (w.num_layers != layout.num_layers || w.num_kv_heads != layout.num_kv_heads ||
      w.weights.size() != static_cast<size_t>(layout.num_layers) * layout.num_kv_heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_weights shape (", w.num_layers, " layers x ", w.num_kv_heads, " heads, ",
                     w.weights.size(), " weights) does not match the layout (", layout.num_layers,
                     " x ", layout.num_kv_heads, ")"));
  }
  double total = 0;
  for (size_t i = 0; i < w.weights.size(); ++i) {
    if (!std::isfinite(w.weights[i]) || w.weights[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("head_weights.weights[", i, "] (",
                                                     w.weights[i], ") must be finite and >= 0"));
    }
    total += w.weights[i];
  }
  if (total <= 0) {
    return absl::InvalidArgumentError("head_weights.weights sum to 0");
  }
  return absl::OkStatus();
}

absl::Status CheckKeyHeads(const BlockLayout& layout, const std::vector<int32_t>& heads) {
  const int64_t total = int64_t{layout.num_layers} * layout.num_kv_heads;
  for (size_t i = 0; i < heads.size(); ++i) {
    if (heads[i] < 0 || heads[i] >= total || (i > 0 && heads[i] <= heads[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat("options.key_heads[", i, "] (", heads[i],
                                                     ") must be ascending, distinct and in [0, ",
                                                     total, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

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
  if (absl::Status s = ValidateLayout(layout); !s.ok()) return s;
  if (static_cast<int64_t>(payload.size()) != PayloadSizeBytes(layout)) {
    return absl::InvalidArgumentError(absl::StrCat("payload size (", payload.size(),
                                                   " bytes) does not match the layout (",
                                                   PayloadSizeBytes(layout), " bytes)"));
  }
  if (options.per_layer_bounds && !options.per_layer) {
    return absl::InvalidArgumentError("options.per_layer_bounds requires options.per_layer");
  }
  if (options.head_weights != nullptr) {
    if (absl::Status s = CheckWeights(layout, *options.head_weights); !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = CheckKeyHeads(layout, options.key_heads); !s.ok()) {
    return s;
  }
  const int32_t L = layout.num_layers;
  const int32_t H = layout.num_kv_heads;
  const int32_t T = layout.block_size_tokens;
  const size_t D = static_cast<size_t>(layout.head_dim);
  const size_t head_elems = static_cast<size_t>(T) * D;
  const size_t elem_bytes = static_cast<size_t>(DtypeSizeBytes(layout.dtype));

  BlockSummary out;
  out.dim = layout.head_dim;
  if (head_stats != nullptr) {
    head_stats->num_layers = L;
    head_stats->num_kv_heads = H;
    head_stats->head_dim = layout.head_dim;
    head_stats->count.assign(static_cast<size_t>(L) * H, T);
    head_stats->mean.assign(static_cast<size_t>(L) * H * D, 0.0);
    head_stats->m2.assign(static_cast<size_t>(L) * H, 0.0);
  }
  if (options.bounds) {
    out.min.assign(D, std::numeric_limits<float>::infinity());
    out.max.assign(D, -std::numeric_limits<float>::infinity());
  }
  if (options.per_layer) {
    out.num_layers = L;
    out.layer_mean.assign(static_cast<size_t>(L) * D, 0.0f);
  }
  if (options.per_layer_bounds) {
    out.layer_min.assign(static_cast<size_t>(L) * D, std::numeric_limits<float>::infinity());
    out.layer_max.assign(static_cast<size_t>(L) * D, -std::numeric_limits<float>::infinity());
  }

  if (!options.key_heads.empty()) {
    out.key_heads = options.key_heads;
    out.key_tokens = T;
    out.head_keys.assign(options.key_heads.size() * head_elems, 0);
    out.key_scales.assign(options.key_heads.size(), 0.0f);
  }
  std::vector<float> keys(head_elems);
  std::vector<float> head_sum(D), head_meanf(D), dev_sq(D);
  std::vector<double> block_sum(D, 0.0), layer_sum(D), weighted_sum(D, 0.0);
  double weight_total = 0;
  auto head_keys = [&](int32_t l, int32_t h) {
    const size_t first = ((static_cast<size_t>(l) * 2) * H + static_cast<size_t>(h)) * head_elems;
    ToFloat(layout.dtype, payload.data() + first * elem_bytes, keys.data(), head_elems);
  };

  for (int32_t l = 0; l < L; ++l) {
    std::fill(layer_sum.begin(), layer_sum.end(), 0.0);
    float* lmin = options.per_layer_bounds ? &out.layer_min[l * D] : nullptr;
    float* lmax = options.per_layer_bounds ? &out.layer_max[l * D] : nullptr;
    for (int32_t h = 0; h < H; ++h) {
      head_keys(l, h);
      std::fill(head_sum.begin(), head_sum.end(), 0.0f);
      simd::AccumulateRows(keys.data(), static_cast<size_t>(T), D, head_sum.data(),
                           options.bounds ? out.min.data() : nullptr,
                           options.bounds ? out.max.data() : nullptr);
      if (lmin != nullptr) {
        // Only the bounds: the sum goes to a scratch row.
        std::fill(dev_sq.begin(), dev_sq.end(), 0.0f);
        simd::AccumulateRows(keys.data(), static_cast<size_t>(T), D, dev_sq.data(), lmin, lmax);
      }
      // NaN and Inf propagate into the sum (min/max would hide NaN).
      for (size_t d = 0; d < D; ++d) {
        if (!std::isfinite(head_sum[d])) {
          return absl::InvalidArgumentError(absl::StrCat("payload keys of layer ", l, " head ", h,
                                                         " are not finite (dim ", d, ")"));
        }
      }
      const size_t lh = static_cast<size_t>(l) * H + h;
      const auto slot = std::lower_bound(options.key_heads.begin(), options.key_heads.end(),
                                         static_cast<int32_t>(lh));
      if (slot != options.key_heads.end() && *slot == static_cast<int32_t>(lh)) {
        const size_t j = static_cast<size_t>(slot - options.key_heads.begin());
        out.key_scales[j] = QuantizeInt8(keys.data(), head_elems, &out.head_keys[j * head_elems]);
      }
      const double w = options.head_weights ? options.head_weights->weights[lh] : 0.0;
      weight_total += w;
      for (size_t d = 0; d < D; ++d) {
        block_sum[d] += head_sum[d];
        layer_sum[d] += head_sum[d];
        weighted_sum[d] += w * (static_cast<double>(head_sum[d]) / T);
      }
      if (head_stats != nullptr) {
        // Squared deviations from the head's mean, per dimension in float
        // over the block's tokens (deviations, not raw squares, so large
        // per-dimension offsets cannot cancel), then summed in double. The
        // inner loop runs along the dimension and vectorises.
        double* hmean = &head_stats->mean[lh * D];
        for (size_t d = 0; d < D; ++d) {
          hmean[d] = double{head_sum[d]} / T;
          head_meanf[d] = static_cast<float>(hmean[d]);
          dev_sq[d] = 0.0f;
        }
        simd::AccumulateSquaredDeviations(keys.data(), static_cast<size_t>(T), D, head_meanf.data(),
                                          dev_sq.data());
        double m2 = 0;
        for (size_t d = 0; d < D; ++d) m2 += dev_sq[d];
        head_stats->m2[lh] = m2;
      }
    }
    if (options.per_layer) {
      const double n = static_cast<double>(H) * T;
      for (size_t d = 0; d < D; ++d) {
        out.layer_mean[l * D + d] = static_cast<float>(layer_sum[d] / n);
      }
    }
  }

  const double total_keys = static_cast<double>(L) * H * T;
  out.mean.resize(D);
  for (size_t d = 0; d < D; ++d) {
    out.mean[d] = static_cast<float>(block_sum[d] / total_keys);
  }
  if (options.head_weights != nullptr) {
    out.weights_version = options.head_weights->version;
    out.weighted_mean.resize(D);
    for (size_t d = 0; d < D; ++d) {
      out.weighted_mean[d] = static_cast<float>(weighted_sum[d] / weight_total);
    }
  }
  if (options.bounds) {
    // Second pass: the radius needs the final mean.
    float r2 = 0;
    for (int32_t l = 0; l < L; ++l) {
      for (int32_t h = 0; h < H; ++h) {
        head_keys(l, h);
        r2 = std::max(
            r2, simd::MaxSquaredDistance(keys.data(), static_cast<size_t>(T), D, out.mean.data()));
      }
    }
    out.radius = std::sqrt(r2);
  }
  return out;
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
