#include "tests/testutil/synthetic.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "index/kernels/simd.h"

namespace kvtier::testing {
namespace {

// Random vector with i.i.d. N(0, 1/dim) entries (expected norm 1).
std::vector<float> RandomDirection(std::mt19937_64& rng, int32_t dim) {
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(dim));
  std::vector<float> v(dim);
  for (float& x : v) x = normal(rng);
  return v;
}

void Normalise(std::vector<float>* v) {
  double n2 = 0;
  for (float x : *v) n2 += double{x} * x;
  const float inv = n2 > 0 ? static_cast<float>(1.0 / std::sqrt(n2)) : 0.0f;
  for (float& x : *v) x *= inv;
}

}  // namespace

SyntheticContext MakeSyntheticContext(const SyntheticContextOptions& o) {
  std::mt19937_64 rng(o.seed);
  const int32_t D = o.dim;
  SyntheticContext ctx;
  ctx.dim = D;
  ctx.num_blocks = o.num_blocks;
  ctx.vectors.resize(static_cast<size_t>(o.num_blocks) * D);
  ctx.topic_of.resize(o.num_blocks);

  const std::vector<float> common = RandomDirection(rng, D);
  std::vector<std::vector<float>> topics;
  for (int32_t k = 0; k < std::max(o.num_topics, 1); ++k) {
    topics.push_back(RandomDirection(rng, D));
  }
  const std::vector<float> query_topic =
      o.anchor_topic >= 0 ? topics[o.anchor_topic % topics.size()] : RandomDirection(rng, D);

  // Topic runs.
  std::uniform_int_distribution<int32_t> run_len(std::max(o.topic_run_min, 1),
                                                 std::max(o.topic_run_max, o.topic_run_min));
  std::uniform_int_distribution<int32_t> pick_topic(0, static_cast<int32_t>(topics.size()) - 1);
  for (int64_t b = 0; b < o.num_blocks;) {
    const int32_t k = pick_topic(rng);
    const int64_t end = std::min<int64_t>(o.num_blocks, b + run_len(rng));
    for (; b < end; ++b) ctx.topic_of[b] = k;
  }
  // Planted runs, away from the sink outliers, not overlapping.
  const int64_t run = std::max(o.planted_run, 1);
  const int64_t runs = (o.num_planted + run - 1) / run;
  std::uniform_int_distribution<int64_t> pick_start(
      o.num_sink_outliers, std::max<int64_t>(o.num_sink_outliers, o.num_blocks - run));
  int64_t planted_left = o.num_planted;
  for (int64_t r = 0; r < runs && planted_left > 0; ++r) {
    for (int attempt = 0; attempt < 1000; ++attempt) {
      const int64_t start = pick_start(rng);
      const int64_t len = std::min(run, planted_left);
      bool clash = false;
      for (int64_t b = start; b < start + len; ++b) {
        clash |= ctx.topic_of[b] == -1;
      }
      if (clash) continue;
      for (int64_t b = start; b < start + len; ++b) ctx.topic_of[b] = -1;
      planted_left -= len;
      break;
    }
  }
  for (int32_t s = 0; s < o.num_sink_outliers && s < o.num_blocks; ++s) {
    ctx.topic_of[s] = -2;
  }

  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(D));
  const std::vector<float> sink_dir = RandomDirection(rng, D);
  for (int64_t b = 0; b < o.num_blocks; ++b) {
    float* v = &ctx.vectors[b * D];
    const int32_t k = ctx.topic_of[b];
    if (k == -2) {
      for (int32_t d = 0; d < D; ++d) {
        v[d] = o.sink_scale * sink_dir[d] + o.noise * normal(rng);
      }
      continue;
    }
    const std::vector<float>& t = k == -1 ? query_topic : topics[k];
    const float noise = k == -1 ? o.noise * o.planted_noise : o.noise;
    for (int32_t d = 0; d < D; ++d) {
      v[d] = o.common * common[d] + o.topic * t[d] + noise * normal(rng);
    }
    if (k == -1) ctx.planted.push_back(b);
  }
  ctx.anchor.resize(D);
  for (int32_t d = 0; d < D; ++d) {
    ctx.anchor[d] = o.common * common[d] + o.topic * query_topic[d];
  }
  Normalise(&ctx.anchor);
  return ctx;
}

