#include "bench/quality/claims.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "index/kernels/simd.h"

namespace kvtier::quality {
namespace {

std::vector<double> Ranks(absl::Span<const double> v) {
  const size_t n = v.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&v](size_t a, size_t b) { return v[a] < v[b]; });
  std::vector<double> rank(n);
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j + 1 < n && v[order[j + 1]] == v[order[i]]) ++j;
    const double r = 0.5 * static_cast<double>(i + j);
    for (size_t k = i; k <= j; ++k) rank[order[k]] = r;
    i = j + 1;
  }
  return rank;
}

// Indices of the k largest values (ties to the lower index), as a mask.
std::vector<char> TopMask(const std::vector<double>& v, size_t k) {
  std::vector<size_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  k = std::min(k, idx.size());
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&v](size_t a, size_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  std::vector<char> mask(v.size(), 0);
  for (size_t i = 0; i < k; ++i) mask[idx[i]] = 1;
  return mask;
}

double Cos(const float* a, const float* b, int32_t d) {
  const double ab = index::simd::Dot(a, b, d);
  const double aa = index::simd::Dot(a, a, d);
  const double bb = index::simd::Dot(b, b, d);
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0.0;
}

}  // namespace

double Spearman(absl::Span<const double> x, absl::Span<const double> y) {
  const size_t n = std::min(x.size(), y.size());
  if (n < 2) return 0.0;
  const std::vector<double> rx = Ranks(x.subspan(0, n));
  const std::vector<double> ry = Ranks(y.subspan(0, n));
  const double mean = 0.5 * static_cast<double>(n - 1);
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < n; ++i) {
    sxy += (rx[i] - mean) * (ry[i] - mean);
    sxx += (rx[i] - mean) * (rx[i] - mean);
    syy += (ry[i] - mean) * (ry[i] - mean);
  }
  if (sxx <= 0 || syy <= 0) return 0.0;
  return sxy / std::sqrt(sxx * syy);
}

ClaimsAccumulator::ClaimsAccumulator(int32_t num_layers, std::vector<double> fractions)
    : num_layers_(num_layers),
      fractions_(std::move(fractions)),
      overlap_head_(num_layers * fractions_.size(), 0.0),
      overlap_pooled_(overlap_head_.size(), 0.0),
      chance_(overlap_head_.size(), 0.0),
      rho_(num_layers, 0.0),
      rho_no_sink_(num_layers, 0.0),
      rho_block_(num_layers, 0.0),
      samples_(num_layers, 0) {}

