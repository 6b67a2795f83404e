#include "bench/quality/attention.h"

#include <algorithm>
#include <cmath>

#include "index/kernels/simd.h"

namespace kvtier::quality {

void ComputeStepAttention(const KvDump& d, int64_t t, int32_t block_size,
                          const AttentionOptions& options, StepAttention* out) {
  const int32_t L = d.num_layers;
  const int32_t Hq = d.num_q_heads;
  const int32_t D = d.head_dim;
  const int32_t g = d.group_size();
  const int64_t n = t + 1;
  const int64_t nb = (n + block_size - 1) / block_size;
  out->t = t;
  out->block_size = block_size;
  out->num_heads = L * Hq;
  out->head_dim = D;
  out->num_blocks = nb;
  out->mass.assign(static_cast<size_t>(L) * Hq * nb, 0.0f);
  if (options.outputs) {
    out->partial.assign(static_cast<size_t>(L) * Hq * nb * D, 0.0f);
    out->output.assign(static_cast<size_t>(L) * Hq * D, 0.0f);
  } else {
    out->partial.clear();
    out->output.clear();
  }
  if (options.probs) {
    out->probs.assign(static_cast<size_t>(L) * Hq * n, 0.0f);
  } else {
    out->probs.clear();
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<float> logits(n);
  std::vector<double> acc(D);
  for (int32_t l = 0; l < L; ++l) {
    for (int32_t h = 0; h < Hq; ++h) {
      const int32_t lh = l * Hq + h;
      const int32_t kvh = h / g;
      const float* q = d.Q(l, h, t);
      const float* k0 = d.K(l, kvh, 0);
      float max_logit = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        logits[j] = index::simd::Dot(q, k0 + j * D, D) * scale;
        max_logit = std::max(max_logit, logits[j]);
      }
      double total = 0;
      for (int64_t j = 0; j < n; ++j) {
        logits[j] = std::exp(logits[j] - max_logit);
        total += logits[j];
      }
      const double inv = 1.0 / total;
      float* mass = &out->mass[static_cast<size_t>(lh) * nb];
      const float* v0 = d.V(l, kvh, 0);
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t j0 = b * block_size;
        const int64_t j1 = std::min<int64_t>(n, j0 + block_size);
        double m = 0;
        if (options.outputs) std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = j0; j < j1; ++j) {
          const double p = logits[j] * inv;
          m += p;
          if (options.probs) out->probs[static_cast<size_t>(lh) * n + j] = static_cast<float>(p);
          if (options.outputs) {
            const float* v = v0 + j * D;
            for (int32_t i = 0; i < D; ++i) acc[i] += p * v[i];
          }
        }
        mass[b] = static_cast<float>(m);
        if (options.outputs) {
          float* u = &out->partial[(static_cast<size_t>(lh) * nb + b) * D];
          float* o = &out->output[static_cast<size_t>(lh) * D];
          for (int32_t i = 0; i < D; ++i) {
            u[i] = static_cast<float>(acc[i]);
            o[i] += u[i];
          }
        }
      }
    }
  }
}

void TotalMass(const StepAttention& a, std::vector<double>* out) {
  out->assign(a.num_blocks, 0.0);
  for (int32_t lh = 0; lh < a.num_heads; ++lh) {
    const float* m = a.Mass(lh);
    for (int64_t b = 0; b < a.num_blocks; ++b) (*out)[b] += m[b];
  }
}

}  // namespace kvtier::quality
