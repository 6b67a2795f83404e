// Selection calibration of one model profile: what the mass scorer
// (mass_scorer.h) needs to estimate, for every stored block, how much
// attention the next decode step will give it.
//
// Attention of most heads is local and predictable from position alone;
// a few heads retrieve (copy, look up) far back (DuoAttention and
// RazorAttention make the same split). A calibration therefore holds
//
//   prior[d]         expected attention mass, summed over the heads that are
//                    NOT retrieval heads, on the block d blocks before the
//                    context's last block (d = 0 is the last block). The
//                    last entry stands for every larger distance.
//   prior_all[d]     the same summed over every head: used when a request
//                    carries no head queries.
//   retrieval_heads  (layer, query head) pairs whose current queries the
//                    engine sends with every Select (head_queries); their
//                    KV heads' keys are kept per block as int8 (summary.h).
//   head_weights     per retrieval head, the share of its mass that falls
//                    on stored blocks (1 - its mass on the engine's own
//                    partial block), in (0, 1]; empty means 1 for each.
//   softmax_scale    the model's attention scale; 0 means 1/sqrt(head_dim).
//   head_min_mass    a retrieval head's estimated attention on a block
//                    counts only from this share up, in [0, 1): below it the
//                    head has no target worth a block (its attention is
//                    spread), and the prior decides. 0 counts everything.
//
// Calibrations are computed offline from real attention (kvtier-eval
// --calibrate, bench/quality/calibrate.h) and registered with the profile.
//
// Thread safety: plain values; the functions are pure.
#ifndef KVTIER_INDEX_CALIBRATION_H_
#define KVTIER_INDEX_CALIBRATION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "index/block_layout.h"

namespace kvtier::index {

inline constexpr int32_t kMaxRetrievalHeads = 64;
inline constexpr int32_t kMaxPriorBlocks = 4096;

struct HeadRef {
  int32_t layer = 0;
  int32_t q_head = 0;
  friend bool operator==(const HeadRef&, const HeadRef&) = default;
};

struct SelectionCalibration {
  int32_t num_q_heads = 0;  // query heads per layer; 0 = uncalibrated
  std::vector<HeadRef> retrieval_heads;
  std::vector<float> prior;
  std::vector<float> prior_all;
  std::vector<float> head_weights;
  float softmax_scale = 0.0f;
  float head_min_mass = 0.0f;

  bool calibrated() const { return num_q_heads > 0; }
  friend bool operator==(const SelectionCalibration&,
                         const SelectionCalibration&) = default;
};

// OK for an uncalibrated value (num_q_heads 0 and every list empty) or one
// that fits `layout`: num_q_heads a multiple of num_kv_heads (<= 4096),
// retrieval heads within [0, layers) x [0, num_q_heads), distinct, at most
// kMaxRetrievalHeads; prior and prior_all of equal length in [1,
// kMaxPriorBlocks], finite and >= 0; head_weights empty or one per
// retrieval head in (0, 1]; softmax_scale finite and >= 0; head_min_mass in
// [0, 1). Otherwise
// InvalidArgument naming the field ("calibration.prior[3]", ...).
absl::Status ValidateCalibration(const SelectionCalibration& calibration,
                                 const BlockLayout& layout);

// The KV heads whose keys a calibrated profile keeps per block, as
// layer * num_kv_heads + kv_head, ascending and distinct.
std::vector<int32_t> KeyHeadsOf(const SelectionCalibration& calibration,
                                int32_t num_kv_heads);

// For retrieval head i, the index of its KV head in KeyHeadsOf().
std::vector<int32_t> KeyHeadSlots(const SelectionCalibration& calibration,
                                  int32_t num_kv_heads);

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_CALIBRATION_H_
