#include "index/q8_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define KVTIER_X86 1
#endif

namespace kvtier::index {
namespace {

// Quantises x[0, dim) to integers in [-levels, levels] into out. Returns
// the scale; sets the source's L1 and L2 norms and the L2 norm of the
// quantisation error x - scale * out (each rounded up).
template <typename Int>
float Quantise(const float* x, int32_t dim, float levels, Int* out, Norms* n) {
  float max_abs = 0.0f;
  double norm1 = 0.0, norm2 = 0.0;
  for (int32_t d = 0; d < dim; ++d) {
    max_abs = std::max(max_abs, std::fabs(x[d]));
    norm1 += std::fabs(x[d]);
    norm2 += static_cast<double>(x[d]) * x[d];
  }
  // Rounded up a little: every bound built on these stays a bound.
  constexpr double kUp = 1.0 + 0x1p-20;
  n->l1 = static_cast<float>(norm1 * kUp);
  n->l2 = static_cast<float>(std::sqrt(norm2) * kUp);
  n->err2 = 0.0f;
  if (max_abs == 0.0f) {
    std::fill(out, out + dim, Int{0});
    return 0.0f;
  }
  const float scale = max_abs / levels;
  const float inv = levels / max_abs;
  double err2 = 0.0;
  for (int32_t d = 0; d < dim; ++d) {
    const float v = std::clamp(std::nearbyint(x[d] * inv), -levels, levels);
    out[d] = static_cast<Int>(v);
    const double e = static_cast<double>(x[d]) - static_cast<double>(scale) * v;
    err2 += e * e;
  }
  n->err2 = static_cast<float>(std::sqrt(err2) * kUp);
  return scale;
}

// Row values in [-127, 127]; query values in [-kQueryLevels, kQueryLevels],
// so a sum over 4096 products stays within int32.
constexpr float kRowLevels = 127.0f;
constexpr float kQueryLevels = 2047.0f;

using Kernel = void (*)(const int8_t* rows, int64_t count, int32_t dim, const int16_t* q,
                        int32_t* acc);

// acc[r] = sum_d q[d] * rows[r][d].
void SumsScalar(const int8_t* rows, int64_t count, int32_t dim, const int16_t* q, int32_t* acc) {
  for (int64_t r = 0; r < count; ++r) {
    const int8_t* x = rows + r * dim;
    int32_t s = 0;
    for (int32_t d = 0; d < dim; ++d) s += int32_t{q[d]} * int32_t{x[d]};
    acc[r] = s;
  }
}

#ifdef KVTIER_X86
__attribute__((target("avx2"))) void SumsAvx2(const int8_t* rows, int64_t count, int32_t dim,
                                              const int16_t* q, int32_t* acc) {
  const int32_t body = dim & ~15;
  for (int64_t r = 0; r < count; ++r) {
    const int8_t* x = rows + r * dim;
    __m256i a = _mm256_setzero_si256();
    for (int32_t d = 0; d < body; d += 16) {
      const __m256i xv =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + d)));
      const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + d));
      a = _mm256_add_epi32(a, _mm256_madd_epi16(xv, qv));
    }
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    int32_t s = _mm_cvtsi128_si32(h);
    for (int32_t d = body; d < dim; ++d) s += int32_t{q[d]} * int32_t{x[d]};
    acc[r] = s;
  }
}

#define KVTIER_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

KVTIER_VNNI inline __m512i Widen(const int8_t* p) {
  return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

KVTIER_VNNI inline __m512i WidenMasked(const int8_t* p, __mmask32 m) {
  return _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, p));
}

