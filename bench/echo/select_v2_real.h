// kvtier_select_v2_bench --keys real: the shipped mass Select through an
// in-process kvtierd on real keys, driven as an engine drives it, beside
// the pooled-anchor Select of the same blocks in the same run.
//
// The context is a quality::LongContext of --tokens tokens built from the
// shared copy model's dumps with paired heads: a 7B-class head dimension
// (128) with real structure, and copy heads whose targets are real and far
// back. The daemon's profile is that shape (4 layers, 1 KV head of
// head_dim 128, 2 query heads, 16 tokens, fp16: 32 KiB blocks, values zero)
// calibrated with quality::PairedCalibration (8 retrieval heads on 4 key
// heads), so the daemon computes every block's summary and int8 head keys
// from the payload, as it does for an engine's blocks.
//
// Per select.batch_threads value: a fresh daemon on its embedded defaults
// (only its paths, tier capacities and that setting given); the blocks
// before the first step are put and two contexts of them opened; then per
// decode step (the model's own queries at consecutive tokens) the block
// the position completes is put and appended to both, and one Select per
// method goes on its own stream, budget 1/32 of the blocks:
//   mass (shipped)  no scorer named, the 8 heads' queries
//   pooled anchor   SCORER_KEY_KEY, the mean key of the last 8 tokens
//                   (client/anchor.h)
// Reported per method: the gRPC round trip p50/p99 over the steps, the
// steps whose choice holds the copied passage's next page (a target the
// copy heads attend), and for mass the daemon's exported work
// (kvtier_select_mass_*): the share of head-steps that reused and the
// pages read per head-step.
//
// Thread safety: single-threaded driver.
#ifndef KVTIER_BENCH_ECHO_SELECT_V2_REAL_H_
#define KVTIER_BENCH_ECHO_SELECT_V2_REAL_H_

#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::bench {

struct RealKeysOptions {
  int64_t tokens = 131072;            // a multiple of 16, >= 2048
  int32_t steps = 64;                 // consecutive decode steps, <= 256
  std::vector<int> threads = {1, 2};  // select.batch_threads values
  std::string out;                    // also write the markdown report here
  std::string dumps_dir;              // the shared realkv dumps
  std::string calibration_dir;        // bench/quality/calibration
};

// Prints the table (and writes options.out). Returns the process exit
// code: 0, or 1 after a message on stderr.
int RunRealKeys(const RealKeysOptions& options);

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_ECHO_SELECT_V2_REAL_H_
