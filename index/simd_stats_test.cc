// The key-statistics kernels (simd.h): the active path (AVX2 where the CPU
// has it) equals the portable one bit for bit, and both agree with a direct
// computation in double.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "index/simd.h"

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
      EXPECT_EQ(std::memcmp(&got, &portable, sizeof(float)), 0) << got << " vs " << portable;
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

}  // namespace
}  // namespace kvtier::index::simd
