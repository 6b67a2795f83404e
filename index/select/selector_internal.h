// Internals shared by the Selector's source files (selector.cc, the
// scoring and ranking of every scorer; selector_mass.cc, the mass scorer's
// sparse path): the ranking comparators and the per-thread scratch.
// Not part of the index's interface.
#ifndef KVTIER_INDEX_SELECT_SELECTOR_INTERNAL_H_
#define KVTIER_INDEX_SELECT_SELECTOR_INTERNAL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "index/select/key_scorers.h"
#include "index/select/mass_tree.h"
#include "index/select/rank.h"
#include "index/select/selector.h"

namespace kvtier::index {
namespace selector_internal {

// Moves the best `k` items of *v to its front; then, while the weight of the
// kept items is below `target_weight`, keeps the next best ones. Returns the
// number kept (>= 1 when v is not empty).
template <typename WeightFn>
inline size_t TopWithFloor(std::vector<ScoredIndex>* v, size_t k, WeightFn weight,
                           int64_t target_weight) {
  const size_t n = v->size();
  if (n == 0) return 0;
  k = std::clamp<size_t>(k, 1, n);
  auto first = v->begin();
  if (k < n) std::nth_element(first, first + k, v->end(), ByBetter());
  int64_t w = 0;
  for (size_t i = 0; i < k; ++i) w += weight((*v)[i].index);
  while (w < target_weight && k < n) {
    const double per_item = std::max(1.0, static_cast<double>(w) / k);
    size_t extra =
        static_cast<size_t>(std::ceil(static_cast<double>(target_weight - w) / per_item));
    extra = std::clamp<size_t>(extra, 1, n - k);
    if (k + extra < n) {
      std::nth_element(first + k, first + k + extra, v->end(), ByBetter());
    }
    for (size_t i = k; i < k + extra; ++i) w += weight((*v)[i].index);
    k += extra;
  }
  return k;
}

inline bool IsKeyKey(ScorerKind k) {
  return k == ScorerKind::kKeyKey || k == ScorerKind::kKeyKeyWeighted;
}

// A key-key request scored through the tree (pooled anchor).
inline bool TreeKeyKey(const SelectRequest& r) {
  return IsKeyKey(r.scorer) && static_cast<int64_t>(r.anchor.size()) == r.context->tree().dim();
}

inline float Affinity(float dot) { return std::clamp(0.5f * (1.0f + dot), 0.0f, 1.0f); }

inline int64_t CeilFraction(double fraction, int64_t n) {
  return static_cast<int64_t>(std::ceil(fraction * static_cast<double>(n)));
}

// The calibration's retrieval_share (calibration.h): keeps the retrieval
// terms of at most floor(retrieval_share * shape.free) pages of
// [shape.sinks, shape.local_first) (the largest terms; ties to the more
// recent page) and resets every other page's estimate there to its prior.
// est holds the mass estimates of all pages (MassScores with head
// queries); a no-op for share 1 or without queries. scratch is any
// reusable buffer.
void CapRetrievalTerms(const SelectionCalibration& c, bool with_queries, const RankShape& shape,
                       absl::Span<float> est, std::vector<ScoredIndex>* scratch);

}  // namespace selector_internal

struct Selector::Scratch {
  std::vector<float> q;  // normalised anchor
  std::vector<float> dots;
  std::vector<ScoredIndex> grids, chunks;
  RankScratch rank;             // the final ranking's pool, held, rising and scored pages
  std::vector<float> affinity;  // [N]; valid for pages scored this step
  KeyScorerScratch keys;        // per-layer key-key and mass
  // The mass tree (mass_tree.h): its buffers and this step's bumps.
  MassTreeScratch mass;
  // Threads the mass tree's head descents may use: num_threads when the
  // batch is one request (no other context to spread), else 1.
  int32_t head_slots = 1;
  std::vector<MassBump> bumps;
  std::vector<int32_t> order;  // distances by prior, this step
  // kGemm: scores of every level of this request's context (not owned).
  float* all_grid = nullptr;
  float* all_chunk = nullptr;
  float* all_page = nullptr;
};

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_SELECT_SELECTOR_INTERNAL_H_
