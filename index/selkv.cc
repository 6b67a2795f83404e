#include "index/selkv.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "index/kernels/cpu_features.h"
#include "index/kernels/simd.h"
#include "index/summary/block_layout.h"
#include "index/validate.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define KVTIER_SELKV_X86 1
#endif

namespace kvtier::index {
namespace {

// Kept keys are scored this many at a time: a [D][8] tile of normalised
// keys lets the compiler keep eight independent accumulators in registers
// (the routing loop is the O(T * K * D) cost of a compaction).
constexpr size_t kLanes = 8;

// The floor of a kept slot's observation attention (selkv.h, step 4).
constexpr double kMinAttention = 1e-12;

absl::Status Validate(const HeadKv& head, const CompactOptions& options) {
  if (!std::isfinite(options.rho) || !(options.rho > 0.0f) || options.rho > 1.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("rho (", options.rho, ") must be finite and in (0, 1]"));
  }
  if (static_cast<uint8_t>(options.importance) > static_cast<uint8_t>(Importance::kH2O)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "importance (", static_cast<int>(options.importance), ") is not a known value"));
  }
  if (static_cast<uint8_t>(options.merge) > static_cast<uint8_t>(Merge::kNone)) {
    return absl::InvalidArgumentError(
        absl::StrCat("merge (", static_cast<int>(options.merge), ") is not a known value"));
  }
  if (static_cast<uint8_t>(options.bias) > static_cast<uint8_t>(Bias::kNone)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bias (", static_cast<int>(options.bias), ") is not a known value"));
  }
  if (head.num_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_tokens (", head.num_tokens, ") must be >= 1"));
  }
  if (head.head_dim < 1 || head.head_dim > kMaxHeadDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim (", head.head_dim, ") must be in [1, ", kMaxHeadDim, "]"));
  }
  const size_t T = static_cast<size_t>(head.num_tokens);
  const size_t D = static_cast<size_t>(head.head_dim);
  if (head.keys.size() != T * D) {
    return absl::InvalidArgumentError(
        absl::StrCat("keys has ", head.keys.size(),
                     " elements, expected num_tokens x head_dim = ", T, " x ", D));
  }
  if (head.values.size() != T * D) {
    return absl::InvalidArgumentError(
        absl::StrCat("values has ", head.values.size(),
                     " elements, expected num_tokens x head_dim = ", T, " x ", D));
  }
  if (head.queries.size() % D != 0) {
    return absl::InvalidArgumentError(absl::StrCat("queries has ", head.queries.size(),
                                                   " elements, not a multiple of head_dim ", D));
  }
  const size_t W = head.queries.size() / D;
  if (W > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError("queries: more than 2^31 rows");
  }
  if (!head.query_positions.empty() && head.query_positions.size() != W) {
    return absl::InvalidArgumentError(
        absl::StrCat("query_positions has ", head.query_positions.size(),
                     " entries, expected one per query row (", W, ")"));
  }
  for (size_t w = 0; w < head.query_positions.size(); ++w) {
    if (head.query_positions[w] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("query_positions[", w, "] (", head.query_positions[w], ") is negative"));
    }
  }
  if (W == 0 && options.importance != Importance::kKeyDiff) {
    return absl::InvalidArgumentError(absl::StrCat(
        "queries: importance ", options.importance == Importance::kSnapKV ? "kSnapKV" : "kH2O",
        " needs observation queries (none given)"));
  }
  if (absl::Status s = CheckFinite("keys", head.keys.data(), head.keys.size()); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckFinite("values", head.values.data(), head.values.size()); !s.ok()) {
    return s;
  }
  return CheckFinite("queries", head.queries.data(), head.queries.size());
}

