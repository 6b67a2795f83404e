#include "bench/quality/replay_data.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "index/kernels/simd.h"

namespace kvtier::quality {
namespace {

index::SummaryView MakeView(int32_t dim, int64_t n, const float* mean, const float* min,
                            const float* max, const float* radius) {
  index::SummaryView v;
  v.dim = dim;
  v.num_blocks = n;
  v.mean = mean;
  v.min = min;
  v.max = max;
  v.radius = radius;
  return v;
}

// The payload of block b in the layout of index/summary/block_layout.h, fp16.
std::string BlockPayload(const KvDump& d, int32_t bs, int64_t b) {
  const int32_t D = d.head_dim;
  std::vector<float> row(static_cast<size_t>(bs) * D);
  std::string out;
  out.reserve(static_cast<size_t>(d.num_layers) * 2 * d.num_kv_heads * bs * D * 2);
  std::vector<uint16_t> half(row.size());
  for (int32_t l = 0; l < d.num_layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      for (int32_t h = 0; h < d.num_kv_heads; ++h) {
        const float* src = kv == 0 ? d.K(l, h, b * bs) : d.V(l, h, b * bs);
        index::simd::FloatToHalfN(src, half.data(), half.size());
        out.append(reinterpret_cast<const char*>(half.data()), half.size() * sizeof(uint16_t));
      }
    }
  }
  return out;
}

}  // namespace

index::SummaryView ReplayData::PooledView(int64_t n) const {
  return MakeView(dump->head_dim, n, pooled_mean.data(), pooled_min.data(), pooled_max.data(),
                  pooled_radius.data());
}

index::SummaryView ReplayData::LayerView(int32_t l, int64_t n) const {
  const size_t off = static_cast<size_t>(l) * num_complete * dump->head_dim;
  return MakeView(dump->head_dim, n, layer_mean.data() + off, layer_min.data() + off,
                  layer_max.data() + off, nullptr);
}

index::SummaryView ReplayData::HeadView(int32_t lkv, int64_t n) const {
  const size_t off = static_cast<size_t>(lkv) * num_complete * dump->head_dim;
  return MakeView(dump->head_dim, n, head_mean.data() + off, head_min.data() + off,
                  head_max.data() + off,
                  head_radius.data() + static_cast<size_t>(lkv) * num_complete);
}

index::SummaryView ReplayData::HeadNoRopeView(int32_t lkv, int64_t n) const {
  const size_t off = static_cast<size_t>(lkv) * num_complete * dump->head_dim;
  return MakeView(dump->head_dim, n, head_mean_norope.data() + off, nullptr, nullptr, nullptr);
}