// vpdpwssd: 32 pairs of 16-bit products per instruction, rows widened from
// int8.
KVTIER_VNNI void SumsVnni(const int8_t* rows, int64_t count, int32_t dim, const int16_t* q,
                          int32_t* acc) {
  const int32_t body = dim & ~31;
  const int32_t tail = dim - body;
  const __mmask32 m = tail == 0 ? 0 : static_cast<__mmask32>((uint64_t{1} << tail) - 1);
  const __m512i qt = _mm512_maskz_loadu_epi16(m, q + body);
  int64_t r = 0;
  for (; r + 4 <= count; r += 4) {
    const int8_t* x = rows + r * dim;
    __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
    __m512i a2 = _mm512_setzero_si512(), a3 = _mm512_setzero_si512();
    for (int32_t d = 0; d < body; d += 32) {
      const __m512i qv = _mm512_loadu_si512(q + d);
      a0 = _mm512_dpwssd_epi32(a0, qv, Widen(x + d));
      a1 = _mm512_dpwssd_epi32(a1, qv, Widen(x + dim + d));
      a2 = _mm512_dpwssd_epi32(a2, qv, Widen(x + 2 * dim + d));
      a3 = _mm512_dpwssd_epi32(a3, qv, Widen(x + 3 * dim + d));
    }
    if (tail != 0) {
      a0 = _mm512_dpwssd_epi32(a0, qt, WidenMasked(x + body, m));
      a1 = _mm512_dpwssd_epi32(a1, qt, WidenMasked(x + dim + body, m));
      a2 = _mm512_dpwssd_epi32(a2, qt, WidenMasked(x + 2 * dim + body, m));
      a3 = _mm512_dpwssd_epi32(a3, qt, WidenMasked(x + 3 * dim + body, m));
    }
    acc[r + 0] = _mm512_reduce_add_epi32(a0);
    acc[r + 1] = _mm512_reduce_add_epi32(a1);
    acc[r + 2] = _mm512_reduce_add_epi32(a2);
    acc[r + 3] = _mm512_reduce_add_epi32(a3);
  }
  for (; r < count; ++r) {
    const int8_t* x = rows + r * dim;
    __m512i a0 = _mm512_setzero_si512();
    for (int32_t d = 0; d < body; d += 32) {
      a0 = _mm512_dpwssd_epi32(a0, _mm512_loadu_si512(q + d), Widen(x + d));
    }
    if (tail != 0) a0 = _mm512_dpwssd_epi32(a0, qt, WidenMasked(x + body, m));
    acc[r] = _mm512_reduce_add_epi32(a0);
  }
}
#endif  // KVTIER_X86

struct Active {
  Kernel kernel = SumsScalar;
  absl::string_view isa = "scalar";
};

Active Detect() {
  Active a;
#ifdef KVTIER_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) {
    a = {SumsAvx2, "avx2"};
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")) {
      a = {SumsVnni, "avx512vnni"};
    }
  }
#endif
  return a;
}

const Active& Kernels() {
  static const Active active = Detect();
  return active;
}

}  // namespace

void Q8Rows::Append(const float* x) {
  const size_t at = values_.size();
  values_.resize(at + dim_);
  Norms n;
  scale_.push_back(Quantise(x, dim_, kRowLevels, values_.data() + at, &n));
  norms_.push_back(n);
}

void Q8Rows::Clear() {
  values_.clear();
  scale_.clear();
  norms_.clear();
}

void Q8Rows::Reserve(int64_t rows) {
  values_.reserve(static_cast<size_t>(rows) * dim_);
  scale_.reserve(rows);
  norms_.reserve(rows);
}

size_t Q8Rows::MemoryBytes() const {
  return values_.capacity() + scale_.capacity() * sizeof(float) + norms_.capacity() * sizeof(Norms);
}

void Q8Query::Set(const float* q, int32_t dim) {
  dim_ = dim;
  values_.resize(dim);
  scale_ = Quantise(q, dim, kQueryLevels, values_.data(), &norms_);
}

void DotRowsQ8(const Q8Rows& rows, int64_t first, int64_t count, const Q8Query& q, float* dot,
               float* bound) {
  const int32_t dim = rows.dim();
  // See the header: the quantisation error, the reference's fp32 rounding
  // ((dim + 8) 2^-23 sum |a x| <= (dim + 8) 2^-23 |a|_1 128 s_r), and this
  // function's own rounding (the integer sum converts to float with a
  // relative error of 2^-24 when it exceeds 2^24).
  const float sa = q.scale();
  const Norms& na = q.norms();
  const float ref = static_cast<float>(dim + 8) * 0x1p-23f * 128.0f * na.l1;
  const float quarter_dim = 0.25f * static_cast<float>(dim);
  constexpr int64_t kStep = 64;
  int32_t acc[kStep];
  for (int64_t at = 0; at < count; at += kStep) {
    const int64_t n = std::min(kStep, count - at);
    const int64_t r0 = first + at;
    Kernels().kernel(rows.row(r0), n, dim, q.values(), acc);
    for (int64_t i = 0; i < n; ++i) {
      const float sr = rows.scale(r0 + i);
      const Norms& nr = rows.norms(r0 + i);
      const float d = sa * sr * static_cast<float>(acc[i]);
      const float b = std::min(0.5f * sr * na.l1, na.l2 * nr.err2) +
                      std::min(0.5f * sa * nr.l1, na.err2 * nr.l2) +
                      std::min(quarter_dim * sa * sr, na.err2 * nr.err2) + ref * sr +
                      0x1p-20f * std::fabs(d);
      dot[at + i] = d;
      bound[at + i] = b * (1.0f + 0x1p-18f);
    }
  }
}

absl::string_view Q8Isa() { return Kernels().isa; }

}  // namespace kvtier::index