double DotDouble(const float* a, const float* b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Observation attention: sum[i] = sum over the query rows w that see token
// i of softmax_w(i).
void ObservationAttention(const HeadKv& head, std::vector<double>* sum) {
  const size_t T = static_cast<size_t>(head.num_tokens);
  const size_t D = static_cast<size_t>(head.head_dim);
  const size_t W = head.queries.size() / D;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  sum->assign(T, 0.0);
  std::vector<double> logits(T);
  for (size_t w = 0; w < W; ++w) {
    const float* q = head.queries.data() + w * D;
    const size_t n = head.query_positions.empty()
                         ? T
                         : std::min(T, static_cast<size_t>(head.query_positions[w]) + 1);
    double max_logit = -std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < n; ++i) {
      const float* k = head.keys.data() + i * D;
      double s = simd::Dot(q, k, D);
      // A float product of finite inputs can overflow; double cannot.
      if (!std::isfinite(s)) s = DotDouble(q, k, D);
      logits[i] = s * scale;
      max_logit = std::max(max_logit, logits[i]);
    }
    double z = 0;
    for (size_t i = 0; i < n; ++i) {
      logits[i] = std::exp(logits[i] - max_logit);
      z += logits[i];
    }
    for (size_t i = 0; i < n; ++i) {
      (*sum)[i] += logits[i] / z;
    }
  }
}

// -cos(k_i, mean of the normalised keys); 0 for zero keys or a zero mean.
void KeyDiffScores(const HeadKv& head, const std::vector<double>& inv_norm,
                   std::vector<double>* score) {
  const size_t T = static_cast<size_t>(head.num_tokens);
  const size_t D = static_cast<size_t>(head.head_dim);
  std::vector<double> mean(D, 0.0);
  for (size_t i = 0; i < T; ++i) {
    const float* k = head.keys.data() + i * D;
    for (size_t d = 0; d < D; ++d) mean[d] += k[d] * inv_norm[i];
  }
  double mean_norm = 0;
  for (double m : mean) mean_norm += m * m;
  mean_norm = std::sqrt(mean_norm);
  score->assign(T, 0.0);
  if (!(mean_norm > 0)) return;
  for (size_t i = 0; i < T; ++i) {
    const float* k = head.keys.data() + i * D;
    double dot = 0;
    for (size_t d = 0; d < D; ++d) dot += k[d] * mean[d];
    (*score)[i] = -dot * inv_norm[i] / mean_norm;
  }
}

// Scores kRows query rows against every kept key: out[r * stride + s] =
// rows[r] . key of slot s for s < tiles * kLanes, from the tiled layout
// tile[t][d][j] (slot t * kLanes + j). Rows past the real ones are zeros.
constexpr size_t kRows = 4;

