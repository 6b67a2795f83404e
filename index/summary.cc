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

// ComputeBlockSummary's argument checks: the layout, the payload's size,
// the options' consistency, the head weights' shape and the key heads.
absl::Status CheckSummaryInputs(const BlockLayout& layout, absl::string_view payload,
                                const SummaryOptions& options) {
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
  return CheckKeyHeads(layout, options.key_heads);
}

// One block's summarising pass: its shape, its payload, and the scratch
// rows reused for every (layer, head), allocated once per block here.
struct SummaryPass {
  SummaryPass(const BlockLayout& layout, absl::string_view payload)
      : layout(layout),
        payload(payload),
        L(layout.num_layers),
        H(layout.num_kv_heads),
        T(layout.block_size_tokens),
        D(static_cast<size_t>(layout.head_dim)),
        head_elems(static_cast<size_t>(T) * D),
        elem_bytes(static_cast<size_t>(DtypeSizeBytes(layout.dtype))),
        keys(head_elems),
        head_sum(D),
        head_meanf(D),
        dev_sq(D),
        block_sum(D, 0.0),
        layer_sum(D),
        weighted_sum(D, 0.0) {}

  // Converts the keys of (layer l, head h) to floats in `keys`.
  void LoadHeadKeys(int32_t l, int32_t h) {
    const size_t first = ((static_cast<size_t>(l) * 2) * H + static_cast<size_t>(h)) * head_elems;
    ToFloat(layout.dtype, payload.data() + first * elem_bytes, keys.data(), head_elems);
  }

  const BlockLayout& layout;
  const absl::string_view payload;
  const int32_t L, H, T;
  const size_t D, head_elems, elem_bytes;
  std::vector<float> keys;  // [T][D] of the current head
  std::vector<float> head_sum, head_meanf, dev_sq;
  std::vector<double> block_sum, layer_sum, weighted_sum;
  double weight_total = 0;
};

// Sizes out's optional fields (and resets *head_stats when not null) for
// the options, filled with the identities of their reductions.
void PrepareSummary(const SummaryPass& p, const SummaryOptions& options, BlockSummary* out,
                    HeadStats* head_stats) {
  const int32_t L = p.L, H = p.H, T = p.T;
  const size_t D = p.D;
  out->dim = p.layout.head_dim;
  if (head_stats != nullptr) {
    head_stats->num_layers = L;
    head_stats->num_kv_heads = H;
    head_stats->head_dim = p.layout.head_dim;
    head_stats->count.assign(static_cast<size_t>(L) * H, T);
    head_stats->mean.assign(static_cast<size_t>(L) * H * D, 0.0);
    head_stats->m2.assign(static_cast<size_t>(L) * H, 0.0);
  }
  if (options.bounds) {
    out->min.assign(D, std::numeric_limits<float>::infinity());
    out->max.assign(D, -std::numeric_limits<float>::infinity());
  }
  if (options.per_layer) {
    out->num_layers = L;
    out->layer_mean.assign(static_cast<size_t>(L) * D, 0.0f);
  }
  if (options.per_layer_bounds) {
    out->layer_min.assign(static_cast<size_t>(L) * D, std::numeric_limits<float>::infinity());
    out->layer_max.assign(static_cast<size_t>(L) * D, -std::numeric_limits<float>::infinity());
  }
  if (!options.key_heads.empty()) {
    out->key_heads = options.key_heads;
    out->key_tokens = T;
    out->head_keys.assign(options.key_heads.size() * p.head_elems, 0);
    out->key_scales.assign(options.key_heads.size(), 0.0f);
  }
}

// Head lh's statistics from its keys in p.keys and its sums in p.head_sum:
// squared deviations from the head's mean, per dimension in float over the
// block's tokens (deviations, not raw squares, so large per-dimension
// offsets cannot cancel), then summed in double. The inner loop runs along
// the dimension and vectorises.
void RecordHeadStats(SummaryPass& p, size_t lh, HeadStats* head_stats) {
  const size_t D = p.D;
  double* hmean = &head_stats->mean[lh * D];
  for (size_t d = 0; d < D; ++d) {
    hmean[d] = double{p.head_sum[d]} / p.T;
    p.head_meanf[d] = static_cast<float>(hmean[d]);
    p.dev_sq[d] = 0.0f;
  }
  simd::AccumulateSquaredDeviations(p.keys.data(), static_cast<size_t>(p.T), D, p.head_meanf.data(),
                                    p.dev_sq.data());
  double m2 = 0;
  for (size_t d = 0; d < D; ++d) m2 += p.dev_sq[d];
  head_stats->m2[lh] = m2;
}

