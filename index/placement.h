// KeyDiff-based demotion order for the block store's placement policy.
//
// When a tier is full, demote first the blocks of a context that are most
// redundant: redundancy_b = (1 + cos(v_b, m)) / 2, m = mean of the context's
// normalised v_b (KeyDiff: keys like the mean key draw the least attention),
// combined with recency and stability:
//
//   priority_b = redundancy_weight * redundancy_b
//              + age_weight        * age_b        (0 newest .. 1 oldest)
//              - stability_weight  * stability_b  (0 .. 1)
//
// Highest priority is demoted first; ties go to the older block, then the
// lower index. age_b = (newest - last_access_b) / (newest - oldest) over the
// given blocks (0 when all are equal). With redundancy_weight = 0 and
// stability_weight = 0 this is LRU, the baseline.
//
// Thread safety: pure functions.
#ifndef KVTIER_INDEX_PLACEMENT_H_
#define KVTIER_INDEX_PLACEMENT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvtier::index {

struct DemotionWeights {
  float redundancy_weight = 1.0f;
  float age_weight = 0.5f;
  float stability_weight = 1.0f;
};

struct DemotionInput {
  int32_t dim = 0;
  absl::Span<const float> vectors;        // [n][dim] v_b, row-major
  absl::Span<const int64_t> last_access;  // [n], larger = more recent (any unit)
  absl::Span<const float> stability;      // [n] in [0, 1], or empty (all 0)
  // Mean of the context's normalised v_b [dim]; computed from `vectors`
  // when empty (pass it when `vectors` holds only some of the context).
  absl::Span<const float> context_mean;
};

// Indices into the input, in demotion order (demote front first). Also
// fills *priority (when not null) with priority_b per input block.
// InvalidArgument naming the field: no blocks, lengths that disagree with
// dim and n, NaN/Inf, stability outside [0, 1], non-finite weights.
absl::StatusOr<std::vector<int32_t>> RankForDemotion(const DemotionInput& input,
                                                     const DemotionWeights& weights,
                                                     std::vector<float>* priority);

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_PLACEMENT_H_
