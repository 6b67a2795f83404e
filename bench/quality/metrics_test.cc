#include "bench/quality/metrics.h"

#include <cmath>
#include <vector>

#include "bench/quality/attention.h"
#include "bench/quality/claims.h"
#include "bench/quality/kv_dump.h"
#include "gtest/gtest.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::quality {
namespace {

// One layer, one head, D = 2, two tokens with block_size 1: keys k0 = (1, 0)
// and k1 = (0, 0), q1 = (sqrt(2) ln 3, 0), so the logits are ln 3 and 0 and
// attention at t = 1 is exactly 3/4 and 1/4. Values v0 = (1, 0), v1 = (0, 1).
KvDump TwoBlockDump() {
  KvDump d;
  d.name = "two";
  d.num_layers = 1;
  d.num_q_heads = 1;
  d.num_kv_heads = 1;
  d.head_dim = 2;
  d.seq_len = 2;
  const float a = std::sqrt(2.0f) * std::log(3.0f);
  d.q = {0, 0, a, 0};
  d.k = {1, 0, 0, 0};
  d.v = {1, 0, 0, 1};
  return d;
}

StepAttention TwoBlockAttention() {
  StepAttention a;
  ComputeStepAttention(TwoBlockDump(), 1, 1, AttentionOptions(), &a);
  return a;
}

TEST(AttentionTest, TwoBlocksHaveKnownMassAndOutput) {
  const StepAttention a = TwoBlockAttention();
  ASSERT_EQ(a.num_blocks, 2);
  EXPECT_NEAR(a.Mass(0)[0], 0.75, 1e-6);
  EXPECT_NEAR(a.Mass(0)[1], 0.25, 1e-6);
  EXPECT_NEAR(a.Output(0)[0], 0.75, 1e-6);
  EXPECT_NEAR(a.Output(0)[1], 0.25, 1e-6);
  EXPECT_NEAR(a.Partial(0, 1)[1], 0.25, 1e-6);
  // t = 0 sees only itself; a block size of 2 merges both tokens.
  StepAttention b;
  ComputeStepAttention(TwoBlockDump(), 0, 1, AttentionOptions(), &b);
  EXPECT_EQ(b.num_blocks, 1);
  EXPECT_NEAR(b.Mass(0)[0], 1.0, 1e-6);
  ComputeStepAttention(TwoBlockDump(), 1, 2, AttentionOptions(), &b);
  EXPECT_EQ(b.num_blocks, 1);
  EXPECT_NEAR(b.Mass(0)[0], 1.0, 1e-6);
}

TEST(MetricsTest, HandCheckedTwoBlockCase) {
  const StepAttention a = TwoBlockAttention();
  const ForcedBlocks none = ForcedBlocks::Make(2, 0, 0);
  const std::vector<int64_t> first = {0}, second = {1}, both = {0, 1};
  EXPECT_NEAR(SetMass(a.Mass(0), first), 0.75, 1e-6);
  // o_S = (1, 0); o = (0.75, 0.25): |(0.25, -0.25)| / |(0.75, 0.25)|.
  EXPECT_NEAR(RelativeL2Error(a, 0, first), std::sqrt(0.125 / 0.625), 1e-6);
  EXPECT_NEAR(RelativeL2Error(a, 0, second), std::sqrt(1.125 / 0.625), 1e-6);
  EXPECT_NEAR(RelativeL2Error(a, 0, both), 0.0, 1e-6);

  std::vector<double> total;
  TotalMass(a, &total);
  const std::vector<int64_t> oracle = TopBlocks(total, none, 1);
  ASSERT_EQ(oracle, first);

  MetricAccumulator good(1, 1), bad(1, 1);
  good.AddStep(a, none, first, oracle, 0, 1.0);
  bad.AddStep(a, none, second, oracle, 1, 3.0);
  const MetricSummary g = good.Summarise(100);
  const MetricSummary b = bad.Summarise(100);
  EXPECT_NEAR(g.recall, 0.75, 1e-6);
  EXPECT_NEAR(g.share, 1.0, 1e-9);
  EXPECT_NEAR(g.oracle_ratio, 1.0, 1e-9);
  EXPECT_NEAR(g.overlap, 1.0, 1e-9);
  EXPECT_NEAR(b.recall, 0.25, 1e-6);
  EXPECT_NEAR(b.share, 1.0 / 3.0, 1e-6);
  EXPECT_NEAR(b.oracle_ratio, 1.0 / 3.0, 1e-6);
  EXPECT_NEAR(b.overlap, 0.0, 1e-9);
  EXPECT_NEAR(b.churn_blocks, 1.0, 1e-9);
  EXPECT_NEAR(b.bytes_per_step, 100.0, 1e-9);
  EXPECT_NEAR(b.latency_us, 3.0, 1e-9);

  // With block 0 forced (a sink), recall counts it but share does not.
  const ForcedBlocks sink = ForcedBlocks::Make(2, 1, 0);
  const std::vector<int64_t> o2 = TopBlocks(total, sink, 1);
  ASSERT_EQ(o2, first);
  MetricAccumulator forced(1, 1);
  forced.AddStep(a, sink, first, o2, 0, 0);
  const MetricSummary f = forced.Summarise(1);
  EXPECT_NEAR(f.recall, 0.75, 1e-6);
  EXPECT_NEAR(f.recall_free, 0.0, 1e-9);
  EXPECT_NEAR(f.share, 1.0, 1e-9);  // no free oracle mass: defined as 1
}

TEST(MetricsTest, WorstCaseAndGqaAcrossHeads) {
  // Two query heads sharing one KV head: head 0 puts 0.9 on block 0, head 1
  // 0.9 on block 1. Choosing block 0 serves head 0 well and head 1 badly.
  StepAttention a;
  a.t = 1;
  a.block_size = 1;
  a.num_heads = 2;
  a.head_dim = 1;
  a.num_blocks = 2;
  a.mass = {0.9f, 0.1f, 0.1f, 0.9f};
  a.partial = {0.9f, 0.1f, 0.1f, 0.9f};  // v0 = 1, v1 = 1: no output error
  a.output = {1.0f, 1.0f};
  const ForcedBlocks none = ForcedBlocks::Make(2, 0, 0);
  MetricAccumulator acc(2, 2);
  const std::vector<int64_t> chosen = {0};
  acc.AddStep(a, none, chosen, chosen, 0, 0);
  const MetricSummary s = acc.Summarise(1);
  EXPECT_NEAR(s.recall, 0.5, 1e-6);
  EXPECT_NEAR(s.recall_worst, 0.1, 1e-6);
  EXPECT_NEAR(s.share, 1.0, 1e-6);
  EXPECT_NEAR(s.share_worst, 1.0, 1e-6);
  EXPECT_NEAR(s.rel_l2, 0.0, 1e-6);

  // Values that differ: v0 = 1, v1 = -1.
  a.partial = {0.9f, -0.1f, 0.1f, -0.9f};
  a.output = {0.8f, -0.8f};
  MetricAccumulator acc2(2, 2);
  acc2.AddStep(a, none, chosen, chosen, 0, 0);
  const MetricSummary s2 = acc2.Summarise(1);
  // Head 0: o_S = 1 vs 0.8 -> 0.25; head 1: 1 vs -0.8 -> 2.25.
  EXPECT_NEAR(s2.rel_l2, (0.25 + 2.25) / 2, 1e-5);
  EXPECT_NEAR(s2.rel_l2_worst, 2.25, 1e-5);
  EXPECT_NEAR(s2.rel_l2_gqa_worst, 2.25, 1e-5);

  MetricAccumulator other(4, 2);
  EXPECT_FALSE(acc.Merge(other).ok());
  EXPECT_OK(acc.Merge(acc2));
  EXPECT_EQ(acc.steps(), 2);
}

TEST(MetricsTest, ForcedBlocksTopBlocksAndNewBlocks) {
  const ForcedBlocks f = ForcedBlocks::Make(5, 1, 2);
  EXPECT_TRUE(f.Contains(0));
  EXPECT_FALSE(f.Contains(1));
  EXPECT_FALSE(f.Contains(2));
  EXPECT_TRUE(f.Contains(3));
  EXPECT_TRUE(f.Contains(4));
  EXPECT_EQ(ForcedBlocks::Make(2, 3, 3).count(), 2);
  const std::vector<double> score = {0, 5, 5, 0, 0};
  // Ties go to the lower index.
  EXPECT_EQ(TopBlocks(score, f, 4), (std::vector<int64_t>{0, 1, 3, 4}));
  EXPECT_EQ(TopBlocks(score, f, 9), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(TopBlocks(score, f, 2), (std::vector<int64_t>{0, 3, 4}));
  // Block 5 did not exist at the previous step: not a load.
  EXPECT_EQ(NewBlocks({0, 2, 4}, {0, 1, 4, 5}, 5), 1);
  EXPECT_EQ(NewBlocks({}, {0, 1}, 2), 2);
}

TEST(ClaimsTest, SpearmanOfMonotoneAndTiedData) {
  EXPECT_NEAR(Spearman(std::vector<double>{1, 2, 3, 4}, std::vector<double>{10, 20, 30, 400}), 1.0,
              1e-12);
  EXPECT_NEAR(Spearman(std::vector<double>{1, 2, 3, 4}, std::vector<double>{4, 3, 2, 1}), -1.0,
              1e-12);
  EXPECT_EQ(Spearman(std::vector<double>{1, 1, 1}, std::vector<double>{1, 2, 3}), 0.0);
  // Ties take average ranks: x ranks (0.5, 0.5, 2), y ranks (0, 1, 2).
  EXPECT_NEAR(Spearman(std::vector<double>{1, 1, 2}, std::vector<double>{1, 2, 3}),
              std::sqrt(3.0) / 2.0, 1e-12);
}

}  // namespace
}  // namespace kvtier::quality
