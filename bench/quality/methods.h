// The selection methods the harness compares, all at the same budget.
//
// Daemon scorers (run through backend.h, i.e. the index's Selector):
//   streamingllm     kRecency: sinks + the most recent blocks
//   random           kRandom
//   quest            kQuest on the pooled query and pooled bounds
//   arkvale          kArkVale on the pooled query (centre + radius)
//   keydiff          kKeyDiff: the most distinct blocks
//   keykey           kKeyKey: cos(pooled anchor, v_b), Grid/Chunk/Page tree
//   keykey_weighted  kKeyKeyWeighted (SamKV head-variance weights)
//   keykey_perlayer  kKeyKey with a per-layer anchor (per-layer int8 means,
//                    centred, mixed with recency: key_scorers.h)
//   mass             kMass with the calibration's head queries
//   mass_prior       kMass without head queries (the distance prior alone)
//   mass_ungated     kMass with head queries and the calibration's
//                    head_min_mass set to 0 (every retrieval share counts)
//   default          the daemon's embedded defaults (deploy/kvtierd.toml),
//                    sending what docs/API.md tells an engine to send: the
//                    pooled anchor, and head queries for a calibrated
//                    profile (needs SetShippedDefaultsFactory)
// Harness scorers (scores computed here over the store's complete blocks,
// then ranked by the Selector's own flat ranking, index/select/rank.h SelectFlat,
// with the same stability rule):
//   oracle           top blocks by the step's true mass (uses the answer)
//   h2o              half of the free budget to the most recent blocks, half
//                    to the blocks of highest attention mass accumulated
//                    over every earlier query position (heavy hitters)
//   snapkv           the same split with the mass from the last
//                    snapkv_window prompt queries (prompt blocks only; later
//                    blocks score 0 outside the recent half)
//   quest_head       Quest per (layer, query head) on per-head bounds,
//                    aggregated as sum_lh softmax_b(bound / sqrt(D))
//   arkvale_head     the same with ArkVale's sphere bound
//   meankey_head     sum_lh softmax_b(q_lh . mean_lh,b / sqrt(D))
//   keykey_flat      index kKeyKey on pooled v_b without the tree
//   keykey_layer     mean over layers of cos(anchor_l, layer mean_l,b)
//   keykey_head      mean over (layer, KV head) of cos(anchor_lh, mean_lh,b)
//   keykey_head_norope  keykey_head on keys with the rotary embedding undone
//                    (replay_data.h): content similarity without position
//   *_centered       the same after subtracting the context's mean vector
//                    (of that layer / head / pool) from anchor and v_b
//   keykey_head_softmax  sum_lh softmax_b(anchor_lh . mean_lh,b / sqrt(D))
// and mixes "<a>+<b>:w" = (1 - w) * norm(a) + w * norm(b), where norm()
// maps a step's scores min-max to [0, 1] (e.g. "keykey_layer+recency:0.3").
//
// Every method returns the visible blocks it keeps, ascending, including
// the forced ones (sinks, local window, partial block); never more than
// the budget.
//
// Thread safety: a Method holds per-context state; one thread per Method.
#ifndef KVTIER_BENCH_QUALITY_METHODS_H_
#define KVTIER_BENCH_QUALITY_METHODS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "bench/quality/backend.h"
#include "bench/quality/replay_data.h"
#include "index/select/selector.h"
#include "index/select/stability.h"

namespace kvtier::quality {

class Method {
 public:
  virtual ~Method() = default;
  virtual absl::Status Select(const StepInput& in, std::vector<int64_t>* blocks) = 0;
};

// How the final ranking uses the stability windows.
//   kOff    the scorer's ranking alone (weight 0, no holding)
//   kIndex  the index's rule (stability.h): relevant = affinity > theta,
//           stability = set bits / W
//   kRank   harness-only (flat scorers): relevant = among the step's best
//           `free` pages by affinity (no absolute threshold), stability =
//           set bits / min(W, steps since the page appeared), so a new page
//           is not ranked below old ones for lack of history
enum class StabilityMode : uint8_t { kOff, kIndex, kRank };

struct MethodOptions {
  int32_t sink_blocks = 1;   // complete blocks, as SelectorOptions
  int32_t local_blocks = 0;  // complete blocks besides the partial one
  StabilityMode stability = StabilityMode::kOff;
  index::StabilityOptions stability_options;
  int32_t pages_per_chunk = 16;
  int32_t chunks_per_grid = 16;
  double page_keep_fraction = 0.1;
  double chunk_keep_fraction = 0.2;
  double grid_keep_fraction = 0.5;
  uint64_t seed = 7;
  // Per-layer key-key (keykey_perlayer): int8 per-layer means, centring and
  // the recency mix.
  bool layer_int8 = true;
  bool centered = true;
  float recency_weight = 0.5f;
  // The daemon methods' profile calibration when set (else the dump's,
  // ReplayData::calibration): lets one replay compare calibrations.
  std::optional<index::SelectionCalibration> calibration;
  // When set, daemon scorers run against kvtierd here (backend.h).
  std::string endpoint;
};

// The BackendConfig of kvtierd's embedded defaults for `layout` (linked in
// with the daemon; see daemon_backend.h).
using ShippedDefaultsFactory = absl::StatusOr<BackendConfig> (*)(const index::BlockLayout& layout);
void SetShippedDefaultsFactory(ShippedDefaultsFactory factory);

// The Selector options `o` implies.
index::SelectorOptions SelectorOptionsFor(const MethodOptions& o);

// Names of every known base method, daemon scorers first.
const std::vector<std::string>& MethodNames();
// True for the daemon scorers (served by kvtierd's Select).
bool IsDaemonMethod(const std::string& name);
// True for the daemon methods whose scorer is `mass`: their sink and local
// blocks are the calibration's (the selector's per-profile forced set).
bool UsesMassScorer(const std::string& name);
// InvalidArgument naming the unknown part of `name` (mixes included).
absl::Status CheckMethodName(const std::string& name);

absl::StatusOr<std::unique_ptr<Method>> MakeMethod(const std::string& name, const ReplayData& data,
                                                   const MethodOptions& o);

// Raw scores of harness scorer `name` over the first in.num_complete blocks.
// *unit is set when the scores already lie in [0, 1].
absl::Status HarnessScores(const std::string& name, const ReplayData& data, const StepInput& in,
                           std::vector<float>* scores, bool* unit);

// One step of FlatSelectRank: every page's affinity, the budget in pages
// and the step.
struct FlatRankStep {
  absl::Span<const float> affinity;
  int64_t budget = 0;
  int64_t step = 0;
};
// The Selector's flat ranking (index/select/rank.h, SelectFlat) with
// StabilityMode::kRank instead of the index rule: a page is observed as
// relevant when it is among this step's best `budget`, and its stability
// is scaled to its age. first_seen[p] is the step page p appeared at
// (grown and filled here).
void FlatSelectRank(const index::SelectorOptions& options, const FlatRankStep& in,
                    index::StabilityTracker* tracker, std::vector<int64_t>* first_seen,
                    std::vector<int64_t>* blocks);

// Budget of a step: ceil(fraction * num_blocks), at least one block more
// than the forced ones, at most num_blocks.
int64_t StepBudget(double fraction, int64_t num_blocks, int64_t forced);

}  // namespace kvtier::quality

#endif  // KVTIER_BENCH_QUALITY_METHODS_H_
