#include "bench/quality/replay.h"

#include <filesystem>
#include <string>
#include <vector>

#include "bench/quality/backend.h"
#include "bench/quality/methods.h"
#include "bench/quality/report.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/context_tree.h"
#include "index/select/selector.h"

#ifdef KVTIER_QUALITY_E2E
#include "bench/quality/daemon_backend.h"
#include "tests/testutil/status_matchers.h"
#endif

using ::kvtier::testing::StatusIs;

namespace kvtier::quality {
namespace {

using ::testing::HasSubstr;

// Every method runs, "default" (the daemon's embedded defaults) included
// when the daemon is linked in.
std::vector<std::string> AllMethods() {
#ifdef KVTIER_QUALITY_E2E
  SetShippedDefaultsFactory(&ShippedDefaults);
  std::vector<std::string> m = MethodNames();
#else
  std::vector<std::string> m;
  for (const std::string& x : MethodNames()) {
    if (x != "default") m.push_back(x);
  }
#endif
  return m;
}

KvDump Synthetic(bool recall, int64_t tokens = 256) {
  SyntheticDumpOptions o;
  o.recall = recall;
  o.seq_len = tokens;
  absl::StatusOr<KvDump> d = MakeSyntheticDump(o);
  EXPECT_OK(d) << d.status();
  return *d;
}

MetricSummary Get(const ReplayResult& r, const RunSpec& spec) {
  auto it = r.runs.find(spec.Key());
  EXPECT_NE(it, r.runs.end()) << spec.Key();
  return it->second->metrics.Summarise(r.block_bytes);
}

TEST(ReplayTest, OracleRecallsEverythingAtFullBudget) {
  const KvDump d = Synthetic(true);
  ReplayConfig c;
  c.replay.block_size = 16;
  c.max_steps = 24;
  c.claims = false;
  MethodOptions mo;
  c.runs = StandardRuns({"oracle", "streamingllm", "keykey"}, {1.0}, mo, false);
  absl::StatusOr<ReplayResult> r = RunReplay(d, c);
  ASSERT_OK(r) << r.status();
  EXPECT_EQ(r->steps, 24);
  for (const RunSpec& spec : c.runs) {
    const MetricSummary s = Get(*r, spec);
    EXPECT_NEAR(s.recall, 1.0, 1e-5) << spec.Key();
    EXPECT_NEAR(s.share, 1.0, 1e-9) << spec.Key();
    EXPECT_NEAR(s.rel_l2, 0.0, 1e-4) << spec.Key();
  }
}

TEST(ReplayTest, OracleBoundsEveryMethodAndEveryMethodRuns) {
  const KvDump d = Synthetic(true);
  ReplayConfig c;
  c.max_steps = 40;
  c.claims_stride = 8;
  MethodOptions mo;
  mo.local_blocks = 1;
  std::vector<std::string> methods = AllMethods();
  methods.push_back("oracle_head");
  methods.push_back("keykey_head_centered+recency:0.3");
  c.runs = StandardRuns(methods, {1.0 / 8, 1.0 / 4}, mo, true);
  absl::StatusOr<ReplayResult> r = RunReplay(d, c);
  ASSERT_OK(r) << r.status();
  for (double b : {1.0 / 8, 1.0 / 4}) {
    const MetricSummary oracle = Get(*r, RunSpec{"oracle", "raw", b, mo});
    EXPECT_NEAR(oracle.share, 1.0, 1e-9);
    EXPECT_NEAR(oracle.overlap, 1.0, 1e-9);
    const MetricSummary per_head = Get(*r, RunSpec{"oracle_head", "raw", b, mo});
    EXPECT_GE(per_head.recall, oracle.recall - 1e-9);
    for (const auto& [key, run] : r->runs) {
      if (run->spec.budget != b) continue;
      const MetricSummary s = run->metrics.Summarise(r->block_bytes);
      EXPECT_EQ(s.steps, 40) << key;
      if (run->spec.method == "oracle_head") continue;
      EXPECT_LE(s.share, 1.0 + 1e-9) << key;
      EXPECT_LE(s.recall, oracle.recall + 1e-9) << key;
      EXPECT_GE(s.share, 0.0) << key;
    }
  }
  // Recency wins on a local synthetic sequence; random does not.
  const MetricSummary recent = Get(*r, RunSpec{"streamingllm", "raw", 1.0 / 8, mo});
  const MetricSummary random = Get(*r, RunSpec{"random", "raw", 1.0 / 8, mo});
  EXPECT_GT(recent.share, random.share);
  ASSERT_NE(r->claims, nullptr);
  EXPECT_EQ(r->claims->Rows().size(), 2u);
  EXPECT_EQ(r->claims->Rows()[0].samples, 5 * 2);  // 5 steps x 2 KV heads

  // The report names every method and writes the verdict.
  ReportOptions ro;
  ro.budgets = {1.0 / 8, 1.0 / 4};
  ro.detail_budget = 1.0 / 8;
  const std::string md = QualityMarkdown({&*r}, ro);
  EXPECT_THAT(md, HasSubstr("| quest_head |"));
  EXPECT_THAT(md, HasSubstr("Best kvtier scorer"));
  EXPECT_THAT(md, HasSubstr("Where attention goes"));
  const std::string csv = ResultsCsv({&*r});
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), static_cast<long>(c.runs.size()) + 1);
}