absl::StatusOr<ReplayData> BuildReplayData(const KvDump& d, const ReplayOptions& o) {
  if (o.block_size < 1 || o.block_size > index::kMaxBlockSizeTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block_size (", o.block_size, ") must be in [1, ", index::kMaxBlockSizeTokens, "]"));
  }
  if (o.anchor_tokens < 1) {
    return absl::InvalidArgumentError("anchor_tokens must be >= 1");
  }
  if (!(o.prompt_fraction > 0 && o.prompt_fraction < 1)) {
    return absl::InvalidArgumentError("prompt_fraction must be in (0, 1)");
  }
  if (o.snapkv_window < 1) {
    return absl::InvalidArgumentError("snapkv_window must be >= 1");
  }
  ReplayData r;
  r.dump = &d;
  r.options = o;
  r.layout.num_layers = d.num_layers;
  r.layout.num_kv_heads = d.num_kv_heads;
  r.layout.head_dim = d.head_dim;
  r.layout.block_size_tokens = o.block_size;
  r.layout.dtype = index::Dtype::kFp16;
  if (absl::Status s = index::ValidateLayout(r.layout); !s.ok()) return s;
  r.block_bytes = index::PayloadSizeBytes(r.layout);
  r.num_complete = d.seq_len / o.block_size;
  r.prompt_tokens = static_cast<int64_t>(o.prompt_fraction * d.seq_len);
  if ((r.prompt_tokens + 1) / o.block_size < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(d.name, ": the prompt (", r.prompt_tokens,
                     " tokens) holds fewer than 2 complete blocks of ", o.block_size, " tokens"));
  }
  const int32_t D = d.head_dim;
  const int32_t L = d.num_layers;
  const int32_t H = d.num_kv_heads;
  const int64_t n = r.num_complete;
  if (auto it = d.metadata.find("rope_theta"); it != d.metadata.end()) {
    if (!absl::SimpleAtod(it->second, &r.rope_theta) || !(r.rope_theta > 0) || D % 2 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(d.name, ": metadata rope_theta (\"", it->second,
                       "\") must be a positive number with an even head_dim"));
    }
  }
  r.keys_norope = d.k;
  if (r.rope_theta > 0) {
    const int32_t half = D / 2;
    std::vector<double> freq(half);
    for (int32_t i = 0; i < half; ++i) {
      freq[i] = std::pow(r.rope_theta, -2.0 * i / D);
    }
    for (size_t lkv = 0; lkv < static_cast<size_t>(L) * H; ++lkv) {
      for (int64_t t = 0; t < d.seq_len; ++t) {
        float* k = &r.keys_norope[(lkv * d.seq_len + t) * D];
        for (int32_t i = 0; i < half; ++i) {
          const double c = std::cos(t * freq[i]), s = std::sin(t * freq[i]);
          const double x1 = k[i], x2 = k[i + half];
          k[i] = static_cast<float>(x1 * c + x2 * s);
          k[i + half] = static_cast<float>(-x1 * s + x2 * c);
        }
      }
    }
  }
  r.head_mean_norope.assign(static_cast<size_t>(L) * H * n * D, 0.0f);
  for (size_t lkv = 0; lkv < static_cast<size_t>(L) * H; ++lkv) {
    for (int64_t b = 0; b < n; ++b) {
      float* m = &r.head_mean_norope[(lkv * n + b) * D];
      for (int64_t j = b * o.block_size; j < (b + 1) * o.block_size; ++j) {
        const float* k = &r.keys_norope[(lkv * d.seq_len + j) * D];
        for (int32_t i = 0; i < D; ++i) m[i] += k[i] / o.block_size;
      }
    }
  }
  const size_t lh_rows = static_cast<size_t>(L) * H * n * D;
  r.layer_mean.resize(static_cast<size_t>(L) * n * D);
  r.layer_min.resize(r.layer_mean.size());
  r.layer_max.resize(r.layer_mean.size());
  r.head_mean.resize(lh_rows);
  r.head_min.resize(lh_rows);
  r.head_max.resize(lh_rows);
  r.head_radius.resize(static_cast<size_t>(L) * H * n);
  index::SummaryOptions so;
  so.bounds = true;
  so.per_layer = true;
  so.per_layer_bounds = true;
  for (int64_t b = 0; b < n; ++b) {
    r.payloads.push_back(BlockPayload(d, o.block_size, b));
    index::HeadStats stats;
    absl::StatusOr<index::BlockSummary> s =
        index::ComputeBlockSummary(r.layout, r.payloads.back(), so, &stats);
    if (!s.ok()) {
      return absl::Status(s.status().code(),
                          absl::StrCat(d.name, ": block ", b, ": ", s.status().message()));
    }
    r.pooled_mean.insert(r.pooled_mean.end(), s->mean.begin(), s->mean.end());
    r.pooled_min.insert(r.pooled_min.end(), s->min.begin(), s->min.end());
    r.pooled_max.insert(r.pooled_max.end(), s->max.begin(), s->max.end());
    r.pooled_radius.push_back(s->radius);
    for (int32_t l = 0; l < L; ++l) {
      const size_t dst = (static_cast<size_t>(l) * n + b) * D;
      std::copy_n(&s->layer_mean[l * D], D, &r.layer_mean[dst]);
      std::copy_n(&s->layer_min[l * D], D, &r.layer_min[dst]);
      std::copy_n(&s->layer_max[l * D], D, &r.layer_max[dst]);
      for (int32_t h = 0; h < H; ++h) {
        const size_t lkv = static_cast<size_t>(l) * H + h;
        const size_t row = (lkv * n + b) * D;
        for (int32_t i = 0; i < D; ++i) {
          r.head_mean[row + i] = static_cast<float>(stats.mean[lkv * D + i]);
          r.head_min[row + i] = std::numeric_limits<float>::infinity();
          r.head_max[row + i] = -std::numeric_limits<float>::infinity();
        }
        float r2 = 0;
        for (int64_t j = b * o.block_size; j < (b + 1) * o.block_size; ++j) {
          const float* k = d.K(l, h, j);
          float dist = 0;
          for (int32_t i = 0; i < D; ++i) {
            r.head_min[row + i] = std::min(r.head_min[row + i], k[i]);
            r.head_max[row + i] = std::max(r.head_max[row + i], k[i]);
            const float e = k[i] - r.head_mean[row + i];
            dist += e * e;
          }
          r2 = std::max(r2, dist);
        }
        r.head_radius[lkv * n + b] = std::sqrt(r2);
      }
    }
    r.summaries.push_back(std::move(*s));
  }
  return r;
}

void ComputeAnchors(const ReplayData& data, int64_t t, StepInput* in) {
  const KvDump& d = *data.dump;
  const int32_t D = d.head_dim;
  const int32_t L = d.num_layers;
  const int32_t H = d.num_kv_heads;
  const int64_t first = std::max<int64_t>(0, t - data.options.anchor_tokens + 1);
  const float inv_tokens = 1.0f / static_cast<float>(t - first + 1);
  in->anchor_head.assign(static_cast<size_t>(L) * H * D, 0.0f);
  in->anchor_head_norope.assign(static_cast<size_t>(L) * H * D, 0.0f);
  in->anchor_layer.assign(static_cast<size_t>(L) * D, 0.0f);
  in->anchor.assign(D, 0.0f);
  for (int32_t l = 0; l < L; ++l) {
    for (int32_t h = 0; h < H; ++h) {
      const size_t lkv = static_cast<size_t>(l) * H + h;
      float* a = &in->anchor_head[lkv * D];
      float* an = &in->anchor_head_norope[lkv * D];
      for (int64_t j = first; j <= t; ++j) {
        const float* k = d.K(l, h, j);
        const float* kn = &data.keys_norope[(lkv * d.seq_len + j) * D];
        for (int32_t i = 0; i < D; ++i) {
          a[i] += k[i];
          an[i] += kn[i] * inv_tokens;
        }
      }
      for (int32_t i = 0; i < D; ++i) {
        a[i] *= inv_tokens;
        in->anchor_layer[l * D + i] += a[i] / H;
        in->anchor[i] += a[i] / (H * L);
      }
    }
  }
  in->query.assign(D, 0.0f);
  const float inv_heads = 1.0f / static_cast<float>(L * d.num_q_heads);
  for (int32_t l = 0; l < L; ++l) {
    for (int32_t h = 0; h < d.num_q_heads; ++h) {
      const float* q = d.Q(l, h, t);
      for (int32_t i = 0; i < D; ++i) in->query[i] += q[i] * inv_heads;
    }
  }
}

}  // namespace kvtier::quality
