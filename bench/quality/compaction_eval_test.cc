// kvtier-eval --compaction on synthetic dumps: at rho = 1 every method is
// exact; below it errors are finite, counted per (query, head, layer), and
// eviction loses something; the reports name every method and scope.
#include "bench/quality/compaction_eval.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::quality {
namespace {

KvDump Synthetic(bool recall, uint64_t seed) {
  SyntheticDumpOptions o;
  o.num_layers = 2;
  o.head_dim = 16;
  o.seq_len = 160;
  o.recall = recall;
  o.seed = seed;
  absl::StatusOr<KvDump> d = MakeSyntheticDump(o);
  EXPECT_OK(d) << d.status();
  return *d;
}

CompactionEvalOptions Options(std::vector<double> rhos) {
  CompactionEvalOptions o;
  o.prefix_tokens = 128;
  o.window = 8;
  o.rhos = std::move(rhos);
  return o;
}

TEST(CompactionEvalTest, FullRetentionIsExactForEveryMethod) {
  const KvDump d = Synthetic(true, 3);
  absl::StatusOr<CompactionDumpResult> r = EvaluateCompaction(d, Options({1.0}));
  ASSERT_OK(r) << r.status();
  ASSERT_EQ(r->runs.size(), DefaultCompactionMethods().size());
  for (const CompactionRun& run : r->runs) {
    EXPECT_EQ(run.kept_tokens, 128);
    ASSERT_EQ(run.errors.size(), 2u);
    for (const std::vector<float>& layer : run.errors) {
      ASSERT_EQ(layer.size(), static_cast<size_t>((160 - 128) * d.num_q_heads));
      for (float e : layer) EXPECT_LT(e, 1e-5f) << run.method;
    }
  }
}

TEST(CompactionEvalTest, CompactionLosesSomethingButStaysFinite) {
  const KvDump d = Synthetic(false, 5);
  absl::StatusOr<CompactionDumpResult> r = EvaluateCompaction(d, Options({0.25}));
  ASSERT_OK(r) << r.status();
  for (const CompactionRun& run : r->runs) {
    EXPECT_EQ(run.kept_tokens, 32);
    std::vector<float> all;
    for (const auto& layer : run.errors) all.insert(all.end(), layer.begin(), layer.end());
    const ErrorSummary s = SummariseErrors(all);
    EXPECT_TRUE(std::isfinite(s.mean)) << run.method;
    EXPECT_GT(s.mean, 0.0) << run.method;
    EXPECT_LE(s.median, s.p90) << run.method;
  }
}

TEST(CompactionEvalTest, SummaryQuantiles) {
  const ErrorSummary s = SummariseErrors({4, 1, 3, 2, 5, 6, 7, 8, 9, 10});
  EXPECT_EQ(s.count, 10);
  EXPECT_DOUBLE_EQ(s.mean, 5.5);
  EXPECT_DOUBLE_EQ(s.median, 5.5);
  EXPECT_DOUBLE_EQ(s.p90, 9.1);
}

TEST(CompactionEvalTest, ReportsNameEveryMethodAndScope) {
  std::vector<CompactionDumpResult> results;
  for (bool recall : {false, true}) {
    KvDump d = Synthetic(recall, 7);
    absl::StatusOr<CompactionDumpResult> r = EvaluateCompaction(d, Options({0.25, 0.5}));
    ASSERT_OK(r) << r.status();
    results.push_back(*std::move(r));
  }
  ASSERT_NE(results[0].group, results[1].group);
  const std::string md = CompactionMarkdown(results, Options({0.25, 0.5}), "kvtier-eval x");
  for (const CompactionMethod& m : DefaultCompactionMethods()) {
    EXPECT_TRUE(absl::StrContains(md, "| " + m.name + " |")) << m.name;
  }
  EXPECT_TRUE(absl::StrContains(md, "## " + results[0].group));
  EXPECT_TRUE(absl::StrContains(md, "## all (2 dumps)"));
  EXPECT_TRUE(absl::StrContains(md, "rho 25% mean"));
  const std::string csv = CompactionCsv(results);
  const std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  // 2 dumps + 2 groups + all, x methods x 2 rhos x (all layers + 2 layers).
  EXPECT_EQ(lines.size(), 1 + 5 * DefaultCompactionMethods().size() * 2 * 3);
}

TEST(CompactionEvalTest, RejectsPrefixAndWindowThatDoNotFit) {
  const KvDump d = Synthetic(false, 1);
  CompactionEvalOptions o = Options({0.5});
  o.prefix_tokens = 160;
  EXPECT_TRUE(absl::StrContains(EvaluateCompaction(d, o).status().message(), "prefix_tokens"));
  o = Options({0.5});
  o.window = 0;
  EXPECT_TRUE(absl::StrContains(EvaluateCompaction(d, o).status().message(), "window"));
}

}  // namespace
}  // namespace kvtier::quality