SyntheticPayload MakeBlockPayload(const index::BlockLayout& layout, uint64_t seed,
                                  const std::vector<float>& head_scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> offset(-1.0f, 1.0f);
  const int32_t L = layout.num_layers, H = layout.num_kv_heads;
  const int32_t T = layout.block_size_tokens, D = layout.head_dim;
  const size_t head_elems = static_cast<size_t>(T) * D;
  const int elem = index::DtypeSizeBytes(layout.dtype);
  SyntheticPayload out;
  out.bytes.resize(static_cast<size_t>(index::PayloadSizeBytes(layout)));
  out.keys.resize(static_cast<size_t>(L) * H * head_elems);
  out.mean.assign(D, 0.0);

  // Writes `value` rounded to the dtype at element `i`; returns the stored
  // value.
  auto store = [&](size_t i, float value) -> float {
    char* dst = out.bytes.data() + i * elem;
    switch (layout.dtype) {
      case index::Dtype::kFp16: {
        const uint16_t h = index::simd::FloatToHalf(value);
        std::memcpy(dst, &h, 2);
        return index::simd::HalfToFloat(h);
      }
      case index::Dtype::kBf16: {
        uint32_t u;
        std::memcpy(&u, &value, 4);
        u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
        const uint16_t b = static_cast<uint16_t>(u >> 16);
        std::memcpy(dst, &b, 2);
        return index::simd::BfloatToFloat(b);
      }
      case index::Dtype::kFp32:
        std::memcpy(dst, &value, 4);
        return value;
    }
    return 0.0f;
  };

  for (int32_t l = 0; l < L; ++l) {
    for (int32_t kv = 0; kv < 2; ++kv) {
      for (int32_t h = 0; h < H; ++h) {
        const size_t lh = static_cast<size_t>(l) * H + h;
        const float scale = head_scale.empty() ? 1.0f : head_scale[lh];
        std::vector<float> off(D);
        for (float& x : off) x = offset(rng);
        const size_t first = ((static_cast<size_t>(l) * 2 + kv) * H + h) * head_elems;
        for (size_t e = 0; e < head_elems; ++e) {
          const float v = store(first + e, off[e % D] + scale * normal(rng));
          if (kv == 0) out.keys[lh * head_elems + e] = v;
        }
      }
    }
  }
  for (size_t i = 0; i < out.keys.size(); ++i) out.mean[i % D] += out.keys[i];
  const double count = static_cast<double>(L) * H * T;
  for (double& m : out.mean) m /= count;
  return out;
}

std::vector<int64_t> ExactTopK(const std::vector<float>& vectors, int32_t dim,
                               const std::vector<float>& anchor, int64_t k) {
  const int64_t n = static_cast<int64_t>(vectors.size()) / dim;
  std::vector<double> cos(n);
  double an = 0;
  for (float a : anchor) an += double{a} * a;
  an = std::sqrt(an);
  for (int64_t b = 0; b < n; ++b) {
    double dot = 0, n2 = 0;
    for (int32_t d = 0; d < dim; ++d) {
      const double v = vectors[b * dim + d];
      dot += v * anchor[d];
      n2 += v * v;
    }
    cos[b] = n2 > 0 ? dot / (std::sqrt(n2) * an) : 0.0;
  }
  std::vector<int64_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  k = std::min(k, n);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int64_t a, int64_t b) {
    return cos[a] > cos[b] || (cos[a] == cos[b] && a < b);
  });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace kvtier::testing
