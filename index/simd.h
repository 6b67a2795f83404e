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
#ifndef KVTIER_INDEX_SIMD_H_
#define KVTIER_INDEX_SIMD_H_

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
void DotRowsHalf(const uint16_t* rows, size_t nrows, size_t dim, const float* q,
                 float* out);

// out[r] = sum_d rows[r * stride + d] * q[d] for r in [0, nrows), int8 rows
// (stride >= dim elements between rows), accumulated in float.
void DotRowsInt8(const int8_t* rows, size_t nrows, size_t stride, size_t dim,
                 const float* q, float* out);

// sum_i exp(scale * (x[i] - shift)) for scale >= 0 and x[i] <= shift (every
// exponent <= 0; exponents below -87 count 0). A vectorised exp with a
// relative error below 2e-7 per term.
float SumExpBelow(const float* x, size_t n, float scale, float shift);

// sum_i a[i] * b[i], accumulated in float with a fixed order.
float Dot(const float* a, const float* b, size_t n);

// "avx512", "avx2" or "scalar": the path this process uses.
absl::string_view ActiveIsa();

}  // namespace kvtier::index::simd

#endif  // KVTIER_INDEX_SIMD_H_
