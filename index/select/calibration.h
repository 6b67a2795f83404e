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
//   sink_blocks,     blocks at the start / end of a context always
//   local_blocks     selected for this profile; -1 = the selector's options
//                    (the daemon's select.sink_blocks / local_blocks).
//   sink_mass,       the first block's expected attention (summed like
//   sink_mass_all    prior / prior_all), or -1: when set, the first block's
//                    estimate is max(its prior, this), so it competes for
//                    the budget as any block does (calibrations set
//                    sink_blocks 0 with it: a model that puts almost no
//                    attention on its first block does not keep it).
//   retrieval_share  share of the free budget (budget - sinks - local) that
//                    blocks carrying a retrieval term may take from the
//                    blocks the prior ranks first, in (0, 1]: the terms
//                    beyond it (the smallest) are dropped for that step, so
//                    a copy head followed in plain text cannot push out
//                    more recent context than the calibration allows.
//   copy_run         copy tracking, 0 = off (every head's terms count as
//                    they are). On, a retrieval head is *copying* from a
//                    Select where its strongest key (the one token of all
//                    stored blocks its query scores highest) has moved
//                    forward exactly as far as the step since the Select
//                    before, copy_run Selects in a row, and lies at least
//                    copy_min_blocks blocks before the last block; it stays
//                    copying for copy_hold steps after the last such Select.
//                    A copying head's terms count from copy_min_mass up
//                    (-1: head_min_mass), on its attention moved copy_lead
//                    tokens forward (0..key tokens; 1 when Selects are
//                    used one step later, as docs/API.md tells engines:
//                    the head reads the token after its strongest one
//                    then); a head that is not copying counts
//                    uncopied_weight of its terms (0: none, so the prior,
//                    a sink plus recency, decides). A copying head counts
//                    copy_weight times its terms (>= 1; above 1 its
//                    target outranks the recent blocks the prior ranks
//                    first, so a tight budget gives it a slot). A copy head that follows
//                    a passage moves one token per step; one that matches a
//                    short phrase in plain text does not keep it up, and
//                    following it there makes the model copy the wrong
//                    continuation (docs/QUALITY.md).
//
// Calibrations are computed offline from real attention (kvtier-eval
// --calibrate, bench/quality/calibrate.h) and registered with the profile.
//
// Thread safety: plain values; the functions are pure.
#ifndef KVTIER_INDEX_SELECT_CALIBRATION_H_
#define KVTIER_INDEX_SELECT_CALIBRATION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "index/summary/block_layout.h"

namespace kvtier::index {

inline constexpr int32_t kMaxRetrievalHeads = 64;
inline constexpr int32_t kMaxPriorBlocks = 4096;
inline constexpr int32_t kMaxForcedBlocks = 4096;  // sink_blocks, local_blocks

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
  int32_t sink_blocks = -1;
  int32_t local_blocks = -1;
  float sink_mass = -1.0f;
  float sink_mass_all = -1.0f;
  float retrieval_share = 1.0f;
  int32_t copy_run = 0;
  int32_t copy_hold = 64;
  int32_t copy_min_blocks = 4;
  float copy_min_mass = -1.0f;
  float uncopied_weight = 0.0f;
  int32_t copy_lead = 0;
  float copy_weight = 1.0f;

  bool calibrated() const { return num_q_heads > 0; }
  friend bool operator==(const SelectionCalibration&, const SelectionCalibration&) = default;
};

// OK for an uncalibrated value (num_q_heads 0 and every list empty) or one
// that fits `layout`: num_q_heads a multiple of num_kv_heads (<= 4096),
// retrieval heads within [0, layers) x [0, num_q_heads), distinct, at most
// kMaxRetrievalHeads; prior and prior_all of equal length in [1,
// kMaxPriorBlocks], finite and >= 0; head_weights empty or one per
// retrieval head in (0, 1]; softmax_scale finite and >= 0; head_min_mass in
// [0, 1); sink_blocks and local_blocks -1 or in [0, 4096]; sink_mass and
// sink_mass_all -1 or finite and >= 0, both or neither; retrieval_share in
// (0, 1]; copy_run, copy_min_blocks and copy_lead in [0, 4096], copy_hold
// in [0, 1 << 20], copy_min_mass -1 or in [0, 1), uncopied_weight in
// [0, 1], copy_weight in [1, 64].
// Otherwise InvalidArgument naming the
// field ("calibration.prior[3]", ...).
absl::Status ValidateCalibration(const SelectionCalibration& calibration,
                                 const BlockLayout& layout);

// The estimate of block b of n before any retrieval term: prior (with head
// queries) or prior_all at its distance n - 1 - b (the last entry for every
// larger distance), or for b == 0 with a sink mass the larger of that and
// the sink's. Requires a calibrated c and 0 <= b < n.
inline float PriorOf(const SelectionCalibration& c, bool with_queries, int64_t n, int64_t b) {
  const std::vector<float>& prior = with_queries ? c.prior : c.prior_all;
  const int64_t last = static_cast<int64_t>(prior.size()) - 1;
  const float p = prior[n - 1 - b < last ? n - 1 - b : last];
  const float sink = with_queries ? c.sink_mass : c.sink_mass_all;
  return b == 0 && sink > p ? sink : p;
}

// The KV heads whose keys a calibrated profile keeps per block, as
// layer * num_kv_heads + kv_head, ascending and distinct.
std::vector<int32_t> KeyHeadsOf(const SelectionCalibration& calibration, int32_t num_kv_heads);

// For retrieval head i, the index of its KV head in KeyHeadsOf().
std::vector<int32_t> KeyHeadSlots(const SelectionCalibration& calibration, int32_t num_kv_heads);

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_SELECT_CALIBRATION_H_
