// The shipped defaults replayed as an engine drives the daemon, on the
// shared real-model dumps: prompt blocks put and opened as a context, each
// block put and appended when it completes, Select every step, at step t
// and one step ahead (replay.h), with the calibrations committed in
// bench/quality/calibration. The regression this guards: a default that
// gives an engine less than a plain sliding window of the same budget.
#include <filesystem>
#include <string>
#include <vector>

#include "bench/quality/calibrate.h"
#include "bench/quality/daemon_backend.h"
#include "bench/quality/replay.h"
#include "gtest/gtest.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::quality {
namespace {

std::vector<std::string> SharedDumps(const char* dir = KVTIER_REALKV_DIR) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".safetensors") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

class EngineReplayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    InstallDaemonBackend();
    dumps_ = SharedDumps();
    if (dumps_.empty()) GTEST_SKIP() << "no dumps in " << KVTIER_REALKV_DIR;
    absl::StatusOr<std::map<std::string, index::SelectionCalibration>> cal =
        LoadCalibrations(KVTIER_CALIBRATION_DIR);
    ASSERT_OK(cal) << cal.status();
    calibrations_ = std::move(*cal);
  }
  void TearDown() override { StopInProcessDaemons(); }

  std::vector<std::string> dumps_;
  std::map<std::string, index::SelectionCalibration> calibrations_;
};

MetricSummary Get(const ReplayResult& r, const RunSpec& spec) {
  auto it = r.runs.find(spec.Key());
  EXPECT_NE(it, r.runs.end()) << spec.Key();
  return it == r.runs.end() ? MetricSummary() : it->second->metrics.Summarise(r.block_bytes);
}

// Replays `dumps` at `budgets`, both timings, and checks that the default
// captures at least the attention of the better simple policy, less
// `slack`, on each.
void CheckAgainstSimplePolicies(const std::vector<std::string>& dumps,
                                const std::vector<double>& budgets,
                                const std::map<std::string, index::SelectionCalibration>& cal,
                                int64_t step_stride, double slack) {
  MethodOptions mo;  // sink 1 and local 1, as the shipped select.* keys
  mo.local_blocks = 1;
  MethodOptions window = mo;
  window.sink_blocks = 0;
  ReplayConfig c;
  c.claims = false;
  c.calibrations = cal;
  c.step_stride = step_stride;
  c.runs = StandardRuns({"default", "streamingllm"}, budgets, mo,
                        /*stab_variant=*/false, {false, true});
  for (bool ahead : {false, true}) {
    for (double b : budgets) c.runs.push_back({"streamingllm", "window", b, window, ahead});
  }
  int calibrated = 0;
  for (const std::string& path : dumps) {
    absl::StatusOr<KvDump> d = LoadKvDump(path);
    ASSERT_OK(d) << d.status();
    calibrated += cal.count(d->metadata["model"]) > 0;
    absl::StatusOr<ReplayResult> r = RunReplay(*d, c);
    ASSERT_OK(r) << r.status();
    for (bool ahead : {false, true}) {
      for (double b : budgets) {
        const double def = Get(*r, {"default", "raw", b, mo, ahead}).recall;
        const double sink = Get(*r, {"streamingllm", "raw", b, mo, ahead}).recall;
        const double win = Get(*r, {"streamingllm", "window", b, window, ahead}).recall;
        EXPECT_GE(def, std::max(sink, win) - slack)
            << d->name << " budget " << b << (ahead ? " ahead" : " at step t")
            << ": the default captures " << def << " of the attention, recency with the sink "
            << sink << ", a sliding window " << win;
      }
    }
  }
  // Every shared model is calibrated: the test exercises the mass scorer
  // with head queries, not only its uncalibrated (window) form.
  EXPECT_EQ(calibrated, static_cast<int>(dumps.size()));
}

// The two simple policies the default must never lose to: a sliding window
// (the last blocks only) and recency with the sink kept (StreamingLLM). The
// comparison is on the attention mass captured of all blocks (recall):
// the policies keep different forced blocks (the copy model's calibration
// keeps the sink, the byte model's lets it compete), so their oracles'
// free mass differ and only the total is comparable. The stated slack,
// 0.002 of the attention, is the byte model's sink: its calibration weighs
// the sink twice its measured attention (chosen on next-byte loss, where
// keeping it at 1/4 is 0.0002 nats better; mass underrates a sink), so at
// 1/4 the default keeps it where a window holds up to 0.0018 more mass.
TEST_F(EngineReplayTest, DefaultNeverLosesToTheBetterSimplePolicyOnAnySharedDump) {
  CheckAgainstSimplePolicies(dumps_, {1.0 / 16, 1.0 / 8, 1.0 / 4}, calibrations_,
                             /*step_stride=*/1, /*slack=*/0.002);
}

// The same on the 2K copying model's dumps (../realkv-2k) at the long-context
// budgets, every second step (Selects two steps apart: copy tracking counts
// a key that moved two tokens), to keep the test near ten seconds, with a
// stated slack of 0.006 of the attention: the calibration keeps this
// model's sink (1.8% of its attention; mass underrates a sink,
// docs/QUALITY.md), and at 1/32 on plain text a sliding window's extra
// recent block holds up to 0.0033 more; once (window-01) copy tracking
// follows a lockstep run in plain text, and with copy_weight 10 (a copy
// target takes the one free slot) that costs 0.0052 of the attention at
// 1/32. In the model's own loss the default is still ahead on that text
// there (1.458 nats against 1.494 for the window and 1.470 for recency
// with the sink, decode_eval on the shared dumps; docs/QUALITY.md, "A slot
// for the copy target").
TEST_F(EngineReplayTest, DefaultNeverLosesOnTheLongContextDumps) {
  const std::vector<std::string> dumps = SharedDumps(KVTIER_REALKV_2K_DIR);
  if (dumps.empty()) GTEST_SKIP() << "no dumps in " << KVTIER_REALKV_2K_DIR;
  CheckAgainstSimplePolicies(dumps, {1.0 / 32, 1.0 / 16, 1.0 / 8}, calibrations_,
                             /*step_stride=*/2, /*slack=*/0.006);
}

// The daemon itself (started in this process on its embedded defaults, real
// gRPC over its socket, summaries computed at put time) chooses what the
// in-process replay chooses, step by step, on a dump of the copying model.
TEST_F(EngineReplayTest, ShippedDaemonChoosesWhatTheReplayChooses) {
  std::string path;
  for (const std::string& p : dumps_) {
    if (p.find("rkc-persuasion-recall-00") != std::string::npos) path = p;
  }
  if (path.empty()) GTEST_SKIP() << "rkc-persuasion-recall-00 is not in " << KVTIER_REALKV_DIR;
  absl::StatusOr<KvDump> d = LoadKvDump(path);
  ASSERT_OK(d) << d.status();
  ReplayConfig c;
  c.claims = false;
  c.max_steps = 96;
  c.calibrations = calibrations_;
  MethodOptions mo;
  mo.local_blocks = 1;
  mo.endpoint = "inprocess";
  c.runs = StandardRuns({"default"}, {1.0 / 8}, mo, false, {false, true});
  absl::StatusOr<ReplayResult> r = RunReplay(*d, c);
  ASSERT_OK(r) << r.status();
  for (const auto& [key, run] : r->runs) {
    EXPECT_EQ(run->e2e_steps, 96) << key;
    EXPECT_EQ(run->e2e_mismatches, 0) << key;
  }
}

}  // namespace
}  // namespace kvtier::quality
