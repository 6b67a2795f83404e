#include "index/kernels/simd.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "index/kernels/cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVTIER_X86 1
// GCC 12's _mm512_undefined_ps() self-initialises a local, which
// -Wmaybe-uninitialized reports inside every AVX-512 conversion.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace kvtier::index::simd {
namespace {

uint16_t Load16(const void* p, size_t i) {
  uint16_t v;
  std::memcpy(&v, static_cast<const char*>(p) + 2 * i, sizeof(v));
  return v;
}

// ---- portable path ---------------------------------------------------------

void HalfToFloatScalar(const void* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = HalfToFloat(Load16(src, i));
}

void BfloatToFloatScalar(const void* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = BfloatToFloat(Load16(src, i));
}

void FloatToHalfScalar(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = FloatToHalf(src[i]);
}

float DotRowHalfScalar(const uint16_t* row, size_t dim, const float* q) {
  float acc[4] = {0, 0, 0, 0};
  size_t d = 0;
  for (; d + 4 <= dim; d += 4) {
    for (size_t j = 0; j < 4; ++j) acc[j] += HalfToFloat(row[d + j]) * q[d + j];
  }
  float sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  for (; d < dim; ++d) sum += HalfToFloat(row[d]) * q[d];
  return sum;
}

void DotRowsHalfScalar(const uint16_t* rows, size_t nrows, size_t dim, const float* q, float* out) {
  for (size_t r = 0; r < nrows; ++r) {
    out[r] = DotRowHalfScalar(rows + r * dim, dim, q);
  }
}

void DotRowsInt8Scalar(const int8_t* rows, size_t nrows, size_t stride, size_t dim, const float* q,
                       float* out) {
  for (size_t r = 0; r < nrows; ++r) {
    const int8_t* row = rows + r * stride;
    float acc[4] = {0, 0, 0, 0};
    size_t d = 0;
    for (; d + 4 <= dim; d += 4) {
      for (size_t j = 0; j < 4; ++j) acc[j] += row[d + j] * q[d + j];
    }
    float sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for (; d < dim; ++d) sum += row[d] * q[d];
    out[r] = sum;
  }
}

// exp(y) for y in [-87, 0]: y = k ln2 + r, |r| <= ln2 / 2, exp(r) by a
// degree-6 polynomial (Cephes expf), 2^k by the exponent bits.
inline float ExpNonPositive(float y) {
  y = std::max(y, -87.0f);
  const float k = std::nearbyint(y * 1.44269504088896341f);
  float r = y - k * 0.693359375f;
  r = r + k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>(static_cast<uint32_t>(static_cast<int32_t>(k) + 127) << 23);
}

float SumExpBelowScalar(const float* x, size_t n, float scale, float shift) {
  float sum = 0.0f;
  for (size_t i = 0; i < n; ++i) sum += ExpNonPositive(scale * (x[i] - shift));
  return sum;
}

float DotScalar(const float* a, const float* b, size_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (size_t j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

#ifdef KVTIER_X86
// ---- AVX2 + FMA + F16C -----------------------------------------------------
#define KVTIER_AVX2 __attribute__((target("avx2,fma,f16c")))

KVTIER_AVX2 void HalfToFloatAvx2(const void* src, float* dst, size_t n) {
  const char* s = static_cast<const char*>(src);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = HalfToFloat(Load16(src, i));
}

KVTIER_AVX2 void BfloatToFloatAvx2(const void* src, float* dst, size_t n) {
  const char* s = static_cast<const char*>(src);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * i));
    __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(w));
  }
  for (; i < n; ++i) dst[i] = BfloatToFloat(Load16(src, i));
}

KVTIER_AVX2 void FloatToHalfAvx2(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h =
        _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = FloatToHalf(src[i]);
}

KVTIER_AVX2 inline float HorizontalSum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
  return _mm_cvtss_f32(s);
}

KVTIER_AVX2 inline __m256 LoadHalf8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Tail (dim % 8) is added after the vector sum, in index order, for every
// row alike.
KVTIER_AVX2 inline float TailHalf(const uint16_t* row, size_t from, size_t dim, const float* q,
                                  float sum) {
  for (size_t d = from; d < dim; ++d) sum += HalfToFloat(row[d]) * q[d];
  return sum;
}