TEST(ReplayTest, RankStabilityKeepsTheBudgetAndForcedBlocks) {
  MethodOptions mo;
  mo.sink_blocks = 1;
  mo.local_blocks = 1;
  mo.stability = StabilityMode::kRank;
  mo.stability_options.window_steps = 20;
  mo.stability_options.theta = 0.5f;
  mo.stability_options.weight = 0.5f;
  const index::SelectorOptions so = SelectorOptionsFor(mo);
  index::StabilityTracker tracker;
  std::vector<int64_t> first_seen, blocks;
  // Page 2 is best for 5 steps, then page 3 edges ahead: with weight 0.5 the
  // stable page 2 stays.
  for (int64_t step = 0; step < 8; ++step) {
    std::vector<float> aff = {0.1f, 0.2f, 0.8f, 0.7f, 0.1f, 0.9f};
    if (step >= 5) aff[3] = 0.85f;
    FlatSelectRank(so, {aff, 3, step}, &tracker, &first_seen, &blocks);
    EXPECT_EQ(blocks, (std::vector<int64_t>{0, 2, 5})) << step;
  }
  // Without stability page 3 wins at once.
  tracker = index::StabilityTracker();
  first_seen.clear();
  mo.stability_options.weight = 0.0f;
  std::vector<float> aff = {0.1f, 0.2f, 0.8f, 0.85f, 0.1f, 0.9f};
  FlatSelectRank(SelectorOptionsFor(mo), {aff, 3, 0}, &tracker, &first_seen, &blocks);
  EXPECT_EQ(blocks, (std::vector<int64_t>{0, 3, 5}));
}

TEST(ReplayTest, RejectsBadRunsAndReportsTheDaemonSeam) {
  const KvDump d = Synthetic(false, 128);
  ReplayConfig c;
  c.claims = false;
  MethodOptions mo;
  c.runs = {RunSpec{"no_such_scorer", "raw", 0.25, mo}};
  EXPECT_THAT(RunReplay(d, c).status().message(), HasSubstr("\"no_such_scorer\" is not known"));
  c.runs = {RunSpec{"keykey", "raw", 1.5, mo}};
  EXPECT_THAT(RunReplay(d, c).status().message(), HasSubstr("budget must be in (0, 1]"));
  c.runs = {RunSpec{"keykey", "raw", 0.25, mo}, RunSpec{"keykey", "raw", 0.25, mo}};
  EXPECT_THAT(RunReplay(d, c).status().message(), HasSubstr("listed twice"));
  mo.stability = StabilityMode::kRank;
  c.runs = {RunSpec{"keykey", "x", 0.25, mo}};
  EXPECT_THAT(RunReplay(d, c).status().message(), HasSubstr("rank stability"));
  // End-to-end mode: a daemon scorer is also asked of kvtierd.
  mo.stability = StabilityMode::kOff;
  mo.endpoint = "unix:///nonexistent";
  c.runs = {RunSpec{"keykey", "raw", 0.25, mo}};
  EXPECT_THAT(RunReplay(d, c).status(), StatusIs(absl::StatusCode::kUnimplemented));
  // Harness scorers have no daemon twin and run.
  c.runs = {RunSpec{"h2o", "raw", 0.25, mo}};
  EXPECT_OK(RunReplay(d, c));
}

