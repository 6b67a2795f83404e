// Where the harness gets the selections of the daemon's scorers from.
//
// The in-process backend runs the index library exactly as kvtierd links
// it: block summaries are computed from raw block payloads
// (index::ComputeBlockSummary, layout of index/summary/block_layout.h), the context
// is an index::ContextIndex (Grid/Chunk/Page tree + stability windows) and
// selection is index::Selector::Select. Head-variance weights
// (kKeyKeyWeighted) come from an index::HeadVarianceTracker fed with the
// blocks of Open, computed once.
//
// An end-to-end backend drives a running kvtierd through the same calls
// (RegisterProfile, PutBlocks, OpenContext with the Open blocks,
// AppendBlocks, Select with the same anchor/query/budget/step); the harness
// then checks that its selections equal the in-process ones step by step
// (kvtier-eval --endpoint).
//
// Thread safety: a backend is used by one thread.
#ifndef KVTIER_BENCH_QUALITY_BACKEND_H_
#define KVTIER_BENCH_QUALITY_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "index/select/calibration.h"
#include "index/select/selector.h"
#include "index/summary/block_layout.h"
#include "index/summary/summary.h"
#include "index/summary/summary_codec.h"

namespace kvtier::quality {

struct BackendConfig {
  index::BlockLayout layout;
  index::SelectorOptions selector;
  // dim and block_size_tokens are taken from layout; vector follows the
  // scorer.
  index::TreeOptions tree;
  index::ScorerKind scorer = index::ScorerKind::kKeyKey;
  // Summaries as the daemon's Summarizer computes them: in process they go
  // through this codec and back, as the daemon stores them.
  bool summary_bounds = true;      // min, max, radius (Quest, ArkVale)
  bool summary_per_layer = false;  // per-layer means (per-layer anchors)
  index::SummaryCodecOptions codec{index::SummaryEncoding::kFp32, false};
  // Registered with the profile (head keys are kept for its heads).
  index::SelectionCalibration calibration;
  // Per request: the stability filter, and the per-layer key-key settings.
  bool stability = true;
  bool centered = true;
  float recency_weight = 0.5f;
  // End-to-end: start kvtierd on its embedded defaults (only its paths and
  // capacities set) instead of this config's settings.
  bool shipped_defaults = false;
};

struct BackendSelect {
  // [head_dim] pooled, or [num_layers][head_dim] per layer; key-key scorers
  absl::Span<const float> anchor;
  absl::Span<const float> query;         // [head_dim]; Quest, ArkVale
  absl::Span<const float> head_queries;  // [R][head_dim]; mass
  int64_t budget_blocks = 0;             // includes sinks and local blocks
  int64_t step = 0;
  uint64_t seed = 0;
};

class SelectionBackend {
 public:
  virtual ~SelectionBackend() = default;
  // Opens the context with its first segment (>= 1 payload).
  virtual absl::Status Open(absl::Span<const std::string> payloads) = 0;
  // Appends one block to the context.
  virtual absl::Status Append(absl::string_view payload) = 0;
  virtual int64_t num_blocks() const = 0;
  // Weights used for weighted_mean (version 0 before Open).
  virtual const index::HeadWeights& head_weights() const = 0;
  // Chosen block positions, ascending.
  virtual absl::Status Select(const BackendSelect& request, std::vector<int64_t>* blocks) = 0;
};

absl::StatusOr<std::unique_ptr<SelectionBackend>> MakeInProcessBackend(const BackendConfig& config);

// A backend served by kvtierd (the end-to-end mode). The implementation
// lives in daemon_backend.h, linked only into the binaries that install it
// with SetDaemonBackendFactory, so that the rest of the harness does not
// depend on the daemon. Unimplemented when no factory was installed.
using DaemonBackendFactory = absl::StatusOr<std::unique_ptr<SelectionBackend>> (*)(
    const BackendConfig& config, const std::string& endpoint);
void SetDaemonBackendFactory(DaemonBackendFactory factory);
absl::StatusOr<std::unique_ptr<SelectionBackend>> MakeDaemonBackend(const BackendConfig& config,
                                                                    const std::string& endpoint);

}  // namespace kvtier::quality

#endif  // KVTIER_BENCH_QUALITY_BACKEND_H_
