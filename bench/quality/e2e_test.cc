// End-to-end mode: the selections of a kvtierd (started in this process,
// real gRPC over its socket, summaries computed by the daemon from the put
// payloads) must equal the in-process Selector's, step by step.
#include <string>
#include <vector>

#include "bench/quality/daemon_backend.h"
#include "bench/quality/replay.h"
#include "gtest/gtest.h"

namespace kvtier::quality {
namespace {

class EndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override { SetDaemonBackendFactory(&MakeKvtierdBackend); }
  void TearDown() override { StopInProcessDaemons(); }
};

TEST_F(EndToEndTest, DaemonSelectionsEqualInProcessOnes) {
  SyntheticDumpOptions so;
  so.seq_len = 256;
  absl::StatusOr<KvDump> d = MakeSyntheticDump(so);
  ASSERT_TRUE(d.ok()) << d.status();
  ReplayConfig c;
  c.max_steps = 40;
  c.claims = false;
  MethodOptions mo;
  mo.endpoint = "inprocess";
  mo.local_blocks = 1;
  // Random draws its seed in the daemon and head weights are estimated over
  // the profile's history there: both are compared in docs, not here.
  c.runs = StandardRuns(
      {"keykey", "quest", "arkvale", "keydiff", "streamingllm", "h2o"},
      {1.0 / 8, 1.0 / 4}, mo, /*stab_variant=*/true);
  absl::StatusOr<ReplayResult> r = RunReplay(*d, c);
  ASSERT_TRUE(r.ok()) << r.status();
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

TEST_F(EndToEndTest, UnreachableDaemonIsAnError) {
  SyntheticDumpOptions so;
  so.seq_len = 128;
  absl::StatusOr<KvDump> d = MakeSyntheticDump(so);
  ASSERT_TRUE(d.ok());
  ReplayConfig c;
  c.max_steps = 2;
  c.claims = false;
  MethodOptions mo;
  mo.endpoint = "/nonexistent/kvtierd.sock";
  c.runs = {RunSpec{"keykey", "raw", 0.25, mo}};
  absl::Status s = RunReplay(*d, c).status();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent/kvtierd.sock"),
            absl::string_view::npos)
      << s;
}

}  // namespace
}  // namespace kvtier::quality
