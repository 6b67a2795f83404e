// The CPU references must be right before kernels are judged against them.
#include "tests/gpu/kernel_reference.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/half.h"

namespace kvtier::gpu::testing {
namespace {

TEST(HalfTest, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f = HalfToFloat(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), h) << "bits " << bits;
  }
}

TEST(HalfTest, KnownValuesAndRounding) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // rounds up to Inf
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -26)), 0x0000);  // below half the smallest
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
}

TEST(HalfTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // tie -> even
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
}

TEST(PoolKeysReferenceTest, HandComputedBlock) {
  // L=2, H=2, T=2, D=2, fp32. Keys of (l, h, t) = {l*10 + h*2 + t, -(that)}.
  KvBlockShape shape{2, 2, 2, 2, ElementType::kFp32};
  std::vector<float> block(shape.BlockElements(), 1000.0f);  // values are 1000
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) {
      for (int t = 0; t < 2; ++t) {
        const float x = static_cast<float>(l * 10 + h * 2 + t);
        block[shape.KeyIndex(l, h, t, 0)] = x;
        block[shape.KeyIndex(l, h, t, 1)] = -x;
      }
    }
  }
  const std::vector<float> weights = {1.0f, 3.0f, 0.0f, 0.0f};  // only layer 0
  PoolReference ref = PoolKeysReference(shape, block.data(), weights);
  // Layer 0 keys 0,1,2,3; layer 1 keys 10,11,12,13.
  EXPECT_FLOAT_EQ(ref.mean[0], 6.5f);
  EXPECT_FLOAT_EQ(ref.mean[1], -6.5f);
  EXPECT_FLOAT_EQ(ref.layer_mean[0], 1.5f);
  EXPECT_FLOAT_EQ(ref.layer_mean[2], 11.5f);
  EXPECT_FLOAT_EQ(ref.min[0], 0.0f);
  EXPECT_FLOAT_EQ(ref.max[0], 13.0f);
  EXPECT_FLOAT_EQ(ref.min[1], -13.0f);
  EXPECT_FLOAT_EQ(ref.layer_max[2], 13.0f);
  EXPECT_FLOAT_EQ(ref.layer_min[3], -13.0f);
  // (1 * mean(0,1) + 3 * mean(2,3)) / 4 = (0.5 + 7.5) / 4.
  EXPECT_FLOAT_EQ(ref.weighted_mean[0], 2.0f);
  EXPECT_FALSE(ref.nonfinite);

  block[shape.KeyIndex(1, 1, 1, 1)] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(PoolKeysReference(shape, block.data(), {}).nonfinite);
}

TEST(ScoreReferenceTest, CosineAndDot) {
  const std::vector<float> levels = {1,  0, 9,   // row 0 (stride 3, dim 2)
                                     0,  2, 9,   // row 1: orthogonal to anchor 0
                                     -3, 0, 9,   // row 2: opposite
                                     0,  0, 9};  // row 3: zero vector
  const std::vector<float> anchors = {2, 0, 1, 1};
  auto cos = ScoreReference(levels.data(), ElementType::kFp32, 4, 3, 2, anchors, 2,
                            ScoreKind::kCosineUnit);
  EXPECT_FLOAT_EQ(cos[0], 1.0f);
  EXPECT_FLOAT_EQ(cos[1], 0.5f);
  EXPECT_FLOAT_EQ(cos[2], 0.0f);
  EXPECT_FLOAT_EQ(cos[3], 0.5f);
  EXPECT_NEAR(cos[4 + 1], 0.5 * (1 + 1 / std::sqrt(2.0)), 1e-6);
  auto dot =
      ScoreReference(levels.data(), ElementType::kFp32, 4, 3, 2, anchors, 2, ScoreKind::kDot);
  EXPECT_FLOAT_EQ(dot[0], 2.0f);
  EXPECT_FLOAT_EQ(dot[2], -6.0f);
  EXPECT_FLOAT_EQ(dot[4 + 1], 2.0f);
}

// The GPU kernels follow the same rule (kernel_shapes.h): any NaN or Inf
// element of a row or an anchor makes that score NaN, for both kinds.
TEST(ScoreReferenceTest, NonFiniteRowsAndAnchorsScoreNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> levels = {1,    0,    // row 0: finite
                                     inf,  0,    // row 1: Inf
                                     0,    nan,  // row 2: NaN
                                     -inf, 1};   // row 3: -Inf
  for (ScoreKind kind : {ScoreKind::kCosineUnit, ScoreKind::kDot}) {
    auto scores = ScoreReference(levels.data(), ElementType::kFp32, 4, 2, 2, {1, 0}, 1, kind);
    EXPECT_FALSE(std::isnan(scores[0]));
    EXPECT_TRUE(std::isnan(scores[1]));
    EXPECT_TRUE(std::isnan(scores[2]));
    EXPECT_TRUE(std::isnan(scores[3]));
    scores = ScoreReference(levels.data(), ElementType::kFp32, 4, 2, 2, {inf, 0}, 1, kind);
    EXPECT_TRUE(std::isnan(scores[0])) << "a non-finite anchor";
  }
}

TEST(ScoreSegmentsReferenceTest, StacksSegmentsWithTheirOwnAnchors) {
  const std::vector<uint16_t> a = {FloatToHalf(1), FloatToHalf(2),      // row 0
                                   FloatToHalf(-1), FloatToHalf(0.5)};  // row 1
  const std::vector<uint16_t> b = {FloatToHalf(3), FloatToHalf(0)};
  const std::vector<float> anchors = {1, 1,   // anchor 0
                                      0, 2};  // anchor 1
  const auto scores = ScoreSegmentsReference({{a.data(), 2, 1}, {b.data(), 1, 0}}, anchors, 2);
  EXPECT_EQ(scores, (std::vector<float>{4.0f, 1.0f, 3.0f}));
}

TEST(TopKReferenceTest, DescendingWithTiesByRowAndNanLast) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> scores = {0.5f, nan,  0.9f, 0.5f, -1.0f,  // anchor 0
                                     1.0f, 2.0f, 3.0f, 4.0f, 5.0f};  // anchor 1
  TopKReference ref = TopKReferenceSelect(scores, 5, 2, 4);
  EXPECT_EQ(ref.indices, (std::vector<int32_t>{2, 0, 3, 4, 4, 3, 2, 1}));  // rows per anchor
  EXPECT_EQ(ref.values[0], 0.9f);
  EXPECT_EQ(ref.values[3], -1.0f);
  ref = TopKReferenceSelect(scores, 5, 2, 5);
  EXPECT_EQ(ref.indices[4], 1);  // NaN comes last
  // -0.0 and +0.0 tie, so the lower row wins.
  ref = TopKReferenceSelect({0.0f, -0.0f, -0.0f, 0.0f}, 4, 1, 2);
  EXPECT_EQ(ref.indices, (std::vector<int32_t>{0, 1}));
}

}  // namespace
}  // namespace kvtier::gpu::testing
