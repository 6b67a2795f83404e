#include "index/kernels/int8_dot.h"

#include <atomic>

#include "index/kernels/cpu_features.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define KVTIER_X86 1
#endif

namespace kvtier::index {
namespace {

using Kernel = void (*)(const int8_t* rows, int64_t count, size_t stride, int32_t dim,
                        const int8_t* q, int32_t* out);

void DotPortable(const int8_t* rows, int64_t count, size_t stride, int32_t dim, const int8_t* q,
                 int32_t* out) {
  for (int64_t r = 0; r < count; ++r) {
    const int8_t* x = rows + static_cast<size_t>(r) * stride;
    int32_t s = 0;
    for (int32_t d = 0; d < dim; ++d) s += int32_t{q[d]} * int32_t{x[d]};
    out[r] = s;
  }
}

#ifdef KVTIER_X86
#define KVTIER_AVX2_S8 __attribute__((target("avx2")))

KVTIER_AVX2_S8 inline int32_t HorizontalSum(__m256i a) {
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
  return _mm_cvtsi128_si32(h);
}

// |q| (unsigned) times the row with q's sign applied (signed): the same
// products as q * x, and each pair sum stays within int16.
KVTIER_AVX2_S8 void DotAvx2(const int8_t* rows, int64_t count, size_t stride, int32_t dim,
                            const int8_t* q, int32_t* out) {
  const int32_t body = dim & ~31;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t r = 0; r < count; ++r) {
    const int8_t* x = rows + static_cast<size_t>(r) * stride;
    __m256i acc = _mm256_setzero_si256();
    for (int32_t d = 0; d < body; d += 32) {
      const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + d));
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + d));
      const __m256i prod = _mm256_maddubs_epi16(_mm256_abs_epi8(qv), _mm256_sign_epi8(xv, qv));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(prod, ones));
    }
    int32_t s = HorizontalSum(acc);
    for (int32_t d = body; d < dim; ++d) s += int32_t{q[d]} * int32_t{x[d]};
    out[r] = s;
  }
}

#define KVTIER_VNNI_S8 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

