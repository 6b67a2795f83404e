// The inputs of the long-context benchmarks (bench/select `long` and
// `reps`, kvtier_select_v2_bench --keys real): the shared copy model's
// dumps and its committed calibration, and the 7B-class calibration that
// LongContext's paired heads (head_dim 128) are scored with.
//
// Thread safety: pure functions.
#ifndef KVTIER_BENCH_QUALITY_LONG_INPUTS_H_
#define KVTIER_BENCH_QUALITY_LONG_INPUTS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/quality/kv_dump.h"
#include "index/select/calibration.h"

namespace kvtier::quality {

// The shared copy model's 1,024-token dumps (rkc-* in dumps_dir, sorted by
// name) into *dumps, and its committed calibration (austen-copy in
// calibration_dir) with copy tracking off into *copy: every head's terms
// then count at every step, the most work the mass tree does. NotFound or
// the reader's error, naming the folder or file.
absl::Status LoadLongInputs(const std::string& dumps_dir, const std::string& calibration_dir,
                            std::vector<KvDump>* dumps, index::SelectionCalibration* copy);

// The 7B-class calibration: the copy model's prior, every (layer, query
// head) of the paired shape a retrieval head (8 on 4 key heads, weight
// 0.5 each), the model's own softmax scale (1/8 of the 64-dim heads).
index::SelectionCalibration PairedCalibration(const index::SelectionCalibration& copy);

}  // namespace kvtier::quality

#endif  // KVTIER_BENCH_QUALITY_LONG_INPUTS_H_
