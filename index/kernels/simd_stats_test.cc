// The key-statistics kernels (simd.h): the active path (AVX2 where the CPU
// has it) equals the portable one bit for bit, and both agree with a direct
// computation in double.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "index/kernels/simd.h"

namespace kvtier::index::simd {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float offset = 0) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(offset, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Dims around the kernels' 8-lane and 32-dim chunk edges.
constexpr size_t kDims[] = {1, 7, 8, 9, 31, 32, 33, 64, 100, 128, 129};
constexpr size_t kRows[] = {1, 3, 16};

TEST(SimdStatsTest, AccumulateRowsEqualsPortableAndDirect) {
  uint32_t seed = 1;
  for (size_t dim : kDims) {
    for (size_t rows : kRows) {
      SCOPED_TRACE(testing::Message() << "dim " << dim << " rows " << rows);
      const std::vector<float> keys = Random(rows * dim, seed++, 0.5f);
      // Start from non-trivial accumulators, as the summary does across heads.
      std::vector<float> sum = Random(dim, seed++), lo = Random(dim, seed++, -3),
                         hi = Random(dim, seed++, 3);
      std::vector<float> sum2 = sum, lo2 = lo, hi2 = hi, only_sum = sum;
      AccumulateRows(keys.data(), rows, dim, sum.data(), lo.data(), hi.data());
      internal::AccumulateRowsPortable(keys.data(), rows, dim, sum2.data(), lo2.data(), hi2.data());
      EXPECT_TRUE(SameBits(sum, sum2));
      EXPECT_TRUE(SameBits(lo, lo2));
      EXPECT_TRUE(SameBits(hi, hi2));
      AccumulateRows(keys.data(), rows, dim, only_sum.data(), nullptr, nullptr);
      EXPECT_TRUE(SameBits(only_sum, sum));
      const std::vector<float> sum0 = Random(dim, seed - 3), lo0 = Random(dim, seed - 2, -3),
                               hi0 = Random(dim, seed - 1, 3);
      for (size_t d = 0; d < dim; ++d) {
        double want = sum0[d];
        float mn = lo0[d], mx = hi0[d];
        for (size_t r = 0; r < rows; ++r) {
          want += keys[r * dim + d];
          mn = std::min(mn, keys[r * dim + d]);
          mx = std::max(mx, keys[r * dim + d]);
        }
        EXPECT_NEAR(sum[d], want, 1e-5 * (1 + std::abs(want)));
        EXPECT_EQ(lo[d], mn);
        EXPECT_EQ(hi[d], mx);
      }
    }
  }
}

TEST(SimdStatsTest, SquaredDeviationsEqualPortableAndDirect) {
  uint32_t seed = 100;
  for (size_t dim : kDims) {
    for (size_t rows : kRows) {
      SCOPED_TRACE(testing::Message() << "dim " << dim << " rows " << rows);
      const std::vector<float> keys = Random(rows * dim, seed++);
      const std::vector<float> center = Random(dim, seed++);
      std::vector<float> acc(dim, 0.0f), acc2(dim, 0.0f);
      AccumulateSquaredDeviations(keys.data(), rows, dim, center.data(), acc.data());
      internal::AccumulateSquaredDeviationsPortable(keys.data(), rows, dim, center.data(),
                                                    acc2.data());
      EXPECT_TRUE(SameBits(acc, acc2));
      for (size_t d = 0; d < dim; ++d) {
        double want = 0;
        for (size_t r = 0; r < rows; ++r) {
          const double dev = double{keys[r * dim + d]} - center[d];
          want += dev * dev;
        }
        EXPECT_NEAR(acc[d], want, 1e-5 * (1 + want));
      }
    }
  }
}

TEST(SimdStatsTest, MaxSquaredDistanceEqualsPortableAndDirect) {
  uint32_t seed = 200;
  for (size_t dim : kDims) {
    for (size_t rows : kRows) {
      SCOPED_TRACE(testing::Message() << "dim " << dim << " rows " << rows);
      const std::vector<float> keys = Random(rows * dim, seed++);
      const std::vector<float> center = Random(dim, seed++);
      const float got = MaxSquaredDistance(keys.data(), rows, dim, center.data());
      const float portable =
          internal::MaxSquaredDistancePortable(keys.data(), rows, dim, center.data());
      EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(portable))
          << got << " vs " << portable;
      double want = 0;
      for (size_t r = 0; r < rows; ++r) {
        double s = 0;
        for (size_t d = 0; d < dim; ++d) {
          const double dev = double{keys[r * dim + d]} - center[d];
          s += dev * dev;
        }
        want = std::max(want, s);
      }
      EXPECT_NEAR(got, want, 1e-5 * (1 + want));
    }
  }
  // No rows: 0.
  EXPECT_EQ(MaxSquaredDistance(nullptr, 0, 4, nullptr), 0.0f);
}

// The per-head fold into the block's double sums: the active path equals
// the portable one bit for bit, equals the element-wise formula, and a null
// term is left alone.
TEST(SimdStatsTest, AddHeadSumsEqualsPortableAndTheFormula) {
  uint32_t seed = 300;
  for (size_t dim : kDims) {
    SCOPED_TRACE(testing::Message() << "dim " << dim);
    const std::vector<float> head = Random(dim, seed++, 3.0f);
    const std::vector<float> start = Random(5 * dim, seed++);
    auto run = [&](bool portable, bool all_terms) {
      std::vector<double> block(start.begin(), start.begin() + dim);
      std::vector<double> layer(start.begin() + dim, start.begin() + 2 * dim);
      std::vector<double> weighted(start.begin() + 2 * dim, start.begin() + 3 * dim);
      std::vector<double> mean(dim, -1.0);
      std::vector<float> mean_f(dim, -1.0f);
      HeadSums out;
      out.block_sum = block.data();
      if (all_terms) {
        out.layer_sum = layer.data();
        out.weighted_sum = weighted.data();
        out.mean = mean.data();
        out.mean_f = mean_f.data();
      }
      if (portable) {
        internal::AddHeadSumsPortable(head.data(), dim, 16.0, 0.75, out);
      } else {
        AddHeadSums(head.data(), dim, 16.0, 0.75, out);
      }
      std::vector<double> all = block;
      all.insert(all.end(), layer.begin(), layer.end());
      all.insert(all.end(), weighted.begin(), weighted.end());
      all.insert(all.end(), mean.begin(), mean.end());
      for (float f : mean_f) all.push_back(f);
      return all;
    };
    const std::vector<double> got = run(false, true);
    const std::vector<double> portable = run(true, true);
    ASSERT_EQ(got.size(), portable.size());
    EXPECT_EQ(std::memcmp(got.data(), portable.data(), got.size() * sizeof(double)), 0);
    for (size_t d = 0; d < dim; ++d) {
      const double x = head[d], m = x / 16.0;
      EXPECT_EQ(got[d], double{start[d]} + x);
      EXPECT_EQ(got[dim + d], double{start[dim + d]} + x);
      EXPECT_EQ(got[2 * dim + d], double{start[2 * dim + d]} + 0.75 * m);
      EXPECT_EQ(got[3 * dim + d], m);
      EXPECT_EQ(got[4 * dim + d], static_cast<float>(m));
    }
    const std::vector<double> block_only = run(false, false);
    for (size_t d = 0; d < dim; ++d) {
      EXPECT_EQ(block_only[d], double{start[d]} + head[d]);
      EXPECT_EQ(block_only[dim + d], start[dim + d]);  // untouched
      EXPECT_EQ(block_only[3 * dim + d], -1.0);
    }
  }
}

}  // namespace
}  // namespace kvtier::index::simd