// vpdpbusd multiplies unsigned bytes by signed ones: with x' = x + 128
// (x ^ 0x80), sum q * x = sum q * x' - 128 * sum q.
KVTIER_VNNI_S8 void DotVnni(const int8_t* rows, int64_t count, size_t stride, int32_t dim,
                            const int8_t* q, int32_t* out) {
  const int32_t body = dim & ~63;
  const int32_t tail = dim - body;
  const __mmask64 m = tail == 0 ? 0 : (~uint64_t{0} >> (64 - tail));
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  int32_t qsum = 0;
  for (int32_t d = 0; d < dim; ++d) qsum += q[d];
  const int32_t bias = 128 * qsum;
  const __m512i qt = _mm512_maskz_loadu_epi8(m, q + body);
  int64_t r = 0;
  for (; r + 4 <= count; r += 4) {
    const int8_t* x = rows + static_cast<size_t>(r) * stride;
    __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
    __m512i a2 = _mm512_setzero_si512(), a3 = _mm512_setzero_si512();
    for (int32_t d = 0; d < body; d += 64) {
      const __m512i qv = _mm512_loadu_si512(q + d);
      a0 = _mm512_dpbusd_epi32(a0, _mm512_xor_si512(_mm512_loadu_si512(x + d), flip), qv);
      a1 = _mm512_dpbusd_epi32(a1, _mm512_xor_si512(_mm512_loadu_si512(x + stride + d), flip), qv);
      a2 = _mm512_dpbusd_epi32(a2, _mm512_xor_si512(_mm512_loadu_si512(x + 2 * stride + d), flip),
                               qv);
      a3 = _mm512_dpbusd_epi32(a3, _mm512_xor_si512(_mm512_loadu_si512(x + 3 * stride + d), flip),
                               qv);
    }
    if (tail != 0) {
      // Masked-off bytes load as 0 and become 128 after the flip; q is 0
      // there, so they add nothing.
      a0 =
          _mm512_dpbusd_epi32(a0, _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, x + body), flip), qt);
      a1 = _mm512_dpbusd_epi32(
          a1, _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, x + stride + body), flip), qt);
      a2 = _mm512_dpbusd_epi32(
          a2, _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, x + 2 * stride + body), flip), qt);
      a3 = _mm512_dpbusd_epi32(
          a3, _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, x + 3 * stride + body), flip), qt);
    }
    // The four horizontal sums at once: interleave, add, then fold the
    // four 128-bit lanes (cheaper than four reductions).
    const __m512i s01 =
        _mm512_add_epi32(_mm512_unpacklo_epi32(a0, a1), _mm512_unpackhi_epi32(a0, a1));
    const __m512i s23 =
        _mm512_add_epi32(_mm512_unpacklo_epi32(a2, a3), _mm512_unpackhi_epi32(a2, a3));
    const __m512i s =
        _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
    const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
    const __m128i q4 = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + r), _mm_sub_epi32(q4, _mm_set1_epi32(bias)));
  }
  for (; r < count; ++r) {
    const int8_t* x = rows + static_cast<size_t>(r) * stride;
    __m512i a0 = _mm512_setzero_si512();
    for (int32_t d = 0; d < body; d += 64) {
      a0 = _mm512_dpbusd_epi32(a0, _mm512_xor_si512(_mm512_loadu_si512(x + d), flip),
                               _mm512_loadu_si512(q + d));
    }
    if (tail != 0) {
      a0 =
          _mm512_dpbusd_epi32(a0, _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, x + body), flip), qt);
    }
    out[r] = _mm512_reduce_add_epi32(a0) - bias;
  }
}
#endif  // KVTIER_X86

struct Choice {
  Kernel kernel;
  absl::string_view isa;
};

bool Supported(absl::string_view isa) {
  if (isa == "portable") return true;
#ifdef KVTIER_X86
  if (isa == "avx2") return CpuFeatures().avx2;
  if (isa == "avx512vnni") return CpuFeatures().avx512vnni;
#endif
  return false;
}

Choice ChoiceOf(absl::string_view isa) {
#ifdef KVTIER_X86
  if (isa == "avx512vnni") return {DotVnni, "avx512vnni"};
  if (isa == "avx2") return {DotAvx2, "avx2"};
#endif
  return {DotPortable, "portable"};
}

Choice Detect() {
  for (absl::string_view isa : {"avx512vnni", "avx2"}) {
    if (Supported(isa)) return ChoiceOf(isa);
  }
  return ChoiceOf("portable");
}

std::atomic<const Choice*>& Active() {
  static const Choice detected = Detect();
  static std::atomic<const Choice*> active{&detected};
  return active;
}

}  // namespace

void DotRowsS8(const int8_t* rows, int64_t count, size_t stride, int32_t dim, const int8_t* q,
               int32_t* out) {
  Active().load(std::memory_order_relaxed)->kernel(rows, count, stride, dim, q, out);
}

absl::string_view Int8DotIsa() { return Active().load(std::memory_order_relaxed)->isa; }

bool SetInt8DotIsaForTest(absl::string_view isa) {
  static const Choice detected = Detect();
  static const Choice vnni = ChoiceOf("avx512vnni");
  static const Choice avx2 = ChoiceOf("avx2");
  static const Choice portable = ChoiceOf("portable");
  const Choice* c = isa.empty()           ? &detected
                    : isa == "avx512vnni" ? &vnni
                    : isa == "avx2"       ? &avx2
                    : isa == "portable"   ? &portable
                                          : nullptr;
  if (c == nullptr || (!isa.empty() && !Supported(isa))) return false;
  Active().store(c, std::memory_order_relaxed);
  return true;
}

}  // namespace kvtier::index
