// Key-statistics kernels of simd.h (the block summary's passes over keys):
// a portable path and an AVX2 path chosen once at run time. Every path
// performs the same float operations in the same order (no FMA, fixed
// reduction trees), so a summary has the same bits on every CPU.
#include <algorithm>
#include <cstddef>

#include "index/kernels/cpu_features.h"
#include "index/kernels/simd.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVTIER_X86 1
#endif

namespace kvtier::index::simd {
namespace {

void AccumulateRowsScalar(const float* rows, size_t nrows, size_t dim, float* sum, float* min,
                          float* max) {
  for (size_t r = 0; r < nrows; ++r) {
    const float* k = rows + r * dim;
    for (size_t d = 0; d < dim; ++d) sum[d] += k[d];
    if (min != nullptr) {
      for (size_t d = 0; d < dim; ++d) {
        min[d] = std::min(min[d], k[d]);
        max[d] = std::max(max[d], k[d]);
      }
    }
  }
}

void AccumulateSquaredDeviationsScalar(const float* rows, size_t nrows, size_t dim,
                                       const float* center, float* acc) {
  for (size_t r = 0; r < nrows; ++r) {
    const float* k = rows + r * dim;
    for (size_t d = 0; d < dim; ++d) {
      const float dev = k[d] - center[d];
      acc[d] += dev * dev;
    }
  }
}

float SquaredDistanceScalar(const float* k, const float* center, size_t dim) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t d = 0;
  for (; d + 8 <= dim; d += 8) {
    for (size_t j = 0; j < 8; ++j) {
      const float dev = k[d + j] - center[d + j];
      acc[j] += dev * dev;
    }
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; d < dim; ++d) {
    const float dev = k[d] - center[d];
    s += dev * dev;
  }
  return s;
}

float MaxSquaredDistanceScalar(const float* rows, size_t nrows, size_t dim, const float* center) {
  float best = 0;
  for (size_t r = 0; r < nrows; ++r) {
    best = std::max(best, SquaredDistanceScalar(rows + r * dim, center, dim));
  }
  return best;
}

// The per-head reductions in double (HeadSums in simd.h). One body for
// both paths: element-wise IEEE operations without FMA give the same bits
// at any vector width; the AVX2 copy only lets the compiler use wider
// vectors.
__attribute__((always_inline)) inline void AddHeadSumsBody(const float* head_sum, size_t dim,
                                                           double count, double weight,
                                                           const HeadSums& out) {
  for (size_t d = 0; d < dim; ++d) {
    const double x = head_sum[d];
    out.block_sum[d] += x;
    if (out.layer_sum != nullptr) out.layer_sum[d] += x;
    const double m = x / count;
    if (out.weighted_sum != nullptr) out.weighted_sum[d] += weight * m;
    if (out.mean != nullptr) {
      out.mean[d] = m;
      out.mean_f[d] = static_cast<float>(m);
    }
  }
}

void AddHeadSumsScalar(const float* head_sum, size_t dim, double count, double weight,
                       const HeadSums& out) {
  AddHeadSumsBody(head_sum, dim, count, weight, out);
}

#ifdef KVTIER_X86
#define KVTIER_AVX2 __attribute__((target("avx2")))

KVTIER_AVX2 void AddHeadSumsAvx2(const float* head_sum, size_t dim, double count, double weight,
                                 const HeadSums& out) {
  AddHeadSumsBody(head_sum, dim, count, weight, out);
}

// Lanes of 8 dims; a block of kChunk dims keeps its accumulators in
// registers while the rows stream past.
constexpr size_t kChunk = 32;

KVTIER_AVX2 void AccumulateRowsAvx2(const float* rows, size_t nrows, size_t dim, float* sum,
                                    float* min, float* max) {
  size_t d0 = 0;
  for (; d0 + kChunk <= dim; d0 += kChunk) {
    __m256 s[4], lo[4], hi[4];
    for (int j = 0; j < 4; ++j) {
      s[j] = _mm256_loadu_ps(sum + d0 + 8 * j);
      if (min != nullptr) {
        lo[j] = _mm256_loadu_ps(min + d0 + 8 * j);
        hi[j] = _mm256_loadu_ps(max + d0 + 8 * j);
      }
    }
    for (size_t r = 0; r < nrows; ++r) {
      const float* k = rows + r * dim + d0;
      for (int j = 0; j < 4; ++j) {
        const __m256 v = _mm256_loadu_ps(k + 8 * j);
        s[j] = _mm256_add_ps(s[j], v);
        if (min != nullptr) {
          // Operand order as std::min(cur, v) / std::max(cur, v): ties keep cur.
          lo[j] = _mm256_min_ps(v, lo[j]);
          hi[j] = _mm256_max_ps(v, hi[j]);
        }
      }
    }
    for (int j = 0; j < 4; ++j) {
      _mm256_storeu_ps(sum + d0 + 8 * j, s[j]);
      if (min != nullptr) {
        _mm256_storeu_ps(min + d0 + 8 * j, lo[j]);
        _mm256_storeu_ps(max + d0 + 8 * j, hi[j]);
      }
    }
  }
  if (d0 < dim) {
    // The remaining dims, row by row, as the portable path does them.
    for (size_t r = 0; r < nrows; ++r) {
      const float* k = rows + r * dim;
      for (size_t d = d0; d < dim; ++d) {
        sum[d] += k[d];
        if (min != nullptr) {
          min[d] = std::min(min[d], k[d]);
          max[d] = std::max(max[d], k[d]);
        }
      }
    }
  }
}

KVTIER_AVX2 void AccumulateSquaredDeviationsAvx2(const float* rows, size_t nrows, size_t dim,
                                                 const float* center, float* acc) {
  size_t d0 = 0;
  for (; d0 + kChunk <= dim; d0 += kChunk) {
    __m256 a[4], c[4];
    for (int j = 0; j < 4; ++j) {
      a[j] = _mm256_loadu_ps(acc + d0 + 8 * j);
      c[j] = _mm256_loadu_ps(center + d0 + 8 * j);
    }
    for (size_t r = 0; r < nrows; ++r) {
      const float* k = rows + r * dim + d0;
      for (int j = 0; j < 4; ++j) {
        const __m256 dev = _mm256_sub_ps(_mm256_loadu_ps(k + 8 * j), c[j]);
        a[j] = _mm256_add_ps(a[j], _mm256_mul_ps(dev, dev));
      }
    }
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(acc + d0 + 8 * j, a[j]);
  }
  for (size_t r = 0; d0 < dim && r < nrows; ++r) {
    const float* k = rows + r * dim;
    for (size_t d = d0; d < dim; ++d) {
      const float dev = k[d] - center[d];
      acc[d] += dev * dev;
    }
  }
}

KVTIER_AVX2 float MaxSquaredDistanceAvx2(const float* rows, size_t nrows, size_t dim,
                                         const float* center) {
  float best = 0;
  const size_t body = dim / 8 * 8;
  for (size_t r = 0; r < nrows; ++r) {
    const float* k = rows + r * dim;
    __m256 acc = _mm256_setzero_ps();
    for (size_t d = 0; d < body; d += 8) {
      const __m256 dev = _mm256_sub_ps(_mm256_loadu_ps(k + d), _mm256_loadu_ps(center + d));
      acc = _mm256_add_ps(acc, _mm256_mul_ps(dev, dev));
    }
    // The portable path's tree: ((0+1)+(2+3)) + ((4+5)+(6+7)).
    alignas(32) float lane[8];
    _mm256_store_ps(lane, acc);
    float s =
        ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    for (size_t d = body; d < dim; ++d) {
      const float dev = k[d] - center[d];
      s += dev * dev;
    }
    best = std::max(best, s);
  }
  return best;
}
#endif  // KVTIER_X86

struct StatsKernels {
  void (*accumulate_rows)(const float*, size_t, size_t, float*, float*,
                          float*) = AccumulateRowsScalar;
  void (*accumulate_squared_deviations)(const float*, size_t, size_t, const float*,
                                        float*) = AccumulateSquaredDeviationsScalar;
  float (*max_squared_distance)(const float*, size_t, size_t,
                                const float*) = MaxSquaredDistanceScalar;
  void (*add_head_sums)(const float*, size_t, double, double, const HeadSums&) = AddHeadSumsScalar;
};

StatsKernels Detect() {
  StatsKernels k;
#ifdef KVTIER_X86
  if (CpuFeatures().avx2) {
    k.accumulate_rows = AccumulateRowsAvx2;
    k.accumulate_squared_deviations = AccumulateSquaredDeviationsAvx2;
    k.max_squared_distance = MaxSquaredDistanceAvx2;
    k.add_head_sums = AddHeadSumsAvx2;
  }
#endif
  return k;
}

const StatsKernels& Active() {
  static const StatsKernels kernels = Detect();
  return kernels;
}

}  // namespace

