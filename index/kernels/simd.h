// Vector kernels of the index, chosen once at run time for the CPU: an
// AVX-512 (F, BW, VL) path, an AVX2 + FMA + F16C path, and a portable scalar
// path for any x86-64-v2 (or other) machine. The binary itself is built for
// the project's baseline ISA; only these functions use wider instructions,
// and only after the CPU reports them.
//
// Determinism: within one process every call takes the same path, and
// DotRowsHalf computes each row with the same sequence of operations no
// matter how many rows are passed at once or where the row sits, so a row
// scored alone and scored inside a larger batch gives bitwise equal results.
//
// Thread safety: all functions are pure and thread-safe. Pointers may be
// unaligned.
//
// Signatures are BLAS-style (pointers, counts, strides), as in FlashInfer and
// Highway: the one place in the tree where a call takes more than five
// arguments rather than an options struct.
#ifndef KVTIER_INDEX_KERNELS_SIMD_H_
#define KVTIER_INDEX_KERNELS_SIMD_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace kvtier::index::simd {

// Scalar conversions (IEEE binary16 and bfloat16 bit patterns).
float HalfToFloat(uint16_t bits);
// Round to nearest even; values beyond the binary16 range become +-inf.
uint16_t FloatToHalf(float value);
float BfloatToFloat(uint16_t bits);

// dst[i] = value of the i-th 16-bit element of src, i in [0, n).
void HalfToFloatN(const void* src, float* dst, size_t n);
void BfloatToFloatN(const void* src, float* dst, size_t n);
// dst[i] = FloatToHalf(src[i]).
void FloatToHalfN(const float* src, uint16_t* dst, size_t n);

// out[r] = sum_d HalfToFloat(rows[r * dim + d]) * q[d] for r in [0, nrows).
void DotRowsHalf(const uint16_t* rows, size_t nrows, size_t dim, const float* q, float* out);

// out[r] = sum_d rows[r * stride + d] * q[d] for r in [0, nrows), int8 rows
// (stride >= dim elements between rows), accumulated in float.
void DotRowsInt8(const int8_t* rows, size_t nrows, size_t stride, size_t dim, const float* q,
                 float* out);

// sum_i exp(scale * (x[i] - shift)) for scale >= 0 and x[i] <= shift (every
// exponent <= 0; exponents below -87 count 0). A vectorised exp with a
// relative error below 2e-7 per term.
float SumExpBelow(const float* x, size_t n, float scale, float shift);

// sum_i a[i] * b[i], accumulated in float with a fixed order.
float Dot(const float* a, const float* b, size_t n);

// Key statistics (the block summary's passes; simd_stats.cc). Every path
// does the same float operations in the same order (no FMA, fixed
// reduction trees), so results have the same bits on every CPU.
//
// For d in [0, dim): sum[d] += rows[r * dim + d] for r = 0, 1, ... in order;
// when min is not null, min[d] = std::min(min[d], row value) and max[d]
// likewise (max must then be non-null too).
void AccumulateRows(const float* rows, size_t nrows, size_t dim, float* sum, float* min,
                    float* max);
// acc[d] += (rows[r * dim + d] - center[d])^2 for r in order.
void AccumulateSquaredDeviations(const float* rows, size_t nrows, size_t dim, const float* center,
                                 float* acc);
// max(0, max_r ||row_r - center||^2), each row's sum taken over eight
// interleaved partial sums reduced as ((0+1)+(2+3))+((4+5)+(6+7)).
float MaxSquaredDistance(const float* rows, size_t nrows, size_t dim, const float* center);

// A head's sums folded into the block's, in double: for d in [0, dim),
// x = head_sum[d], m = x / count: block_sum[d] += x, layer_sum[d] += x,
// weighted_sum[d] += weight * m, mean[d] = m and mean_f[d] = (float)m; a
// null pointer (other than block_sum) skips its term (mean and mean_f go
// together). Element-wise, so every path gives the same bits.
struct HeadSums {
  double* block_sum = nullptr;
  double* layer_sum = nullptr;
  double* weighted_sum = nullptr;
  double* mean = nullptr;
  float* mean_f = nullptr;
};
void AddHeadSums(const float* head_sum, size_t dim, double count, double weight,
                 const HeadSums& out);

namespace internal {
// The portable paths of the kernels above (tests compare them).
void AddHeadSumsPortable(const float* head_sum, size_t dim, double count, double weight,
                         const HeadSums& out);
void AccumulateRowsPortable(const float* rows, size_t nrows, size_t dim, float* sum, float* min,
                            float* max);
void AccumulateSquaredDeviationsPortable(const float* rows, size_t nrows, size_t dim,
                                         const float* center, float* acc);
float MaxSquaredDistancePortable(const float* rows, size_t nrows, size_t dim, const float* center);
}  // namespace internal

// "avx512", "avx2" or "scalar": the path this process uses.
absl::string_view ActiveIsa();

}  // namespace kvtier::index::simd

#endif  // KVTIER_INDEX_KERNELS_SIMD_H_
