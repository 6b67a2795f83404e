#include "client/anchor.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/synthetic.h"

namespace kvtier {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kL = 3, kH = 2, kD = 8, kT = 16;

v1::ModelProfile Profile(v1::DType dtype) {
  v1::ModelProfile p;
  p.set_name("anchor-test");
  p.set_num_layers(kL);
  p.set_num_kv_heads(kH);
  p.set_head_dim(kD);
  p.set_block_size_tokens(kT);
  p.set_dtype(dtype);
  return p;
}

index::BlockLayout Layout(v1::DType dtype) {
  index::BlockLayout l;
  l.num_layers = kL;
  l.num_kv_heads = kH;
  l.head_dim = kD;
  l.block_size_tokens = kT;
  l.dtype = dtype == v1::DTYPE_FP16   ? index::Dtype::kFp16
            : dtype == v1::DTYPE_BF16 ? index::Dtype::kBf16
                                      : index::Dtype::kFp32;
  return l;
}

// keys[l][h][t][d] as stored in the payload.
float Key(const testing::SyntheticPayload& p, uint32_t l, uint32_t h, uint32_t t, uint32_t d) {
  return p.keys[((l * kH + h) * kT + t) * kD + d];
}

class AnchorTest : public ::testing::TestWithParam<v1::DType> {};

// The last 8 tokens: the final 5 of one block and the first 3 of the
// engine's partial block, against the mean computed directly.
TEST_P(AnchorTest, EqualsTheMeanOfTheLastTokensKeys) {
  const testing::SyntheticPayload a = testing::MakeBlockPayload(Layout(GetParam()), 1, {});
  const testing::SyntheticPayload b = testing::MakeBlockPayload(Layout(GetParam()), 2, {});
  AnchorBuilder builder(Profile(GetParam()));
  ASSERT_OK(builder.AddTokens(a.bytes, kT - 5, 5));
  ASSERT_OK(builder.AddTokens(b.bytes, 0, 3));
  EXPECT_EQ(builder.tokens(), 8u);
  absl::StatusOr<std::vector<float>> pooled = builder.Finish(AnchorLayout::kPooled);
  absl::StatusOr<std::vector<float>> layered = builder.Finish(AnchorLayout::kPerLayer);
  ASSERT_OK(pooled) << pooled.status();
  ASSERT_OK(layered) << layered.status();
  ASSERT_EQ(pooled->size(), kD);
  ASSERT_EQ(layered->size(), kL * kD);
  for (uint32_t d = 0; d < kD; ++d) {
    double all = 0;
    for (uint32_t l = 0; l < kL; ++l) {
      double layer = 0;
      for (uint32_t h = 0; h < kH; ++h) {
        for (uint32_t t = kT - 5; t < kT; ++t) layer += Key(a, l, h, t, d);
        for (uint32_t t = 0; t < 3; ++t) layer += Key(b, l, h, t, d);
      }
      EXPECT_NEAR((*layered)[l * kD + d], layer / (kH * 8), 1e-5) << l << "," << d;
      all += layer;
    }
    EXPECT_NEAR((*pooled)[d], all / (kL * kH * 8), 1e-5) << d;
  }
  builder.Reset();
  EXPECT_EQ(builder.Finish(AnchorLayout::kPooled).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AnchorTest,
                         ::testing::Values(v1::DTYPE_FP16, v1::DTYPE_BF16, v1::DTYPE_FP32));

TEST(AnchorBuilderTest, BadInputNamesTheArgument) {
  const testing::SyntheticPayload a = testing::MakeBlockPayload(Layout(v1::DTYPE_FP16), 1, {});
  AnchorBuilder builder(Profile(v1::DTYPE_FP16));
  EXPECT_THAT(std::string(builder.AddTokens(a.bytes.substr(1), 0, 1).message()),
              HasSubstr("block: "));
  EXPECT_THAT(std::string(builder.AddTokens(a.bytes, 10, 7).message()), HasSubstr("first_token"));
  EXPECT_THAT(std::string(builder.AddTokens(a.bytes, 0, 0).message()), HasSubstr("count"));
  AnchorBuilder no_dtype(Profile(v1::DTYPE_UNSPECIFIED));
  EXPECT_THAT(std::string(no_dtype.AddTokens(a.bytes, 0, 1).message()), HasSubstr("dtype"));
  EXPECT_EQ(builder.tokens(), 0u);  // nothing was added
}

TEST(HeadQueriesTest, GathersTheCalibrationsHeadsInOrder) {
  const uint32_t L = 2, Hq = 4, D = 3;
  std::vector<float> q(L * Hq * D);
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(i);
  v1::SelectionCalibration c;
  c.set_num_q_heads(Hq);
  v1::HeadRef* h = c.add_retrieval_heads();
  h->set_layer(1);
  h->set_q_head(2);
  h = c.add_retrieval_heads();
  h->set_layer(0);
  h->set_q_head(3);
  absl::StatusOr<std::vector<float>> out = GatherHeadQueries(q, L, Hq, D, c);
  ASSERT_OK(out);
  EXPECT_EQ(*out, (std::vector<float>{18, 19, 20, 9, 10, 11}));
  EXPECT_THAT(
      std::string(
          GatherHeadQueries(absl::MakeConstSpan(q).subspan(1), L, Hq, D, c).status().message()),
      HasSubstr("queries: 23 values"));
  c.mutable_retrieval_heads(0)->set_layer(2);
  EXPECT_THAT(std::string(GatherHeadQueries(q, L, Hq, D, c).status().message()),
              HasSubstr("calibration.retrieval_heads[0]"));
}

}  // namespace
}  // namespace kvtier
