// The final ranking of a Select step: one function for every path of the
// Selector (selector.cc: the key-key tree, the flat scorers, the window
// path; selector_mass.cc: the mass scorer's sparse path) and for the
// quality harness's own scorers (bench/quality/methods.cc), so the harness
// ranks exactly as the daemon does.
//
//   RankScored  observes each scored page ("affinity > theta"), pools it
//               at (1 - w) * affinity + w * stability, adds the pages
//               stability holds, then RankPool.
//   RankPool    keeps the sinks, the best `free` of the pool (Better: the
//               higher score, ties to the lower page; BetterRecent for the
//               mass scorer, whose prior is flat past its end: ties to the
//               more recent page) and the local window; writes each
//               chosen page's affinity (0 when not observed this step) and
//               the prefetch list (rising pages that lost, most stable
//               first, at most max_prefetch).
//   RankFlat    RankScored over every page but the sinks and local window
//               (observed too): the Selector's flat scorers.
//   SelectFlat  a whole step over one affinity per page, from the
//               tracker's BeginStep on (the quality harness's scorers).
//
// Thread safety: pure functions of their arguments; the tracker and the
// scratch are the caller's.
#ifndef KVTIER_INDEX_SELECT_RANK_H_
#define KVTIER_INDEX_SELECT_RANK_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "index/select/stability.h"

namespace kvtier::index {

struct SelectResult;

struct ScoredIndex {
  float score;
  int32_t index;
};

// Strict total order: higher score first, then lower index. Every top-k
// uses it, so the kept sets do not depend on the input order.
inline bool Better(const ScoredIndex& a, const ScoredIndex& b) {
  return a.score > b.score || (a.score == b.score && a.index < b.index);
}
// The mass scorer's ties go to the more recent block.
inline bool BetterRecent(const ScoredIndex& a, const ScoredIndex& b) {
  return a.score > b.score || (a.score == b.score && a.index > b.index);
}
// As function objects, so that the selection algorithms inline them (a
// function pointer costs a call per comparison).
struct ByBetter {
  bool operator()(const ScoredIndex& a, const ScoredIndex& b) const { return Better(a, b); }
};
struct ByBetterRecent {
  bool operator()(const ScoredIndex& a, const ScoredIndex& b) const { return BetterRecent(a, b); }
};

struct RankOptions {
  StabilityOptions stability;
  bool use_stability = true;  // false: w = 0 and nothing is held
  bool recent_ties = false;   // BetterRecent instead of Better
  int64_t max_prefetch = 0;
};

// Pages [0, sinks) and [local_first, n) are always chosen; `free` more come
// from the pool.
struct RankShape {
  int64_t n = 0, sinks = 0, local_first = 0, free = 0;
};

// What a ranking reads: the shape, one affinity per page ([shape.n], read
// at the scored, held and chosen pages) and the context's stability
// windows (updated).
struct RankInput {
  RankShape shape;
  absl::Span<const float> affinity;
  StabilityTracker* tracker = nullptr;
};

// Reused buffers (grown, never shrunk).
struct RankScratch {
  std::vector<ScoredIndex> pool;
  std::vector<int64_t> held;
  std::vector<std::pair<float, int64_t>> rising;
  // Pages scored this step outside the sinks and local window (RankFlat
  // fills it; the Selector's tree descent too, before RankScored).
  std::vector<int32_t> scored;
};

// See the file comment. `scored` lists pages outside the sinks and local
// window. out's blocks, scores and prefetch are appended to (the caller
// clears them); out->candidates is set, out->held added to.
void RankScored(const RankOptions& options, const RankInput& in, absl::Span<const int32_t> scored,
                RankScratch* scratch, SelectResult* out);

// scratch->pool ranked into out (nth-partitioned at free already when
// `partitioned`).
void RankPool(const RankOptions& options, const RankInput& in, bool partitioned,
              RankScratch* scratch, SelectResult* out);

// Every page scored: observes the sinks and local window, lists the other
// pages in scratch->scored, then RankScored.
void RankFlat(const RankOptions& options, const RankInput& in, RankScratch* scratch,
              SelectResult* out);

// One step of a flat scorer's affinities, as the Selector runs it.
struct FlatStep {
  absl::Span<const float> affinity;  // one per page: n = its size
  int64_t sink_blocks = 0;           // min(sink_blocks, n) are kept
  int64_t local_blocks = 0;          // and the last min(local_blocks, n - sinks)
  int64_t budget = 0;                // >= n keeps every page
  int64_t step = 0;
};

// Resizes the tracker and begins step.step (InvalidArgument, nothing
// changed, when it is before the last step begun), then RankFlat. out's
// blocks, scores and prefetch are cleared first.
absl::Status SelectFlat(const RankOptions& options, const FlatStep& step, StabilityTracker* tracker,
                        RankScratch* scratch, SelectResult* out);

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_SELECT_RANK_H_
