#include "tests/gpu/kernel_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "tests/gpu/half.h"

namespace kvtier::gpu::testing {

float LoadElement(const void* data, ElementType type, int64_t i) {
  switch (type) {
    case ElementType::kFp16:
      return HalfToFloat(static_cast<const uint16_t*>(data)[i]);
    case ElementType::kBf16:
      return Bf16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case ElementType::kFp32:
      return static_cast<const float*>(data)[i];
  }
  return std::numeric_limits<float>::quiet_NaN();
}

PoolReference PoolKeysReference(const KvBlockShape& shape, const void* block,
                                const std::vector<float>& head_weights) {
  const int L = shape.num_layers, H = shape.num_kv_heads, T = shape.block_tokens,
            D = shape.head_dim;
  PoolReference out;
  std::vector<double> sum(D, 0.0), wsum(D, 0.0);
  std::vector<float> mn(D, std::numeric_limits<float>::infinity());
  std::vector<float> mx(D, -std::numeric_limits<float>::infinity());
  out.layer_mean.resize(static_cast<size_t>(L) * D);
  out.layer_min.resize(static_cast<size_t>(L) * D);
  out.layer_max.resize(static_cast<size_t>(L) * D);
  double weight_total = 0.0;
  for (float w : head_weights) weight_total += w;
  for (int l = 0; l < L; ++l) {
    for (int d = 0; d < D; ++d) {
      double layer_sum = 0.0;
      float layer_min = std::numeric_limits<float>::infinity();
      float layer_max = -layer_min;
      for (int h = 0; h < H; ++h) {
        double head_sum = 0.0;
        for (int t = 0; t < T; ++t) {
          const float x = LoadElement(block, shape.dtype, shape.KeyIndex(l, h, t, d));
          if (!std::isfinite(x)) out.nonfinite = true;
          head_sum += x;
          layer_min = std::min(layer_min, x);
          layer_max = std::max(layer_max, x);
        }
        layer_sum += head_sum;
        if (!head_weights.empty()) wsum[d] += head_weights[l * H + h] * head_sum / T;
      }
      const size_t o = static_cast<size_t>(l) * D + d;
      out.layer_mean[o] = static_cast<float>(layer_sum / (static_cast<double>(H) * T));
      out.layer_min[o] = layer_min;
      out.layer_max[o] = layer_max;
      sum[d] += layer_sum;
      mn[d] = std::min(mn[d], layer_min);
      mx[d] = std::max(mx[d], layer_max);
    }
  }
  out.mean.resize(D);
  for (int d = 0; d < D; ++d) {
    out.mean[d] = static_cast<float>(sum[d] / (static_cast<double>(L) * H * T));
  }
  if (!head_weights.empty()) {
    out.weighted_mean.resize(D);
    for (int d = 0; d < D; ++d) out.weighted_mean[d] = static_cast<float>(wsum[d] / weight_total);
  }
  out.min = std::move(mn);
  out.max = std::move(mx);
  return out;
}

std::vector<float> ScoreReference(const void* levels, ElementType levels_type, int64_t num_rows,
                                  int64_t row_stride, int32_t dim,
                                  const std::vector<float>& anchors, int32_t num_anchors,
                                  ScoreKind kind) {
  std::vector<float> scores(static_cast<size_t>(num_anchors) * num_rows);
  std::vector<double> anchor_norm(num_anchors, 0.0);
  std::vector<bool> anchor_bad(num_anchors, false);
  for (int a = 0; a < num_anchors; ++a) {
    for (int d = 0; d < dim; ++d) {
      anchor_norm[a] += double{anchors[a * dim + d]} * anchors[a * dim + d];
      if (!std::isfinite(anchors[a * dim + d])) anchor_bad[a] = true;
    }
    anchor_norm[a] = std::sqrt(anchor_norm[a]);
  }
  for (int64_t r = 0; r < num_rows; ++r) {
    std::vector<double> row(dim);
    double row_norm = 0.0;
    bool row_bad = false;
    for (int d = 0; d < dim; ++d) {
      row[d] = LoadElement(levels, levels_type, r * row_stride + d);
      row_norm += row[d] * row[d];
      if (!std::isfinite(row[d])) row_bad = true;
    }
    row_norm = std::sqrt(row_norm);
    for (int a = 0; a < num_anchors; ++a) {
      if (row_bad || anchor_bad[a]) {
        // A NaN or Inf element makes the score NaN (kernel_shapes.h).
        scores[static_cast<size_t>(a) * num_rows + r] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      double dot = 0.0;
      for (int d = 0; d < dim; ++d) dot += anchors[a * dim + d] * row[d];
      double score = dot;
      if (kind == ScoreKind::kCosineUnit) {
        const double denom = anchor_norm[a] * row_norm;
        const double cos = denom > 0.0 ? std::clamp(dot / denom, -1.0, 1.0) : 0.0;
        score = 0.5 * (1.0 + cos);
      }
      scores[static_cast<size_t>(a) * num_rows + r] = static_cast<float>(score);
    }
  }
  return scores;
}

std::vector<float> ScoreSegmentsReference(const std::vector<SegmentReference>& segments,
                                          const std::vector<float>& anchors, int32_t dim) {
  std::vector<float> scores;
  for (const SegmentReference& seg : segments) {
    for (int64_t r = 0; r < seg.num_rows; ++r) {
      double dot = 0.0;
      for (int d = 0; d < dim; ++d) {
        dot += double{HalfToFloat(seg.rows[r * dim + d])} * anchors[seg.anchor * dim + d];
      }
      scores.push_back(static_cast<float>(dot));
    }
  }
  return scores;
}

TopKReference TopKReferenceSelect(const std::vector<float>& scores, int64_t num_rows,
                                  int32_t num_anchors, int32_t k) {
  TopKReference out;
  out.values.reserve(static_cast<size_t>(num_anchors) * k);
  out.indices.reserve(static_cast<size_t>(num_anchors) * k);
  std::vector<int32_t> order(num_rows);
  for (int a = 0; a < num_anchors; ++a) {
    const float* row = scores.data() + static_cast<size_t>(a) * num_rows;
    std::iota(order.begin(), order.end(), 0);
    // Descending by value, NaN last, ties by lower row number.
    auto before = [row](int32_t x, int32_t y) {
      const bool x_nan = std::isnan(row[x]), y_nan = std::isnan(row[y]);
      if (x_nan != y_nan) return y_nan;
      if (!x_nan && row[x] != row[y]) return row[x] > row[y];
      return x < y;
    };
    std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
    for (int i = 0; i < k; ++i) {
      out.indices.push_back(order[i]);
      out.values.push_back(row[order[i]]);
    }
  }
  return out;
}

}  // namespace kvtier::gpu::testing
