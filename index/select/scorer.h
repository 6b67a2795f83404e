// Block scorers: pure functions from block summaries (+ an anchor or query)
// to one relevance score per block, higher = more worth keeping. The daemon's
// Selector and the quality harness (bench/quality) use the same functions.
//
//   kind            input     score of block b
//   kKeyKey         anchor    (1 + cos(anchor, mean_b)) / 2             [0,1]
//   kKeyKeyWeighted anchor    (1 + cos(anchor, weighted_mean_b)) / 2    [0,1]
//                             (SamKV head weighting; reduce a per-head
//                             anchor with WeightedAnchor, summary.h)
//   kQuest          query     sum_i max(q_i * max_bi, q_i * min_bi)  (raw)
//                             (upper bound of q.k over the block's keys)
//   kArkVale        query     q . mean_b + |q| * radius_b            (raw)
//                             (bound over ArkVale's bounding sphere; the
//                             bounding-box bound is exactly kQuest)
//   kKeyDiff        none      (1 - cos(mean_b, m)) / 2 with m the mean of
//                             the normalised mean_b of the view     [0,1]
//   kRecency        none      (b + 1) / N (StreamingLLM's recent window) [0,1]
//   kRandom         seed,step uniform in [0,1) from (seed, step, b)    [0,1)
//   kMass           calibration, the expected attention mass of b (raw); see
//                   head queries  key_scorers.h. It needs a context's KeyTable,
//                                 so it runs only inside the Selector
//                                 (ScoreBlocks refuses it).
//
// A block whose vector has zero norm has cos 0 (score 0.5). Every score is
// finite for finite input: norms are scale-safe (unit_vector.h); Quest and
// ArkVale bounds are accumulated in double and saturate at +-FLT_MAX (the
// Selector divides the query by its largest component first, which keeps
// their ranking and avoids saturation).
//
// Thread safety: scorers hold no state; every function here is thread-safe.
// The view's arrays must not change during a call.
#ifndef KVTIER_INDEX_SELECT_SCORER_H_
#define KVTIER_INDEX_SELECT_SCORER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "index/summary/summary.h"

namespace kvtier::index {

enum class ScorerKind : uint8_t {
  kKeyKey = 0,
  kKeyKeyWeighted = 1,
  kQuest = 2,
  kArkVale = 3,
  kKeyDiff = 4,
  kRecency = 5,
  kRandom = 6,
  kMass = 7,
};

// "keykey", "keykey_weighted", "quest", "arkvale", "keydiff", "recency",
// "random", "mass".
absl::string_view ScorerName(ScorerKind kind);
absl::StatusOr<ScorerKind> ParseScorerKind(absl::string_view name);
// True when the scorer's output lies in [0, 1] (others are raw bounds).
bool ScoresInUnitInterval(ScorerKind kind);

// Read-only structure-of-arrays view of N blocks, row-major [N][dim]. Not
// owning. Arrays a scorer does not use may be null.
struct SummaryView {
  int32_t dim = 0;
  int64_t num_blocks = 0;
  const float* mean = nullptr;           // kKeyKey, kArkVale, kKeyDiff
  const float* weighted_mean = nullptr;  // kKeyKeyWeighted
  const float* min = nullptr;            // kQuest
  const float* max = nullptr;            // kQuest
  const float* radius = nullptr;         // [N], kArkVale
};

struct ScoreInput {
  absl::Span<const float> anchor;  // [dim], key-key scorers
  absl::Span<const float> query;   // [dim], kQuest and kArkVale
  uint64_t seed = 0;               // kRandom
  int64_t step = 0;                // kRandom
};

// Writes one score per block into out (out.size() == view.num_blocks).
// InvalidArgument naming the field: empty view, missing array for the kind,
// out of the wrong size, anchor/query of the wrong dimension, NaN/Inf or zero
// norm.
absl::Status ScoreBlocks(ScorerKind kind, const SummaryView& view, const ScoreInput& input,
                         absl::Span<float> out);

// Owning SoA table of summaries, the usual way to build a SummaryView.
// Not synchronised: one writer, or many readers after building.
class SummaryTable {
 public:
  // layer < 0: whole-block vectors (mean, weighted_mean, min, max, radius).
  // layer >= 0: that layer's layer_mean / layer_min / layer_max (radius and
  // weighted_mean are not per layer and are left out).
  explicit SummaryTable(int32_t dim, int32_t layer = -1);

  // Appends one block. InvalidArgument when its dim differs, it lacks the
  // mean (or the layer asked for), a value is not finite, or it disagrees
  // with earlier blocks on which optional arrays are present.
  absl::Status Add(const BlockSummary& summary);

  SummaryView view() const;
  int64_t size() const { return num_blocks_; }

 private:
  int32_t dim_;
  int32_t layer_;
  int64_t num_blocks_ = 0;
  bool has_weighted_ = false;
  bool has_bounds_ = false;
  std::vector<float> mean_, weighted_mean_, min_, max_, radius_;
};

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_SELECT_SCORER_H_
