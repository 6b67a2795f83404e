#include "index/select/scorer.h"

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::index {
namespace {

SummaryView View2(const std::vector<float>& mean, int64_t n) {
  SummaryView v;
  v.dim = 2;
  v.num_blocks = n;
  v.mean = mean.data();
  return v;
}

TEST(ScorerTest, KeyKeyIsCosineMappedToUnitInterval) {
  const std::vector<float> mean = {1, 0, 0, 1, -1, 0, 0, 0, 3, 3};
  const std::vector<float> anchor = {2, 0};
  ScoreInput in;
  in.anchor = anchor;
  std::vector<float> out(5);
  ASSERT_OK(ScoreBlocks(ScorerKind::kKeyKey, View2(mean, 5), in, absl::MakeSpan(out)));
  EXPECT_FLOAT_EQ(out[0], 1.0f);
  EXPECT_FLOAT_EQ(out[1], 0.5f);
  EXPECT_FLOAT_EQ(out[2], 0.0f);
  EXPECT_FLOAT_EQ(out[3], 0.5f);  // zero vector
  EXPECT_NEAR(out[4], 0.5 * (1 + std::sqrt(0.5)), 1e-6);
}

TEST(ScorerTest, WeightedUsesWeightedMean) {
  const std::vector<float> mean = {1, 0};
  const std::vector<float> weighted = {0, 1};
  SummaryView v = View2(mean, 1);
  v.weighted_mean = weighted.data();
  const std::vector<float> anchor = {0, 1};
  ScoreInput in;
  in.anchor = anchor;
  std::vector<float> out(1);
  ASSERT_OK(ScoreBlocks(ScorerKind::kKeyKeyWeighted, v, in, absl::MakeSpan(out)));
  EXPECT_FLOAT_EQ(out[0], 1.0f);
  v.weighted_mean = nullptr;
  absl::Status s = ScoreBlocks(ScorerKind::kKeyKeyWeighted, v, in, absl::MakeSpan(out));
  EXPECT_NE(s.message().find("view.weighted_mean"), std::string::npos);
}

TEST(ScorerTest, QuestBound) {
  const std::vector<float> lo = {-1, -1, 0, 0};
  const std::vector<float> hi = {2, 3, 1, 1};
  SummaryView v;
  v.dim = 2;
  v.num_blocks = 2;
  v.min = lo.data();
  v.max = hi.data();
  const std::vector<float> q = {1, -2};
  ScoreInput in;
  in.query = q;
  std::vector<float> out(2);
  ASSERT_OK(ScoreBlocks(ScorerKind::kQuest, v, in, absl::MakeSpan(out)));
  EXPECT_FLOAT_EQ(out[0], 2.0f + 2.0f);  // max(2,-1) + max(-6, 2)
  EXPECT_FLOAT_EQ(out[1], 1.0f + 0.0f);  // max(1, 0) + max(-2, 0)
  EXPECT_FALSE(ScoresInUnitInterval(ScorerKind::kQuest));
}

TEST(ScorerTest, ArkValeSphereBound) {
  const std::vector<float> mean = {1, 0};
  const std::vector<float> radius = {2};
  SummaryView v = View2(mean, 1);
  v.radius = radius.data();
  const std::vector<float> q = {3, 4};
  ScoreInput in;
  in.query = q;
  std::vector<float> out(1);
  ASSERT_OK(ScoreBlocks(ScorerKind::kArkVale, v, in, absl::MakeSpan(out)));
  EXPECT_FLOAT_EQ(out[0], 3.0f + 5.0f * 2.0f);
}

TEST(ScorerTest, KeyDiffFavoursDistinctBlocks) {
  const std::vector<float> mean = {1, 0, 2, 0, 1, 0, 0, 1};
  std::vector<float> out(4);
  ASSERT_OK(ScoreBlocks(ScorerKind::kKeyDiff, View2(mean, 4), {}, absl::MakeSpan(out)));
  // m = (3, 1): cos to (1,0) = 3/sqrt(10), to (0,1) = 1/sqrt(10).
  EXPECT_NEAR(out[0], 0.5 * (1 - 3 / std::sqrt(10.0)), 1e-6);
  EXPECT_NEAR(out[3], 0.5 * (1 - 1 / std::sqrt(10.0)), 1e-6);
  EXPECT_GT(out[3], out[0]);
}

TEST(ScorerTest, RecencyAndRandom) {
  SummaryView v;
  v.dim = 4;
  v.num_blocks = 4;
  std::vector<float> out(4);
  ASSERT_OK(ScoreBlocks(ScorerKind::kRecency, v, {}, absl::MakeSpan(out)));
  EXPECT_EQ(out, (std::vector<float>{0.25f, 0.5f, 0.75f, 1.0f}));
  ScoreInput in;
  in.seed = 42;
  in.step = 3;
  std::vector<float> a(4), b(4), c(4);
  ASSERT_OK(ScoreBlocks(ScorerKind::kRandom, v, in, absl::MakeSpan(a)));
  ASSERT_OK(ScoreBlocks(ScorerKind::kRandom, v, in, absl::MakeSpan(b)));
  in.step = 4;
  ASSERT_OK(ScoreBlocks(ScorerKind::kRandom, v, in, absl::MakeSpan(c)));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (float x : a) {
    EXPECT_GE(x, 0.0f);
    EXPECT_LT(x, 1.0f);
  }
}

TEST(ScorerTest, NamesParseBack) {
  for (int k = 0; k <= static_cast<int>(ScorerKind::kMass); ++k) {
    const auto kind = static_cast<ScorerKind>(k);
    auto parsed = ParseScorerKind(ScorerName(kind));
    ASSERT_OK(parsed);
    EXPECT_EQ(*parsed, kind);
  }
  EXPECT_FALSE(ParseScorerKind("h2o").ok());
  const std::vector<float> mean = {1, 0};
  const std::vector<float> anchor = {1, 0};
  ScoreInput in;
  in.anchor = anchor;
  std::vector<float> out(1);
  ASSERT_OK(ScoreBlocks(ScorerKind::kKeyKey, View2(mean, 1), in, absl::MakeSpan(out)));
  EXPECT_FLOAT_EQ(out[0], 1.0f);
}

TEST(ScorerTest, BadInputNamesTheField) {
  const std::vector<float> mean = {1, 0};
  std::vector<float> out(1);
  auto run = [&](ScorerKind kind, SummaryView v, const ScoreInput& in, absl::Span<float> o) {
    return std::string(ScoreBlocks(kind, v, in, o).message());
  };
  ScoreInput in;
  const std::vector<float> a3 = {1, 0, 0};
  in.anchor = a3;
  EXPECT_NE(run(ScorerKind::kKeyKey, View2(mean, 1), in, absl::MakeSpan(out))
                .find("anchor has 3 elements"),
            std::string::npos);
  const std::vector<float> anan = {1, std::nanf("")};
  in.anchor = anan;
  EXPECT_NE(run(ScorerKind::kKeyKey, View2(mean, 1), in, absl::MakeSpan(out)).find("anchor[1]"),
            std::string::npos);
  const std::vector<float> zero = {0, 0};
  in.anchor = zero;
  EXPECT_NE(run(ScorerKind::kKeyKey, View2(mean, 1), in, absl::MakeSpan(out)).find("zero norm"),
            std::string::npos);
  EXPECT_NE(run(ScorerKind::kKeyKey, View2(mean, 0), in, {}).find("context is empty"),
            std::string::npos);
  EXPECT_NE(run(ScorerKind::kQuest, View2(mean, 1), in, absl::MakeSpan(out)).find("view.min"),
            std::string::npos);
  std::vector<float> out2(2);
  EXPECT_NE(run(ScorerKind::kRecency, View2(mean, 1), in, absl::MakeSpan(out2)).find("out has 2"),
            std::string::npos);
  const std::vector<float> qinf = {INFINITY, 0};
  in.query = qinf;
  const std::vector<float> r = {1};
  SummaryView v = View2(mean, 1);
  v.radius = r.data();
  EXPECT_NE(run(ScorerKind::kArkVale, v, in, absl::MakeSpan(out)).find("query[0]"),
            std::string::npos);
}

TEST(ScorerTest, SummaryTableBuildsViewsPerLayer) {
  BlockSummary a;
  a.dim = 2;
  a.num_layers = 2;
  a.mean = {1, 1};
  a.min = {0, 0};
  a.max = {2, 2};
  a.radius = 1;
  a.layer_mean = {1, 0, 0, 1};
  BlockSummary b = a;
  b.mean = {2, 2};
  b.layer_mean = {0, 1, 1, 0};
  SummaryTable whole(2);
  ASSERT_OK(whole.Add(a));
  ASSERT_OK(whole.Add(b));
  SummaryView v = whole.view();
  EXPECT_EQ(v.num_blocks, 2);
  EXPECT_EQ(v.mean[2], 2.0f);
  EXPECT_NE(v.min, nullptr);
  EXPECT_EQ(v.radius[1], 1.0f);

  SummaryTable layer1(2, 1);
  ASSERT_OK(layer1.Add(a));
  ASSERT_OK(layer1.Add(b));
  v = layer1.view();
  EXPECT_EQ(v.mean[0], 0.0f);
  EXPECT_EQ(v.mean[1], 1.0f);
  EXPECT_EQ(v.mean[2], 1.0f);
  EXPECT_EQ(v.min, nullptr);  // no per-layer bounds in these summaries

  BlockSummary c = a;
  c.min.clear();
  c.max.clear();
  EXPECT_FALSE(whole.Add(c).ok());  // optional arrays differ
  c = a;
  c.dim = 3;
  EXPECT_NE(whole.Add(c).message().find("summary.dim"), std::string::npos);
}

}  // namespace
}  // namespace kvtier::index