// A prefix of one real dump through every default method (CI-sized).
TEST(ReplayTest, RealDumpPrefix) {
  const std::string path = std::string(KVTIER_REALKV_DIR) + "/rk-persuasion-recall-00.safetensors";
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << path << " is absent";
  }
  absl::StatusOr<KvDump> full = LoadKvDump(path);
  ASSERT_OK(full) << full.status();
  EXPECT_EQ(full->num_layers, 4);
  EXPECT_EQ(full->num_q_heads, 4);
  EXPECT_EQ(full->num_kv_heads, 2);
  EXPECT_EQ(full->head_dim, 64);
  EXPECT_EQ(full->seq_len, 1024);
  // Layer 0 keys depend only on the byte, so once the rotary embedding is
  // undone two equal bytes have equal keys whatever their positions; with
  // it they differ. This pins the rotary convention of replay_data.h.
  {
    absl::StatusOr<ReplayData> data = BuildReplayData(*full, ReplayOptions());
    ASSERT_OK(data) << data.status();
    ASSERT_GT(data->rope_theta, 0);
    const int32_t D = full->head_dim;
    int64_t pairs = 0;
    double worst_norope = 1, worst_rope = 1;
    for (int64_t i = 0; i < 200; ++i) {
      for (int64_t j = i + 50; j < 1024 && pairs < 200; j += 37) {
        if (full->tokens[i] != full->tokens[j]) continue;
        const float* a = &data->keys_norope[i * D];
        const float* b = &data->keys_norope[j * D];
        double ab = 0, aa = 0, bb = 0, rab = 0, raa = 0, rbb = 0;
        for (int32_t x = 0; x < D; ++x) {
          ab += a[x] * b[x];
          aa += a[x] * a[x];
          bb += b[x] * b[x];
          const float* ra = full->K(0, 0, i);
          const float* rb = full->K(0, 0, j);
          rab += ra[x] * rb[x];
          raa += ra[x] * ra[x];
          rbb += rb[x] * rb[x];
        }
        worst_norope = std::min(worst_norope, ab / std::sqrt(aa * bb));
        worst_rope = std::min(worst_rope, rab / std::sqrt(raa * rbb));
        ++pairs;
      }
    }
    ASSERT_GT(pairs, 20);
    EXPECT_GT(worst_norope, 0.99);
    EXPECT_LT(worst_rope, 0.9);
  }
  absl::StatusOr<KvDump> d = TruncateDump(*full, 384);
  ASSERT_OK(d);
  ReplayConfig c;
  c.max_steps = 48;
  c.step_stride = 2;
  MethodOptions mo;
  std::vector<std::string> methods = AllMethods();
  methods.push_back("oracle_head");
  c.runs = StandardRuns(methods, {1.0 / 8}, mo, true);
  absl::StatusOr<ReplayResult> r = RunReplay(*d, c);
  ASSERT_OK(r) << r.status();
  EXPECT_EQ(r->steps, 48);
  const MetricSummary oracle = Get(*r, RunSpec{"oracle", "raw", 1.0 / 8, mo});
  const MetricSummary recent = Get(*r, RunSpec{"streamingllm", "raw", 1.0 / 8, mo});
  const MetricSummary random = Get(*r, RunSpec{"random", "raw", 1.0 / 8, mo});
  EXPECT_NEAR(oracle.share, 1.0, 1e-9);
  EXPECT_GT(oracle.recall, 0.5);
  // Real attention is local: recency beats random by a wide margin.
  EXPECT_GT(recent.share, random.share + 0.3);
  EXPECT_EQ(r->block_bytes, 4 * 2 * 2 * 16 * 64 * 2);
}

}  // namespace
}  // namespace kvtier::quality