KVTIER_AVX2 void DotRowsHalfAvx2(const uint16_t* rows, size_t nrows, size_t dim, const float* q,
                                 float* out) {
  const size_t body = dim & ~size_t{7};
  size_t r = 0;
  for (; r + 4 <= nrows; r += 4) {
    const uint16_t* r0 = rows + (r + 0) * dim;
    const uint16_t* r1 = rows + (r + 1) * dim;
    const uint16_t* r2 = rows + (r + 2) * dim;
    const uint16_t* r3 = rows + (r + 3) * dim;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (size_t d = 0; d < body; d += 8) {
      __m256 qv = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(LoadHalf8(r0 + d), qv, a0);
      a1 = _mm256_fmadd_ps(LoadHalf8(r1 + d), qv, a1);
      a2 = _mm256_fmadd_ps(LoadHalf8(r2 + d), qv, a2);
      a3 = _mm256_fmadd_ps(LoadHalf8(r3 + d), qv, a3);
    }
    out[r + 0] = TailHalf(r0, body, dim, q, HorizontalSum256(a0));
    out[r + 1] = TailHalf(r1, body, dim, q, HorizontalSum256(a1));
    out[r + 2] = TailHalf(r2, body, dim, q, HorizontalSum256(a2));
    out[r + 3] = TailHalf(r3, body, dim, q, HorizontalSum256(a3));
  }
  for (; r < nrows; ++r) {
    const uint16_t* r0 = rows + r * dim;
    __m256 a0 = _mm256_setzero_ps();
    for (size_t d = 0; d < body; d += 8) {
      a0 = _mm256_fmadd_ps(LoadHalf8(r0 + d), _mm256_loadu_ps(q + d), a0);
    }
    out[r] = TailHalf(r0, body, dim, q, HorizontalSum256(a0));
  }
}

KVTIER_AVX2 inline __m256 LoadInt8x8(const int8_t* p) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}

KVTIER_AVX2 void DotRowsInt8Avx2(const int8_t* rows, size_t nrows, size_t stride, size_t dim,
                                 const float* q, float* out) {
  const size_t body = dim & ~size_t{7};
  for (size_t r = 0; r < nrows; ++r) {
    const int8_t* row = rows + r * stride;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    size_t d = 0;
    for (; d + 16 <= body; d += 16) {
      a0 = _mm256_fmadd_ps(LoadInt8x8(row + d), _mm256_loadu_ps(q + d), a0);
      a1 = _mm256_fmadd_ps(LoadInt8x8(row + d + 8), _mm256_loadu_ps(q + d + 8), a1);
    }
    for (; d < body; d += 8) {
      a0 = _mm256_fmadd_ps(LoadInt8x8(row + d), _mm256_loadu_ps(q + d), a0);
    }
    float sum = HorizontalSum256(_mm256_add_ps(a0, a1));
    for (; d < dim; ++d) sum += row[d] * q[d];
    out[r] = sum;
  }
}