void ClaimsAccumulator::AddStep(const ReplayData& data, const StepAttention& a,
                                const StepInput& in) {
  const KvDump& d = *data.dump;
  const int32_t D = d.head_dim;
  const int32_t g = d.group_size();
  const int64_t n = a.t + 1;
  const int64_t bs = data.options.block_size;
  const size_t F = fractions_.size();
  std::vector<double> attn(n), kk(n), kk_pooled(n), distinct(n), mean(D);
  for (int32_t l = 0; l < d.num_layers; ++l) {
    for (int32_t kvh = 0; kvh < d.num_kv_heads; ++kvh) {
      std::fill(attn.begin(), attn.end(), 0.0);
      for (int32_t h = kvh * g; h < (kvh + 1) * g; ++h) {
        const float* p = a.Probs(l * d.num_q_heads + h);
        for (int64_t j = 0; j < n; ++j) attn[j] += p[j];
      }
      const float* anchor = &in.anchor_head[(static_cast<size_t>(l) * d.num_kv_heads + kvh) * D];
      std::fill(mean.begin(), mean.end(), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        const float* k = d.K(l, kvh, j);
        kk[j] = Cos(anchor, k, D);
        kk_pooled[j] = Cos(in.anchor.data(), k, D);
        const double norm = std::sqrt(index::simd::Dot(k, k, D));
        if (norm > 0) {
          for (int32_t i = 0; i < D; ++i) mean[i] += k[i] / norm;
        }
      }
      std::vector<float> meanf(mean.begin(), mean.end());
      for (int64_t j = 0; j < n; ++j) {
        distinct[j] = -Cos(d.K(l, kvh, j), meanf.data(), D);
      }
      for (size_t f = 0; f < F; ++f) {
        const size_t k = static_cast<size_t>(
            std::max<double>(1.0, std::ceil(fractions_[f] * static_cast<double>(n))));
        const std::vector<char> ta = TopMask(attn, k);
        const std::vector<char> th = TopMask(kk, k);
        const std::vector<char> tp = TopMask(kk_pooled, k);
        size_t hit_h = 0, hit_p = 0;
        for (int64_t j = 0; j < n; ++j) {
          hit_h += ta[j] && th[j];
          hit_p += ta[j] && tp[j];
        }
        overlap_head_[l * F + f] += static_cast<double>(hit_h) / k;
        overlap_pooled_[l * F + f] += static_cast<double>(hit_p) / k;
        chance_[l * F + f] += static_cast<double>(k) / n;
      }
      rho_[l] += Spearman(distinct, attn);
      if (n > bs + 1) {
        rho_no_sink_[l] += Spearman(absl::MakeConstSpan(distinct).subspan(bs),
                                    absl::MakeConstSpan(attn).subspan(bs));
      }
      // Block level over the complete blocks.
      const int64_t nc = in.num_complete;
      const index::SummaryView v = data.HeadView(l * d.num_kv_heads + kvh, nc);
      std::vector<float> bmean(D, 0.0f);
      for (int64_t b = 0; b < nc; ++b) {
        const float* r = v.mean + b * D;
        const double norm = std::sqrt(index::simd::Dot(r, r, D));
        if (norm > 0) {
          for (int32_t i = 0; i < D; ++i) bmean[i] += r[i] / norm;
        }
      }
      std::vector<double> bd(nc), bm(nc, 0.0);
      for (int64_t b = 0; b < nc; ++b) {
        bd[b] = -Cos(v.mean + b * D, bmean.data(), D);
        for (int64_t j = b * bs; j < (b + 1) * bs; ++j) bm[b] += attn[j];
      }
      rho_block_[l] += Spearman(bd, bm);
      ++samples_[l];
    }
  }
}

absl::Status ClaimsAccumulator::Merge(const ClaimsAccumulator& o) {
  if (o.num_layers_ != num_layers_ || o.fractions_ != fractions_) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot merge claims of ", o.num_layers_, " layers into ", num_layers_));
  }
  for (size_t i = 0; i < overlap_head_.size(); ++i) {
    overlap_head_[i] += o.overlap_head_[i];
    overlap_pooled_[i] += o.overlap_pooled_[i];
    chance_[i] += o.chance_[i];
  }
  for (int32_t l = 0; l < num_layers_; ++l) {
    rho_[l] += o.rho_[l];
    rho_no_sink_[l] += o.rho_no_sink_[l];
    rho_block_[l] += o.rho_block_[l];
    samples_[l] += o.samples_[l];
  }
  return absl::OkStatus();
}

std::vector<ClaimsAccumulator::LayerRow> ClaimsAccumulator::Rows() const {
  std::vector<LayerRow> rows;
  const size_t F = fractions_.size();
  for (int32_t l = 0; l < num_layers_; ++l) {
    LayerRow r;
    r.layer = l;
    r.samples = samples_[l];
    const double s = samples_[l] > 0 ? static_cast<double>(samples_[l]) : 1.0;
    for (size_t f = 0; f < F; ++f) {
      r.overlap_head.push_back(overlap_head_[l * F + f] / s);
      r.overlap_pooled.push_back(overlap_pooled_[l * F + f] / s);
      r.chance.push_back(chance_[l * F + f] / s);
    }
    r.keydiff_rho = rho_[l] / s;
    r.keydiff_rho_no_sink = rho_no_sink_[l] / s;
    r.keydiff_rho_block = rho_block_[l] / s;
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace kvtier::quality
