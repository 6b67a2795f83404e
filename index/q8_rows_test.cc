#include "index/q8_rows.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "index/simd.h"

namespace kvtier::index {
namespace {

// Rows as the tree stores them: rounded to fp16, then read back.
std::vector<float> HalfRounded(const std::vector<float>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = simd::HalfToFloat(simd::FloatToHalf(x[i]));
  return out;
}

std::vector<float> Random(std::mt19937_64& rng, int32_t n, int kind) {
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (int32_t d = 0; d < n; ++d) {
    switch (kind) {
      case 0:
        v[d] = normal(rng);
        break;
      case 1:
        v[d] = uniform(rng);
        break;
      case 2:
        v[d] = d % 7 == 0 ? 40.0f * normal(rng) : 0.01f * normal(rng);
        break;  // outliers
      default:
        v[d] = 1.0f + 0.001f * normal(rng);
        break;  // shared direction
    }
  }
  double norm = 0;
  for (float x : v) norm += double{x} * x;
  for (float& x : v) x = static_cast<float>(x / std::sqrt(norm));
  return v;
}

// The bound holds against the real dot product and against DotRowsHalf (the
// exact path it stands in for), for every dim shape the kernels split on.
TEST(Q8RowsTest, BoundHoldsAgainstRealAndFp16DotProducts) {
  std::mt19937_64 rng(7);
  for (int32_t dim : {1, 15, 16, 63, 64, 65, 100, 128, 129, 256, 300}) {
    for (int kind = 0; kind < 4; ++kind) {
      constexpr int kRows = 37;
      Q8Rows rows(dim);
      std::vector<float> flat;
      std::vector<uint16_t> half;
      for (int r = 0; r < kRows; ++r) {
        const std::vector<float> x = HalfRounded(Random(rng, dim, (kind + r) % 4));
        rows.Append(x.data());
        flat.insert(flat.end(), x.begin(), x.end());
        for (float v : x) half.push_back(simd::FloatToHalf(v));
      }
      ASSERT_EQ(rows.size(), kRows);
      for (int t = 0; t < 5; ++t) {
        const std::vector<float> a = Random(rng, dim, (kind + t) % 4);
        Q8Query q;
        q.Set(a.data(), dim);
        std::vector<float> dot(kRows), bound(kRows), ref(kRows);
        DotRowsQ8(rows, 0, kRows, q, dot.data(), bound.data());
        simd::DotRowsHalf(half.data(), kRows, dim, a.data(), ref.data());
        for (int r = 0; r < kRows; ++r) {
          double real = 0;
          for (int32_t d = 0; d < dim; ++d) real += double{a[d]} * flat[r * dim + d];
          EXPECT_LE(std::fabs(real - dot[r]), bound[r]) << "dim " << dim << " row " << r;
          EXPECT_LE(std::fabs(ref[r] - dot[r]), bound[r]) << "dim " << dim << " row " << r;
          // Not vacuous: unit vectors give bounds far below the range of
          // cosines (2).
          EXPECT_LT(bound[r], 0.1f) << "dim " << dim;
        }
        // A sub-range gives the same values as the whole.
        std::vector<float> dot2(kRows), bound2(kRows);
        DotRowsQ8(rows, 5, kRows - 5, q, dot2.data(), bound2.data());
        for (int r = 5; r < kRows; ++r) {
          EXPECT_EQ(dot2[r - 5], dot[r]);
          EXPECT_EQ(bound2[r - 5], bound[r]);
        }
      }
    }
  }
}

// The kernel's integer sum equals a plain one: every ISA gives the same
// dot products.
TEST(Q8RowsTest, KernelMatchesIntegerReference) {
  std::mt19937_64 rng(11);
  for (int32_t dim : {7, 64, 128, 200}) {
    Q8Rows rows(dim);
    for (int r = 0; r < 70; ++r) rows.Append(Random(rng, dim, r % 4).data());
    const std::vector<float> a = Random(rng, dim, 0);
    Q8Query q;
    q.Set(a.data(), dim);
    std::vector<float> dot(70), bound(70);
    DotRowsQ8(rows, 0, 70, q, dot.data(), bound.data());
    for (int r = 0; r < 70; ++r) {
      int64_t s = 0;
      for (int32_t d = 0; d < dim; ++d) s += int64_t{q.values()[d]} * rows.row(r)[d];
      EXPECT_EQ(dot[r], q.scale() * rows.scale(r) * static_cast<float>(s))
          << Q8Isa() << " dim " << dim;
    }
  }
}

TEST(Q8RowsTest, ZeroRowsAndQueriesAreExact) {
  constexpr int32_t kDim = 128;
  Q8Rows rows(kDim);
  std::vector<float> zero(kDim, 0.0f), one(kDim, 0.0f);
  one[3] = 1.0f;
  rows.Append(zero.data());
  rows.Append(one.data());
  Q8Query q;
  q.Set(one.data(), kDim);
  float dot[2], bound[2];
  DotRowsQ8(rows, 0, 2, q, dot, bound);
  EXPECT_EQ(dot[0], 0.0f);
  EXPECT_EQ(bound[0], 0.0f);
  EXPECT_NEAR(dot[1], 1.0f, 1e-6);
  q.Set(zero.data(), kDim);
  DotRowsQ8(rows, 0, 2, q, dot, bound);
  EXPECT_EQ(dot[1], 0.0f);
  EXPECT_EQ(bound[1], 0.0f);
  EXPECT_GE(rows.MemoryBytes(), 2u * (kDim + 16));
}

}  // namespace
}  // namespace kvtier::index
