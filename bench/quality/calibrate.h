// Calibration of the mass scorer (index/select/calibration.h) from real attention:
// kvtier-eval --calibrate DUMP writes what a model's profile registers.
//
// From one dump (its decode steps, timed as `ahead` says: replay.h):
//   1. Distance priors, per head: the mean attention mass on the stored block
//      d blocks before the last one, over every step (sink blocks left out:
//      they are always selected). Distances seen in fewer than 1/8 of the
//      steps are pooled into the last entry, which stands for every larger
//      distance. The summed priors are then made non-increasing in distance
//      (pool adjacent violators): far bumps of one text are the retrieval
//      heads' business, so the prior alone ranks like a sliding window.
//   2. Head weights: each head's mean share of attention on stored blocks.
//      The sink block's share of the attention on stored blocks: from
//      min_sink_share up the sink is kept always (sink_blocks 1); below it
//      sink_blocks is 0 and the first block competes for the budget with
//      sink_weight times its own mean attention (sink_mass, calibration.h).
//   3. Retrieval heads, greedily: starting from the prior alone, each round
//      replays the dump through the daemon's own mass scorer (in process,
//      int8 keys) once per remaining head with that head added, and keeps
//      the head that raises the share of the oracle's free mass most at
//      `budget`; it stops when the best gain is below min_gain or at
//      max_heads. prior holds the sum over the heads not chosen, prior_all
//      the sum over all.
//
// A calibration fitted on a dump scores that dump optimistically: judge it
// on other dumps (docs/QUALITY.md calibrates on one window dump per model).
//
// Thread safety: Calibrate is reentrant; the JSON functions are pure.
#ifndef KVTIER_BENCH_QUALITY_CALIBRATE_H_
#define KVTIER_BENCH_QUALITY_CALIBRATE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bench/quality/kv_dump.h"
#include "bench/quality/replay_data.h"
#include "index/select/calibration.h"

namespace kvtier::quality {

struct CalibrateOptions {
  ReplayOptions replay;
  double budget = 1.0 / 8;
  bool ahead = true;
  int32_t sink_blocks = 1;   // as the daemon's select.sink_blocks
  int32_t local_blocks = 1;  // as select.local_blocks
  int32_t max_heads = 8;     // 0..kMaxRetrievalHeads
  double min_gain = 0.005;
  // Written into the calibration; the head search itself runs without it
  // (the gate is chosen on next-byte loss in a real decode loop, which a
  // replay of saved tensors cannot show: docs/QUALITY.md).
  float head_min_mass = 0.0f;
  // See step 2 (measured with sink_blocks 1).
  double min_sink_share = 0.01;
  // A sink that competes counts this many times its measured attention:
  // chosen on next-byte loss (docs/QUALITY.md; attention mass underrates
  // a sink).
  double sink_weight = 2.0;
  // Written into the calibration as they are, like head_min_mass: chosen
  // on next-byte loss in the decode loop (docs/QUALITY.md).
  float retrieval_share = 1.0f;
  int32_t copy_run = 0;  // copy tracking (index/select/calibration.h), 0 = off
  int32_t copy_hold = 64;
  int32_t copy_min_blocks = 4;
  int32_t copy_lead = 0;
  float copy_min_mass = -1.0f;
  float uncopied_weight = 0.0f;
  float copy_weight = 1.0f;
  // Called after each greedy round with a one-line summary (may be empty).
  std::function<void(const std::string&)> progress;
};

struct CalibrationResult {
  index::SelectionCalibration calibration;
  double share_prior = 0;           // the prior alone, at budget
  double sink_share = 0;            // attention on the sink blocks (see options)
  std::vector<double> share_after;  // after each chosen head
  std::string model;                // the dump's "model" metadata
  std::string source;               // the dump's name
};

// InvalidArgument for options out of range or a dump too short to replay.
absl::StatusOr<CalibrationResult> Calibrate(const KvDump& dump, const CalibrateOptions& options);

// JSON form (the fields of v1::SelectionCalibration, plus "model" and
// "source"):
//   {"model": "...", "source": "...", "num_q_heads": 4,
//    "retrieval_heads": [{"layer": 3, "q_head": 2}], "prior": [...],
//    "prior_all": [...], "head_weights": [...], "softmax_scale": 0}
std::string CalibrationToJson(const CalibrationResult& result);
// InvalidArgument naming the field for malformed input; the calibration is
// not validated against a layout here.
absl::StatusOr<CalibrationResult> CalibrationFromJson(absl::string_view text);

// Every *.json calibration in `dir`, by model. InvalidArgument naming the
// file for a bad one or two files of one model; NotFound for a missing dir.
absl::StatusOr<std::map<std::string, index::SelectionCalibration>> LoadCalibrations(
    const std::string& dir);

}  // namespace kvtier::quality

#endif  // KVTIER_BENCH_QUALITY_CALIBRATE_H_
