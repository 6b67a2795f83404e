// The CPU reference must be right before the kernel is judged against it.
#include "tests/gpu/kernel_reference.h"

#include <cmath>
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

TEST(ScoreSegmentsReferenceTest, StacksSegmentsWithTheirOwnAnchors) {
  const std::vector<uint16_t> a = {FloatToHalf(1), FloatToHalf(2),      // row 0
                                   FloatToHalf(-1), FloatToHalf(0.5)};  // row 1
  const std::vector<uint16_t> b = {FloatToHalf(3), FloatToHalf(0)};
  const std::vector<float> anchors = {1, 1,   // anchor 0
                                      0, 2};  // anchor 1
  const auto scores = ScoreSegmentsReference({{a.data(), 2, 1}, {b.data(), 1, 0}}, anchors, 2);
  EXPECT_EQ(scores, (std::vector<float>{4.0f, 1.0f, 3.0f}));
}

}  // namespace
}  // namespace kvtier::gpu::testing
