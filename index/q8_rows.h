// Int8 rows with per-row scales, scored with a per-row error bound, so a
// caller can score many rows cheaply and re-score exactly only the rows the
// bound leaves undecided (the Selector's page level, selector.cc).
//
// Row r of Q8Rows holds q_r[d] = round(x_r[d] / s_r) in [-127, 127] with
// s_r = max_d |x_r[d]| / 127 (0 for a zero row), the source row's norms
// |x_r|_1, |x_r|_2, the norm of its quantisation error
// |e_r|_2 = |x_r - s_r q_r|_2. A query a is quantised the same way but to
// 12 bits (Q8Query: q_a in [-2047, 2047], s_a = max |a| / 2047, its norms),
// so its share of the error is 16x smaller. DotRowsQ8 returns
//
//   dot_r   = s_a * s_r * sum_d q_a[d] q_r[d]      (integer sum, exact)
//   bound_r = min(s_r |a|_1 / 2, |a|_2 |e_r|_2)
//           + min(s_a |x_r|_1 / 2, |e_a|_2 |x_r|_2)
//           + min(dim s_a s_r / 4, |e_a|_2 |e_r|_2) + slack_r
//
// and guarantees |a . x_r - dot_r| <= bound_r, where a . x_r is the real
// dot product of the float rows given to Append and the float query given
// to Q8Query::Set, and also any fp32 evaluation of it whose rounding error
// is at most (dim + 8) * 2^-23 * sum_d |a[d] x_r[d]| (simd::DotRowsHalf's
// is, for rows of at most 4096 values): slack_r covers that and the
// rounding of dot_r and bound_r themselves. With quantisation errors e
// e_x = x - s_r q_x (|e_x[d]| <= s_r / 2), e_a likewise,
// a . x - s_a s_r q_a . q_x = a . e_x + e_a . x - e_a . e_x, each term
// bounded by Hoelder (L1 x max) or Cauchy-Schwarz, whichever is smaller.
//
// Kernels (chosen once at run time): AVX-512 VNNI (vpdpwssd on rows
// widened to 16 bits), AVX2 (16-bit multiply-adds), scalar. All give the
// same integer sums (|sum| < 2^31 for dim <= 4096), so the same dot_r and
// bound_r on every CPU.
//
// Thread safety: Q8Rows and Q8Query are not synchronised (one writer, or
// any number of readers); DotRowsQ8 is thread-safe for const inputs.
#ifndef KVTIER_INDEX_Q8_ROWS_H_
#define KVTIER_INDEX_Q8_ROWS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"

namespace kvtier::index {

// Norms of a quantised vector x: |x|_1, |x|_2 and |x - s q|_2 (each
// rounded up).
struct Norms {
  float l1 = 0.0f, l2 = 0.0f, err2 = 0.0f;
};

class Q8Rows {
 public:
  // dim in [1, 4096].
  explicit Q8Rows(int32_t dim) : dim_(dim) {}

  // Appends one row of dim finite floats.
  void Append(const float* x);
  void Clear();
  void Reserve(int64_t rows);

  int32_t dim() const { return dim_; }
  int64_t size() const { return static_cast<int64_t>(scale_.size()); }
  const int8_t* row(int64_t r) const { return values_.data() + r * dim_; }
  float scale(int64_t r) const { return scale_[r]; }
  const Norms& norms(int64_t r) const { return norms_[r]; }

  // Bytes held (capacity of the arrays).
  size_t MemoryBytes() const;

 private:
  int32_t dim_;
  std::vector<int8_t> values_;  // [rows][dim]
  std::vector<float> scale_;
  std::vector<Norms> norms_;
};

// A query quantised for DotRowsQ8. Set reuses the storage: no allocation
// once a query of the same dim was set.
class Q8Query {
 public:
  // q: dim finite floats, dim in [1, 4096].
  void Set(const float* q, int32_t dim);

  int32_t dim() const { return dim_; }
  float scale() const { return scale_; }
  const Norms& norms() const { return norms_; }
  const int16_t* values() const { return values_.data(); }

 private:
  int32_t dim_ = 0;
  float scale_ = 0.0f;
  Norms norms_;
  std::vector<int16_t> values_;  // [dim]
};

// For r in [first, first + count): dot[r - first] and bound[r - first] as
// above. rows.dim() must equal q.dim().
void DotRowsQ8(const Q8Rows& rows, int64_t first, int64_t count, const Q8Query& q, float* dot,
               float* bound);

// "avx512vnni", "avx2" or "scalar": the kernel DotRowsQ8 runs.
absl::string_view Q8Isa();

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_Q8_ROWS_H_
