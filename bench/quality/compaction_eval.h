// kvtier-eval --compaction: how well SelKV compaction (index/selkv.h)
// preserves attention on saved Q/K/V, against plain eviction.
//
// Protocol, per dump and per (layer, KV head):
//   1. Compact the prefix [0, T0) with index::CompactHead at retention rho.
//      Observation queries ("window"): the W queries at positions
//      [T0 - W, T0) of every query head that reads this KV head, with their
//      positions (causal). H2O ("all"): every query of [0, T0), causal.
//   2. For every later query position t in [T0, T) and every query head h
//      of the layer, the attention output over the compacted prefix (keys,
//      merged values, logit bias added to q.k / sqrt(D)) followed by the
//      exact tokens [T0, t], and over the full exact cache [0, t]:
//        err = ||o_c - o_f|| / ||o_f||      (0 when ||o_f|| = 0)
//   3. Summaries over queries, heads and layers: mean, median and p90 of
//      err, per dump, per dump kind (the "group") and over all dumps.
// Besides index::CompactHead's methods, "evict_streamingllm" keeps the
// first 4 tokens and the most recent ones (no merge): the sliding window
// that a local model is known to favour, computed here, not by selkv.
//
// Thread safety: pure functions (file writes aside); EvaluateCompaction may
// run on several dumps at once.
#ifndef KVTIER_BENCH_QUALITY_COMPACTION_EVAL_H_
#define KVTIER_BENCH_QUALITY_COMPACTION_EVAL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/quality/kv_dump.h"
#include "index/selkv.h"

namespace kvtier::quality {

// Which observation queries a method is given.
enum class ObservationQueries : uint8_t {
  kNone = 0,    // keys only
  kWindow = 1,  // the W queries before T0 (causal positions)
  kAll = 2,     // every query of [0, T0) (causal positions)
};

struct CompactionMethod {
  std::string name;
  index::CompactOptions options;  // rho is overwritten per run
  ObservationQueries queries = ObservationQueries::kWindow;
  bool streaming = false;  // sink + recent window instead of selkv
};

// The methods of docs/QUALITY.md "Compaction (SelKV)", in table order.
std::vector<CompactionMethod> DefaultCompactionMethods();

struct CompactionEvalOptions {
  int64_t prefix_tokens = 768;  // T0: 1 <= T0 < seq_len
  int32_t window = 32;          // W: 1 <= W <= T0
  std::vector<double> rhos = {0.25, 0.5};
  std::vector<CompactionMethod> methods = DefaultCompactionMethods();
};

// Relative L2 errors of one (method, rho): errors[l] holds one value per
// (query position, query head) of layer l.
struct CompactionRun {
  std::string method;
  double rho = 0;
  std::vector<std::vector<float>> errors;  // [layer][t * q_heads + h]
  int64_t kept_tokens = 0;                 // per (layer, KV head)
};

struct CompactionDumpResult {
  std::string dump;
  std::string group;  // dump kind
  int32_t num_layers = 0;
  std::vector<CompactionRun> runs;  // methods x rhos, in options order
  double seconds = 0;
};

// InvalidArgument when the options do not fit the dump; errors of
// CompactHead are passed on with the layer and head named.
absl::StatusOr<CompactionDumpResult> EvaluateCompaction(const KvDump& dump,
                                                        const CompactionEvalOptions& options);

struct ErrorSummary {
  double mean = 0, median = 0, p90 = 0;
  int64_t count = 0;
};
ErrorSummary SummariseErrors(std::vector<float> errors);

// compaction.csv: one row per (scope, method, rho, layer) where scope is a
// dump, a group or "all" and layer -1 means every layer.
std::string CompactionCsv(const std::vector<CompactionDumpResult>& results);
// compaction.md: per group, a table of mean / median / p90 per method and
// rho, then per-layer means at every rho.
std::string CompactionMarkdown(const std::vector<CompactionDumpResult>& results,
                               const CompactionEvalOptions& options, const std::string& command);

// Writes compaction.csv and compaction.md into out_dir (which must exist).
absl::Status WriteCompactionReport(const std::string& out_dir,
                                   const std::vector<CompactionDumpResult>& results,
                                   const CompactionEvalOptions& options,
                                   const std::string& command);

}  // namespace kvtier::quality

#endif  // KVTIER_BENCH_QUALITY_COMPACTION_EVAL_H_
