// The replay: every decode step of a dump, every method at every budget,
// measured against exact attention (metrics.h).
//
// A run is (method, variant, budget fraction, method options). Variants:
//   raw       the scorer's ranking alone (stability weight 0, no holding)
//   stab      the same through the index's stability filter
//   stabrank  through the harness's rank-based filter (methods.h, kRank;
//             harness scorers only)
//   sweep     a stability filter at one (mode, window, weight, theta) point
//   forced    one (sink_blocks, local_blocks) point (raw ranking)
// Each run keeps its own context state (stability windows, previous
// selection) across the steps of a dump and its own oracle (same forced
// blocks and budget).
//
// Every run replays the dump as an engine drives the daemon: the prompt's
// complete blocks open the context, and each block is put and appended
// when it completes. Two timings:
//   at     the set chosen at step t (anchor and queries of t, the blocks
//          complete at t) is used at step t;
//   ahead  the set is chosen at step t - 1 with what the engine had then
//          (anchor and queries of t - 1, the blocks complete at t - 1), for
//          a budget of B(t) minus the blocks the engine keeps itself (the
//          block that completed since, and its partial block), and used at
//          step t together with those: how docs/API.md tells engines to
//          call Select, off the critical path.
// Metrics always judge the set used at t against attention at t. Steps: t = prompt_tokens + i *
// step_stride, at most max_steps of them; attention itself is computed at every position (H2O
// accumulates over all of them).
//
// End-to-end mode (methods.endpoint set): every daemon-scorer run is also
// served by kvtierd and each step's two selections must be equal;
// mismatching steps are counted per run.
//
// Thread safety: RunReplay is reentrant (one dump per call).
#ifndef KVTIER_BENCH_QUALITY_REPLAY_H_
#define KVTIER_BENCH_QUALITY_REPLAY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/quality/claims.h"
#include "bench/quality/kv_dump.h"
#include "bench/quality/methods.h"
#include "bench/quality/metrics.h"
#include "bench/quality/replay_data.h"

namespace kvtier::quality {

struct RunSpec {
  std::string method;   // a MethodNames() entry, a mix, or "oracle_head"
  std::string variant;  // "raw", "stab", "stabrank", "sweep:...", "forced:..."
  double budget = 0;    // fraction of the visible blocks
  MethodOptions options;
  bool ahead = false;       // one step ahead (see above); else at step t
  std::string Key() const;  // "method|variant|budget" (+ "|ahead")
};

struct ReplayConfig {
  ReplayOptions replay;
  // Selection calibrations by model name (a dump's "model" metadata); a
  // dump of a model not listed replays uncalibrated.
  std::map<std::string, index::SelectionCalibration> calibrations;
  std::vector<RunSpec> runs;
  int64_t step_stride = 1;
  int64_t max_steps = 0;  // 0 = every step
  bool claims = true;
  int64_t claims_stride = 8;  // every claims_stride-th evaluated step
  std::vector<double> claim_fractions = {1.0 / 16, 1.0 / 8, 1.0 / 4};
};

struct RunResult {
  RunSpec spec;
  MetricAccumulator metrics;
  int64_t e2e_steps = 0;       // steps compared with kvtierd
  int64_t e2e_mismatches = 0;  // of which the selections differed
};

// Where attention goes: mass per query head and step, by the distance of
// the block from the query's own block.
inline constexpr int kDistanceBuckets = 8;
// "sink (block 0)", "own block", "1 back", "2 back", "3 back", "4-7 back",
// "8-15 back", "16+ back".
const char* DistanceBucketName(int bucket);

struct ReplayResult {
  std::string group;  // dump kind
  int32_t num_heads = 0;
  int32_t group_size = 1;
  int64_t block_bytes = 0;
  int64_t steps = 0;
  int64_t dumps = 0;
  double seconds = 0;
  std::map<std::string, std::unique_ptr<RunResult>> runs;  // by RunSpec::Key
  std::unique_ptr<ClaimsAccumulator> claims;
  std::vector<double> distance_mass = std::vector<double>(kDistanceBuckets);
};

// Expands the standard run list: every method x budget x timing (ahead:
// false, true, or both), "raw" and (unless stab_variant is false or the
// method is an oracle or "default") "stab", plus "stabrank" for harness
// scorers.
std::vector<RunSpec> StandardRuns(const std::vector<std::string>& methods,
                                  const std::vector<double>& budgets, const MethodOptions& options,
                                  bool stab_variant, const std::vector<bool>& timings = {false});

// InvalidArgument naming the bad method or option; errors of the methods.
absl::StatusOr<ReplayResult> RunReplay(const KvDump& dump, const ReplayConfig& config);

// Adds `from` into `into` (empty `into` takes from's shape).
absl::Status MergeReplay(const ReplayResult& from, ReplayResult* into);

}  // namespace kvtier::quality

#endif  // KVTIER_BENCH_QUALITY_REPLAY_H_