// Adds the keys of (layer l, head h) to the pass's sums, to out's bounds
// (and to the layer's, lmin/lmax, when not null), quantises them when h is
// a key head, and records its statistics when head_stats is not null.
// InvalidArgument when a key is not finite.
absl::Status SummarizeHead(SummaryPass& p, const SummaryOptions& options, int32_t l, int32_t h,
                           float* lmin, float* lmax, BlockSummary* out, HeadStats* head_stats) {
  const int32_t T = p.T;
  const size_t D = p.D;
  p.LoadHeadKeys(l, h);
  std::fill(p.head_sum.begin(), p.head_sum.end(), 0.0f);
  simd::AccumulateRows(p.keys.data(), static_cast<size_t>(T), D, p.head_sum.data(),
                       options.bounds ? out->min.data() : nullptr,
                       options.bounds ? out->max.data() : nullptr);
  if (lmin != nullptr) {
    // Only the bounds: the sum goes to a scratch row.
    std::fill(p.dev_sq.begin(), p.dev_sq.end(), 0.0f);
    simd::AccumulateRows(p.keys.data(), static_cast<size_t>(T), D, p.dev_sq.data(), lmin, lmax);
  }
  // NaN and Inf propagate into the sum (min/max would hide NaN).
  for (size_t d = 0; d < D; ++d) {
    if (!std::isfinite(p.head_sum[d])) {
      return absl::InvalidArgumentError(
          absl::StrCat("payload keys of layer ", l, " head ", h, " are not finite (dim ", d, ")"));
    }
  }
  const size_t lh = static_cast<size_t>(l) * p.H + h;
  const auto slot = std::lower_bound(options.key_heads.begin(), options.key_heads.end(),
                                     static_cast<int32_t>(lh));
  if (slot != options.key_heads.end() && *slot == static_cast<int32_t>(lh)) {
    const size_t j = static_cast<size_t>(slot - options.key_heads.begin());
    out->key_scales[j] =
        QuantizeInt8(p.keys.data(), p.head_elems, &out->head_keys[j * p.head_elems]);
  }
  const double w = options.head_weights ? options.head_weights->weights[lh] : 0.0;
  p.weight_total += w;
  for (size_t d = 0; d < D; ++d) {
    p.block_sum[d] += p.head_sum[d];
    p.layer_sum[d] += p.head_sum[d];
    p.weighted_sum[d] += w * (static_cast<double>(p.head_sum[d]) / T);
  }
  if (head_stats != nullptr) RecordHeadStats(p, lh, head_stats);
  return absl::OkStatus();
}

// After every head: out's mean, weighted mean and (second pass over the
// keys, as the radius needs the final mean) radius.
void FinishSummary(SummaryPass& p, const SummaryOptions& options, BlockSummary* out) {
  const size_t D = p.D;
  const double total_keys = static_cast<double>(p.L) * p.H * p.T;
  out->mean.resize(D);
  for (size_t d = 0; d < D; ++d) {
    out->mean[d] = static_cast<float>(p.block_sum[d] / total_keys);
  }
  if (options.head_weights != nullptr) {
    out->weights_version = options.head_weights->version;
    out->weighted_mean.resize(D);
    for (size_t d = 0; d < D; ++d) {
      out->weighted_mean[d] = static_cast<float>(p.weighted_sum[d] / p.weight_total);
    }
  }
  if (options.bounds) {
    float r2 = 0;
    for (int32_t l = 0; l < p.L; ++l) {
      for (int32_t h = 0; h < p.H; ++h) {
        p.LoadHeadKeys(l, h);
        r2 = std::max(r2, simd::MaxSquaredDistance(p.keys.data(), static_cast<size_t>(p.T), D,
                                                   out->mean.data()));
      }
    }
    out->radius = std::sqrt(r2);
  }
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
  if (absl::Status s = CheckSummaryInputs(layout, payload, options); !s.ok()) return s;
  SummaryPass p(layout, payload);
  BlockSummary out;
  PrepareSummary(p, options, &out, head_stats);
  const size_t D = p.D;
  for (int32_t l = 0; l < p.L; ++l) {
    std::fill(p.layer_sum.begin(), p.layer_sum.end(), 0.0);
    float* lmin = options.per_layer_bounds ? &out.layer_min[l * D] : nullptr;
    float* lmax = options.per_layer_bounds ? &out.layer_max[l * D] : nullptr;
    for (int32_t h = 0; h < p.H; ++h) {
      if (absl::Status s = SummarizeHead(p, options, l, h, lmin, lmax, &out, head_stats); !s.ok()) {
        return s;
      }
    }
    if (options.per_layer) {
      const double n = static_cast<double>(p.H) * p.T;
      for (size_t d = 0; d < D; ++d) {
        out.layer_mean[l * D + d] = static_cast<float>(p.layer_sum[d] / n);
      }
    }
  }
  FinishSummary(p, options, &out);
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
