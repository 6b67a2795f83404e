// End-to-end mode: the selections of a kvtierd (started in this process,
// real gRPC over its socket, summaries computed by the daemon from the put
// payloads) must equal the in-process Selector's, step by step.
#include <string>
#include <vector>

#include "bench/quality/daemon_backend.h"
#include "bench/quality/replay.h"
#include "gtest/gtest.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::quality {
namespace {

class EndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override { InstallDaemonBackend(); }
  void TearDown() override { StopInProcessDaemons(); }
};

TEST_F(EndToEndTest, DaemonSelectionsEqualInProcessOnes) {
  SyntheticDumpOptions so;
  so.seq_len = 256;
  absl::StatusOr<KvDump> d = MakeSyntheticDump(so);
  ASSERT_OK(d) << d.status();
  ReplayConfig c;
  c.max_steps = 40;
  c.claims = false;
  MethodOptions mo;
  mo.endpoint = "inprocess";
  mo.local_blocks = 1;
  // Random draws its seed in the daemon and head weights are estimated over
  // the profile's history there: both are compared in docs, not here.
  c.runs = StandardRuns({"keykey", "quest", "arkvale", "keydiff", "streamingllm", "h2o"},
                        {1.0 / 8, 1.0 / 4}, mo, /*stab_variant=*/true);
  absl::StatusOr<ReplayResult> r = RunReplay(*d, c);
  ASSERT_OK(r) << r.status();
  int64_t compared = 0;
  for (const auto& [key, run] : r->runs) {
    if (!IsDaemonMethod(run->spec.method)) {
      EXPECT_EQ(run->e2e_steps, 0) << key;
      continue;
    }
    EXPECT_EQ(run->e2e_steps, 40) << key;
    EXPECT_EQ(run->e2e_mismatches, 0) << key;
    compared += run->e2e_steps;
  }
  EXPECT_EQ(compared, 5 * 2 * 2 * 40);
}

// The new scorers end to end, at both timings: per-layer anchors (int8
// per-layer means), the mass scorer with a calibration naming retrieval
// heads (their int8 keys kept by the daemon, their queries sent with every
// Select), and the daemon's shipped defaults asked with SCORER_UNSPECIFIED.
TEST_F(EndToEndTest, PerLayerMassAndShippedDefaultsEqualInProcess) {
  SyntheticDumpOptions so;
  so.seq_len = 256;
  absl::StatusOr<KvDump> d = MakeSyntheticDump(so);
  ASSERT_OK(d) << d.status();
  ReplayConfig c;
  c.max_steps = 40;
  c.claims = false;
  index::SelectionCalibration cal;
  cal.num_q_heads = so.num_q_heads;
  cal.retrieval_heads = {{1, 0}, {1, 3}};
  cal.head_weights = {0.5f, 0.9f};
  cal.prior = {0.5f, 0.2f, 0.1f, 0.05f};
  cal.prior_all = {0.7f, 0.3f, 0.1f, 0.06f};
  c.calibrations[d->metadata.count("model") ? d->metadata.at("model") : ""] = cal;
  MethodOptions mo;
  mo.endpoint = "inprocess";
  mo.local_blocks = 1;
  mo.calibration = cal;
  c.runs = StandardRuns({"keykey_perlayer", "mass", "mass_prior", "default"}, {1.0 / 8}, mo,
                        /*stab_variant=*/true, {false, true});
  absl::StatusOr<ReplayResult> r = RunReplay(*d, c);
  ASSERT_OK(r) << r.status();
  int64_t compared = 0;
  for (const auto& [key, run] : r->runs) {
    EXPECT_EQ(run->e2e_steps, 40) << key;
    EXPECT_EQ(run->e2e_mismatches, 0) << key;
    compared += run->e2e_steps;
  }
  // (3 methods x raw + stab, default x raw) x 2 timings.
  EXPECT_EQ(compared, (3 * 2 + 1) * 2 * 40);
}

TEST_F(EndToEndTest, UnreachableDaemonIsAnError) {
  SyntheticDumpOptions so;
  so.seq_len = 128;
  absl::StatusOr<KvDump> d = MakeSyntheticDump(so);
  ASSERT_OK(d);
  ReplayConfig c;
  c.max_steps = 2;
  c.claims = false;
  MethodOptions mo;
  mo.endpoint = "/nonexistent/kvtierd.sock";
  c.runs = {RunSpec{"keykey", "raw", 0.25, mo}};
  absl::Status s = RunReplay(*d, c).status();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent/kvtierd.sock"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace kvtier::quality