void ScoreTilesPortable(const float* tile, size_t tiles, size_t D, const float* rows, float* out,
                        size_t stride) {
  for (size_t t = 0; t < tiles; ++t) {
    const float* tp = tile + t * D * kLanes;
    for (size_t r = 0; r < kRows; ++r) {
      float acc[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (size_t d = 0; d < D; ++d) {
        const float x = rows[r * D + d];
        for (size_t j = 0; j < kLanes; ++j) acc[j] += tp[d * kLanes + j] * x;
      }
      std::copy_n(acc, kLanes, out + r * stride + t * kLanes);
    }
  }
}

#ifdef KVTIER_SELKV_X86
// Four rows against two tiles at a time: eight independent FMA chains, so
// the loop runs at the FMA ports' rate rather than their latency.
__attribute__((target("avx2,fma"))) void ScoreTilesAvx2(const float* tile, size_t tiles, size_t D,
                                                        const float* rows, float* out,
                                                        size_t stride) {
  size_t t = 0;
  for (; t + 2 <= tiles; t += 2) {
    const float* ta = tile + t * D * kLanes;
    const float* tb = ta + D * kLanes;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (size_t d = 0; d < D; ++d) {
      const __m256 ka = _mm256_loadu_ps(ta + d * kLanes);
      const __m256 kb = _mm256_loadu_ps(tb + d * kLanes);
      __m256 x = _mm256_broadcast_ss(rows + d);
      a0 = _mm256_fmadd_ps(ka, x, a0);
      b0 = _mm256_fmadd_ps(kb, x, b0);
      x = _mm256_broadcast_ss(rows + D + d);
      a1 = _mm256_fmadd_ps(ka, x, a1);
      b1 = _mm256_fmadd_ps(kb, x, b1);
      x = _mm256_broadcast_ss(rows + 2 * D + d);
      a2 = _mm256_fmadd_ps(ka, x, a2);
      b2 = _mm256_fmadd_ps(kb, x, b2);
      x = _mm256_broadcast_ss(rows + 3 * D + d);
      a3 = _mm256_fmadd_ps(ka, x, a3);
      b3 = _mm256_fmadd_ps(kb, x, b3);
    }
    float* o = out + t * kLanes;
    _mm256_storeu_ps(o, a0);
    _mm256_storeu_ps(o + kLanes, b0);
    _mm256_storeu_ps(o + stride, a1);
    _mm256_storeu_ps(o + stride + kLanes, b1);
    _mm256_storeu_ps(o + 2 * stride, a2);
    _mm256_storeu_ps(o + 2 * stride + kLanes, b2);
    _mm256_storeu_ps(o + 3 * stride, a3);
    _mm256_storeu_ps(o + 3 * stride + kLanes, b3);
  }
  if (t < tiles) {
    ScoreTilesPortable(tile + t * D * kLanes, 1, D, rows, out + t * kLanes, stride);
  }
}
#endif

using ScoreTilesFn = void (*)(const float*, size_t, size_t, const float*, float*, size_t);

ScoreTilesFn ChooseScoreTiles() {
#ifdef KVTIER_SELKV_X86
  if (CpuFeatures().avx2) return ScoreTilesAvx2;
#endif
  return ScoreTilesPortable;
}

// For every evicted token (evicted[e], ascending) the slot of the kept token
// (kept ascending) of highest key cosine; ties go to the lower slot. The
// cosines are float dot products of normalised keys (FMA-rounded on CPUs
// with AVX2), so a near-tie may route differently on another CPU.
void Route(const HeadKv& head, const std::vector<int32_t>& kept,
           const std::vector<int32_t>& evicted, const std::vector<double>& inv_norm,
           std::vector<int32_t>* route) {
  static const ScoreTilesFn score_tiles = ChooseScoreTiles();
  const size_t D = static_cast<size_t>(head.head_dim);
  const size_t K = kept.size();
  const size_t tiles = (K + kLanes - 1) / kLanes;
  const size_t stride = tiles * kLanes;
  // tile[t][d][j] = normalised key of kept[t * kLanes + j] (0 past the end).
  std::vector<float> tile(tiles * D * kLanes, 0.0f);
  for (size_t s = 0; s < K; ++s) {
    const float* k = head.keys.data() + static_cast<size_t>(kept[s]) * D;
    float* dst = tile.data() + (s / kLanes) * D * kLanes + s % kLanes;
    for (size_t d = 0; d < D; ++d) dst[d * kLanes] = static_cast<float>(k[d] * inv_norm[kept[s]]);
  }
  std::vector<float> rows(kRows * D);
  std::vector<float> scores(kRows * stride);
  route->resize(evicted.size());
  for (size_t e0 = 0; e0 < evicted.size(); e0 += kRows) {
    const size_t n = std::min(kRows, evicted.size() - e0);
    std::fill(rows.begin(), rows.end(), 0.0f);
    for (size_t r = 0; r < n; ++r) {
      const size_t i = static_cast<size_t>(evicted[e0 + r]);
      const float* k = head.keys.data() + i * D;
      for (size_t d = 0; d < D; ++d) rows[r * D + d] = static_cast<float>(k[d] * inv_norm[i]);
    }
    score_tiles(tile.data(), tiles, D, rows.data(), scores.data(), stride);
    for (size_t r = 0; r < n; ++r) {
      const float* sc = scores.data() + r * stride;
      // First maximum: the lowest slot among equal cosines.
      (*route)[e0 + r] = static_cast<int32_t>(std::max_element(sc, sc + K) - sc);
    }
  }
}

// cos(a, b) in double; 0 when either is zero.
double Cosine(const float* a, const float* b, size_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < n; ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0.0;
}

// The K most important tokens (ties: the lower index), ascending, in *kept;
// the others, ascending, in *evicted.
void SplitByImportance(const std::vector<double>& importance, size_t K, std::vector<int32_t>* kept,
                       std::vector<int32_t>* evicted) {
  const size_t T = importance.size();
  std::vector<int32_t> order(T);
  std::iota(order.begin(), order.end(), 0);
  auto more_important = [&](int32_t a, int32_t b) {
    return importance[a] != importance[b] ? importance[a] > importance[b] : a < b;
  };
  std::nth_element(order.begin(), order.begin() + static_cast<ptrdiff_t>(K), order.end(),
                   more_important);
  kept->assign(order.begin(), order.begin() + static_cast<ptrdiff_t>(K));
  std::sort(kept->begin(), kept->end());
  evicted->clear();
  evicted->reserve(T - K);
  size_t s = 0;
  for (int32_t i = 0; i < static_cast<int32_t>(T); ++i) {
    if (s < K && (*kept)[s] == i) {
      ++s;
    } else {
      evicted->push_back(i);
    }
  }
}

// Groups the evicted tokens by the slot route[e] sends them to (counting
// sort, stable: ascending token order inside a slot): slot s's members are
// (*members)[(*start)[s] .. (*start)[s + 1]).
void GroupBySlot(const std::vector<int32_t>& route, const std::vector<int32_t>& evicted, size_t K,
                 std::vector<int32_t>* start, std::vector<int32_t>* members) {
  start->assign(K + 1, 0);
  for (int32_t s : route) ++(*start)[static_cast<size_t>(s) + 1];
  for (size_t s = 0; s < K; ++s) (*start)[s + 1] += (*start)[s];
  members->assign(evicted.size(), 0);
  std::vector<int32_t> fill(start->begin(), start->end() - 1);
  for (size_t e = 0; e < evicted.size(); ++e) (*members)[fill[route[e]]++] = evicted[e];
}

}  // namespace