KVTIER_AVX2 float SumExpBelowAvx2(const float* x, size_t n, float scale, float shift) {
  const __m256 vs = _mm256_set1_ps(scale), vh = _mm256_set1_ps(shift);
  const __m256 lo = _mm256_set1_ps(-87.0f);
  __m256 acc = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 y = _mm256_max_ps(_mm256_mul_ps(vs, _mm256_sub_ps(_mm256_loadu_ps(x + i), vh)), lo);
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(y, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), y);
    r = _mm256_fmadd_ps(k, _mm256_set1_ps(2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    acc = _mm256_add_ps(acc, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
  }
  float sum = HorizontalSum256(acc);
  for (; i < n; ++i) sum += ExpNonPositive(scale * (x[i] - shift));
  return sum;
}

KVTIER_AVX2 float DotAvx2(const float* a, const float* b, size_t n) {
  __m256 acc = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  }
  float sum = HorizontalSum256(acc);
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// ---- AVX-512 (F, BW, VL) ---------------------------------------------------
#define KVTIER_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

KVTIER_AVX512 inline __m512 LoadHalf16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

KVTIER_AVX512 inline __m512 LoadHalf16Masked(const uint16_t* p, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

KVTIER_AVX512 void HalfToFloatAvx512(const void* src, float* dst, size_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, LoadHalf16(s + i));
  if (i < n) {
    __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(dst + i, m, LoadHalf16Masked(s + i, m));
  }
}

KVTIER_AVX512 void DotRowsHalfAvx512(const uint16_t* rows, size_t nrows, size_t dim, const float* q,
                                     float* out) {
  const size_t body = dim & ~size_t{15};
  const size_t tail = dim - body;
  const __mmask16 m = static_cast<__mmask16>((1u << tail) - 1);
  const __m512 qt = _mm512_maskz_loadu_ps(m, q + body);
  size_t r = 0;
  for (; r + 4 <= nrows; r += 4) {
    const uint16_t* r0 = rows + (r + 0) * dim;
    const uint16_t* r1 = rows + (r + 1) * dim;
    const uint16_t* r2 = rows + (r + 2) * dim;
    const uint16_t* r3 = rows + (r + 3) * dim;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    __m512 a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    for (size_t d = 0; d < body; d += 16) {
      __m512 qv = _mm512_loadu_ps(q + d);
      a0 = _mm512_fmadd_ps(LoadHalf16(r0 + d), qv, a0);
      a1 = _mm512_fmadd_ps(LoadHalf16(r1 + d), qv, a1);
      a2 = _mm512_fmadd_ps(LoadHalf16(r2 + d), qv, a2);
      a3 = _mm512_fmadd_ps(LoadHalf16(r3 + d), qv, a3);
    }
    if (tail != 0) {
      a0 = _mm512_fmadd_ps(LoadHalf16Masked(r0 + body, m), qt, a0);
      a1 = _mm512_fmadd_ps(LoadHalf16Masked(r1 + body, m), qt, a1);
      a2 = _mm512_fmadd_ps(LoadHalf16Masked(r2 + body, m), qt, a2);
      a3 = _mm512_fmadd_ps(LoadHalf16Masked(r3 + body, m), qt, a3);
    }
    out[r + 0] = _mm512_reduce_add_ps(a0);
    out[r + 1] = _mm512_reduce_add_ps(a1);
    out[r + 2] = _mm512_reduce_add_ps(a2);
    out[r + 3] = _mm512_reduce_add_ps(a3);
  }
  for (; r < nrows; ++r) {
    const uint16_t* r0 = rows + r * dim;
    __m512 a0 = _mm512_setzero_ps();
    for (size_t d = 0; d < body; d += 16) {
      a0 = _mm512_fmadd_ps(LoadHalf16(r0 + d), _mm512_loadu_ps(q + d), a0);
    }
    if (tail != 0) a0 = _mm512_fmadd_ps(LoadHalf16Masked(r0 + body, m), qt, a0);
    out[r] = _mm512_reduce_add_ps(a0);
  }
}
#endif  // KVTIER_X86

struct Kernels {
  void (*half_to_float)(const void*, float*, size_t) = HalfToFloatScalar;
  void (*bfloat_to_float)(const void*, float*, size_t) = BfloatToFloatScalar;
  void (*float_to_half)(const float*, uint16_t*, size_t) = FloatToHalfScalar;
  void (*dot_rows_half)(const uint16_t*, size_t, size_t, const float*, float*) = DotRowsHalfScalar;
  void (*dot_rows_int8)(const int8_t*, size_t, size_t, size_t, const float*,
                        float*) = DotRowsInt8Scalar;
  float (*sum_exp_below)(const float*, size_t, float, float) = SumExpBelowScalar;
  float (*dot)(const float*, const float*, size_t) = DotScalar;
  absl::string_view isa = "scalar";
};

Kernels Detect() {
  Kernels k;
#ifdef KVTIER_X86
  if (CpuFeatures().avx2) {
    k.half_to_float = HalfToFloatAvx2;
    k.bfloat_to_float = BfloatToFloatAvx2;
    k.float_to_half = FloatToHalfAvx2;
    k.dot_rows_half = DotRowsHalfAvx2;
    k.dot_rows_int8 = DotRowsInt8Avx2;
    k.sum_exp_below = SumExpBelowAvx2;
    k.dot = DotAvx2;
    k.isa = "avx2";
    if (CpuFeatures().avx512) {
      k.half_to_float = HalfToFloatAvx512;
      k.dot_rows_half = DotRowsHalfAvx512;
      k.isa = "avx512";
    }
  }
#endif
  return k;
}

const Kernels& Active() {
  static const Kernels kernels = Detect();
  return kernels;
}

}  // namespace

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in binary32.
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(v));
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t FloatToHalf(float value) {
  const uint32_t x = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN (NaN stays quiet NaN)
    return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u);
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504
  if (abs < 0x38800000u) {
    // Below the smallest normal (2^-14): the subnormal count is v * 2^24,
    // which is exact in binary32; rint rounds it to nearest even.
    const float scaled = std::bit_cast<float>(abs) * 16777216.0f;
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  const uint32_t mant = abs & 0x7fffffu;
  uint32_t h = (((abs >> 23) - 112) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry is correct
  return sign | static_cast<uint16_t>(h);
}

float BfloatToFloat(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

void HalfToFloatN(const void* src, float* dst, size_t n) { Active().half_to_float(src, dst, n); }

void BfloatToFloatN(const void* src, float* dst, size_t n) {
  Active().bfloat_to_float(src, dst, n);
}

void FloatToHalfN(const float* src, uint16_t* dst, size_t n) {
  Active().float_to_half(src, dst, n);
}

void DotRowsHalf(const uint16_t* rows, size_t nrows, size_t dim, const float* q, float* out) {
  Active().dot_rows_half(rows, nrows, dim, q, out);
}

void DotRowsInt8(const int8_t* rows, size_t nrows, size_t stride, size_t dim, const float* q,
                 float* out) {
  Active().dot_rows_int8(rows, nrows, stride, dim, q, out);
}

float SumExpBelow(const float* x, size_t n, float scale, float shift) {
  return Active().sum_exp_below(x, n, scale, shift);
}

float Dot(const float* a, const float* b, size_t n) { return Active().dot(a, b, n); }

absl::string_view ActiveIsa() { return Active().isa; }

}  // namespace kvtier::index::simd