void AccumulateRows(const float* rows, size_t nrows, size_t dim, float* sum, float* min,
                    float* max) {
  Active().accumulate_rows(rows, nrows, dim, sum, min, max);
}

void AccumulateSquaredDeviations(const float* rows, size_t nrows, size_t dim, const float* center,
                                 float* acc) {
  Active().accumulate_squared_deviations(rows, nrows, dim, center, acc);
}

float MaxSquaredDistance(const float* rows, size_t nrows, size_t dim, const float* center) {
  return Active().max_squared_distance(rows, nrows, dim, center);
}

void AddHeadSums(const float* head_sum, size_t dim, double count, double weight,
                 const HeadSums& out) {
  Active().add_head_sums(head_sum, dim, count, weight, out);
}

namespace internal {

void AddHeadSumsPortable(const float* head_sum, size_t dim, double count, double weight,
                         const HeadSums& out) {
  AddHeadSumsScalar(head_sum, dim, count, weight, out);
}

void AccumulateRowsPortable(const float* rows, size_t nrows, size_t dim, float* sum, float* min,
                            float* max) {
  AccumulateRowsScalar(rows, nrows, dim, sum, min, max);
}

void AccumulateSquaredDeviationsPortable(const float* rows, size_t nrows, size_t dim,
                                         const float* center, float* acc) {
  AccumulateSquaredDeviationsScalar(rows, nrows, dim, center, acc);
}

float MaxSquaredDistancePortable(const float* rows, size_t nrows, size_t dim, const float* center) {
  return MaxSquaredDistanceScalar(rows, nrows, dim, center);
}

}  // namespace internal
}  // namespace kvtier::index::simd