int32_t KeptSlots(int32_t num_tokens, float rho) {
  if (num_tokens < 1) return 0;
  if (!std::isfinite(rho) || !(rho > 0.0f)) return 1;
  if (rho >= 1.0f) return num_tokens;
  // rho is a float: rho * T is known to within T * 2^-24 of what the caller
  // meant, so 0.1 of 1000 tokens must give 100, not ceil(100.0000015) = 101.
  const double t = static_cast<double>(num_tokens);
  const double k = std::ceil(static_cast<double>(rho) * t - 1e-7 * t);
  return static_cast<int32_t>(std::clamp(k, 1.0, t));
}

absl::StatusOr<CompactedHead> CompactHead(const HeadKv& head, const CompactOptions& options) {
  if (absl::Status s = Validate(head, options); !s.ok()) return s;
  const size_t T = static_cast<size_t>(head.num_tokens);
  const size_t D = static_cast<size_t>(head.head_dim);
  const size_t K = static_cast<size_t>(KeptSlots(head.num_tokens, options.rho));

  CompactedHead out;
  if (K == T) {
    out.positions.resize(T);
    std::iota(out.positions.begin(), out.positions.end(), 0);
    out.keys.assign(head.keys.begin(), head.keys.end());
    out.values.assign(head.values.begin(), head.values.end());
    out.bias.assign(T, 0.0f);
    out.merged.assign(T, 0);
    return out;
  }

  std::vector<double> inv_norm(T);
  for (size_t i = 0; i < T; ++i) {
    const double n2 = DotDouble(head.keys.data() + i * D, head.keys.data() + i * D, D);
    inv_norm[i] = n2 > 0 ? 1.0 / std::sqrt(n2) : 0.0;
  }

  // Observation attention: the importance of kSnapKV / kH2O, and the merge
  // and bias weights whenever queries are given.
  const bool have_queries = !head.queries.empty();
  std::vector<double> attention_sum;
  if (have_queries) ObservationAttention(head, &attention_sum);

  std::vector<double> importance;
  switch (options.importance) {
    case Importance::kKeyDiff:
      KeyDiffScores(head, inv_norm, &importance);
      break;
    case Importance::kSnapKV:
    case Importance::kH2O:
      // SnapKV's mean over the W rows ranks as their sum, H2O's score.
      importance = attention_sum;
      break;
  }

  std::vector<int32_t> kept, evicted;
  SplitByImportance(importance, K, &kept, &evicted);

  out.positions = kept;
  out.keys.resize(K * D);
  out.values.resize(K * D);
  out.bias.assign(K, 0.0f);
  out.merged.assign(K, 0);
  for (size_t s = 0; s < K; ++s) {
    const size_t i = static_cast<size_t>(kept[s]);
    std::copy_n(head.keys.data() + i * D, D, out.keys.data() + s * D);
    std::copy_n(head.values.data() + i * D, D, out.values.data() + s * D);
  }
  if (options.merge == Merge::kNone) return out;

  std::vector<int32_t> route;
  Route(head, kept, evicted, inv_norm, &route);

  std::vector<int32_t> start, members;
  GroupBySlot(route, evicted, K, &start, &members);

  // Merge weight of token i: its observation attention, the mean over the W
  // rows of their softmax weight on i (a row that cannot see i counts 0), or
  // 1 without queries. Measured on realkv (docs/QUALITY.md), averaging only
  // over the rows that see i gave slightly larger errors: the last tokens of
  // the window are then weighted by one or two queries' views.
  const size_t rows = head.queries.size() / D;  // whole query rows
  const double inv_rows = have_queries ? 1.0 / static_cast<double>(rows) : 0;
  auto weight = [&](size_t i) { return have_queries ? attention_sum[i] * inv_rows : 1.0; };
  std::vector<double> acc(D);
  for (size_t s = 0; s < K; ++s) {
    const size_t t = static_cast<size_t>(kept[s]);
    const float* vt = head.values.data() + t * D;
    out.merged[s] = start[s + 1] - start[s];
    if (out.merged[s] == 0) continue;
    const double w_t = have_queries ? std::max(weight(t), kMinAttention) : 1.0;
    for (size_t d = 0; d < D; ++d) acc[d] = w_t * vt[d];
    double w_routed = 0;  // sum of g_e a_e (or of g_e without queries)
    double g_sum = 0;     // sum of g_e
    for (int32_t m = start[s]; m < start[s + 1]; ++m) {
      const size_t e = static_cast<size_t>(members[static_cast<size_t>(m)]);
      const float* ve = head.values.data() + e * D;
      const double g = options.merge == Merge::kUniform ? 1.0 : std::max(Cosine(ve, vt, D), 0.0);
      g_sum += g;
      const double w = g * weight(e);
      if (!(w > 0)) continue;
      for (size_t d = 0; d < D; ++d) acc[d] += w * ve[d];
      w_routed += w;
    }
    if (!(w_routed > 0)) continue;
    const double inv = 1.0 / (w_t + w_routed);
    float* vo = out.values.data() + s * D;
    for (size_t d = 0; d < D; ++d) vo[d] = static_cast<float>(acc[d] * inv);
    if (options.bias == Bias::kAttentionRatio) {
      // log of the mass ratio, capped at log(1 + sum g_e): a kept token the
      // window barely attends (KeyDiff keeps such tokens) would otherwise
      // get a bias fitted to a few queries (up to log(1e12) with the floor),
      // which later queries do not share.
      out.bias[s] = static_cast<float>(std::min(std::log1p(w_routed / w_t), std::log1p(g_sum)));
    }
  }
  return out;
}

}  // namespace kvtier::index
