// kvtier_select_bench --scenario long: the shipped mass scorer at 16K-1M
// tokens and batches of 1-64 sequences, in process, side by side with the
// flat mass pass it replaces, the pooled key-key tree and an exact int8
// scan of the same retrieval keys (what reading every key costs).
//
// Keys and queries are real (bench/quality/long_context.h: the shared copy
// model's dumps, re-rotated into long contexts with the copied passage far
// back). Two shapes:
//   7b     7B-class head_dim 128 (each key head the two 64-dim KV heads of a
//          layer side by side), 8 retrieval heads on 4 key heads
//   small  the shared model's own shape (head_dim 64) and its calibration
//          (3 retrieval heads on 3 KV heads)
// Driven as an engine drives the daemon: per (shape, tokens, batch), 64
// consecutive decode steps (32 with --quick), the query of each the
// model's own at that token; each step first appends the pages its
// position completes, then one SelectBatch of the batch's contexts per
// method, each method on its own copy of the contexts. Methods: the flat
// pass (the reference), the sparse path as shipped (reuse from step to
// step, mass_tree.h), the sparse path descending at every step, and the
// sparse path reusing at any query drift (what reuse would save, and
// lose, without its cosine gate); the pooled key-key tree and an exact
// int8 scan of every retrieval key on the same threads. Reported per
// method: Select latency p50/p99, pages read per head, key bytes touched,
// expected mass of the choice against the flat pass's (the flat pass's own
// estimates), the retrieval targets of the flat pass's choice it keeps,
// the share of head-steps that reused, index bytes per token and as a
// share of a 7B-class KV cache.
#ifndef KVTIER_BENCH_SELECT_LONG_SCENARIO_H_
#define KVTIER_BENCH_SELECT_LONG_SCENARIO_H_

#include <cstdio>
#include <string>
#include <vector>

#include "bench/quality/kv_dump.h"
#include "index/select/calibration.h"

namespace kvtier::bench {

struct LongScenarioOptions {
  std::string dumps_dir;        // the shared realkv dumps
  std::string calibration_dir;  // bench/quality/calibration
  bool quick = false;           // 16K, 128K and 64 x 32K, 32 steps
  int threads = 2;
};

// quality::LoadLongInputs from the options' folders; false (after a
// message on stderr) when they cannot be read.
bool LoadLongInputs(const LongScenarioOptions& options, std::vector<quality::KvDump>* dumps,
                    index::SelectionCalibration* copy);

// Prints rows, writes OUT_DIR/select_long.csv and select_long.md. Returns
// false (after a message on stderr) when the dumps cannot be read.
bool RunLongScenario(const LongScenarioOptions& options, const std::string& out_dir);

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_SELECT_LONG_SCENARIO_H_
