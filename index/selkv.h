// SelKV compaction of one attention head's cached keys and values
// (../shared/DESIGN.md section 1, "SelKV").
//
// Given the T cached tokens of one (layer, KV head) — keys after rotary
// embedding, values — keep a fraction rho of them and fold the rest into
// the kept ones:
//
//   1. Importance of every token (higher = keep):
//        kKeyDiff  -cos(k_i, mean of the normalised keys)   (no queries)
//        kSnapKV   attention the observation-window queries give token i:
//                  mean over the W queries (and the query heads sharing
//                  this KV head) of softmax(q . k / sqrt(D)) restricted to
//                  the T tokens, i.e. a_i (sums to 1 over i)
//        kH2O      accumulated attention: the same softmax for every query
//                  given (each query w sees only tokens i <= positions of
//                  w when `query_positions` is given), summed, not averaged
//      (with query_positions, kSnapKV's softmax is causal too: a row that
//      cannot see token i gives it 0). The kept set is the K = KeptSlots(T,
//      rho) most important tokens (ties: lower index first), always in
//      ascending token order.
//   2. Routing: each evicted token e goes to the kept token t of highest
//      cos(k_e, k_t) (ties: lower index).
//   3. Merge (Merge::kGated): gate g_e = max(cos(v_e, v_t), 0) with v_t the
//      kept token's own value (so the result does not depend on the order
//      of the routed tokens). Whenever queries are given (whatever the
//      importance) a_i is the observation attention of token i: the mean
//      over the W query rows of their softmax weight on i, causal as above
//      (kSnapKV's score; for kH2O the same rows' mean). The kept value
//      becomes the attention-weighted mean
//        v_t' = (a_t v_t + sum_{e->t} g_e a_e v_e) / (a_t + sum g_e a_e)
//      and without it the plain weighted mean
//        v_t' = (v_t + sum_{e->t} g_e v_e) / (1 + sum g_e).
//      Merge::kUniform uses g_e = 1 for every routed token; Merge::kNone
//      drops evicted tokens (plain eviction: no routing, values unchanged,
//      bias 0, merged 0). Keys are never changed: a kept slot keeps its
//      token's key, and with it its rotary phase. A zero vector has cosine
//      0 with everything.
//   4. Logit bias per kept slot (Bias::kAttentionRatio): with observation
//      attention, log((a_t + sum_{e->t} g_e a_e) / a_t), the log of the
//      attention mass the slot now stands for relative to its own; without
//      it, log(1 + m) with m = sum_{e->t} g_e (the merged token count when
//      every gate is 1). With attention the bias is capped at log(1 + m):
//      a slot never stands for more tokens than were merged into it. (Without
//      the cap, a kept token the window barely attends — KeyDiff keeps such
//      tokens — got a bias fitted to a few queries that later queries do not
//      share: on real KV that was worse than plain eviction, docs/QUALITY.md
//      "Compaction (SelKV)".) Bias::kNone: 0. An engine adds the bias to
//      the slot's attention logit (q . k / sqrt(D) + bias) before the
//      softmax, so a slot standing for several tokens is not under-weighted.
//      a_t is floored at 1e-12 so the ratio stays finite. rho = 1 (K = T)
//      returns the input unchanged: bias 0, merged 0.
//
// Cost: O(T * K * D) for the routing (K kept keys scored per evicted
// token), O(W * T * D) for the observation attention; memory O(T + K * D)
// beside the result.
//
// Positions: every kept slot reports its token's original position; keys
// already carry their rotary phase, so an engine must not re-rotate them,
// and new tokens continue at the original sequence length (not at the
// compacted length).
//
// Thread safety: pure functions.
#ifndef KVTIER_INDEX_SELKV_H_
#define KVTIER_INDEX_SELKV_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvtier::index {

enum class Importance : uint8_t { kKeyDiff = 0, kSnapKV = 1, kH2O = 2 };
enum class Merge : uint8_t { kGated = 0, kUniform = 1, kNone = 2 };
enum class Bias : uint8_t { kAttentionRatio = 0, kNone = 1 };

struct CompactOptions {
  float rho = 0.25f;  // (0, 1]
  Importance importance = Importance::kKeyDiff;
  Merge merge = Merge::kGated;
  Bias bias = Bias::kAttentionRatio;
};

// One (layer, KV head) of a context, fp32, row-major.
struct HeadKv {
  int32_t num_tokens = 0;          // T >= 1
  int32_t head_dim = 0;            // D >= 1
  absl::Span<const float> keys;    // [T][D]
  absl::Span<const float> values;  // [T][D]
  // Optional observation-window queries of the query heads that read this
  // KV head: [W][D] (W rows, any number of query heads stacked), after
  // rotary embedding. Required for kSnapKV and kH2O.
  absl::Span<const float> queries;
  // Optional, [W]: the position of each query row (>= 0); query w attends
  // to tokens i <= query_positions[w] only (a position >= T sees all T).
  // Empty: every query sees all T.
  absl::Span<const int32_t> query_positions;
};

struct CompactedHead {
  std::vector<int32_t> positions;  // [K] original token index of each slot, ascending
  std::vector<float> keys;         // [K][D] (the kept tokens' keys, unchanged)
  std::vector<float> values;       // [K][D] merged values
  std::vector<float> bias;         // [K] logit bias
  std::vector<int32_t> merged;     // [K] tokens routed to each slot (gate ignored)
};

// Kept slots for T tokens at retention rho: max(1, ceil(rho * T)), at most T.
// rho * T is rounded up only beyond float precision (ceil(rho * T - 1e-7 *
// T)), so 0.1f of 1000 tokens keeps 100, not 101. Returns 0 for T < 1, 1
// for rho <= 0 or NaN, T for rho >= 1. CompactHead returns exactly
// KeptSlots(T, rho) slots.
int32_t KeptSlots(int32_t num_tokens, float rho);

// Compacts one head. InvalidArgument naming the field: rho outside (0, 1]
// or not finite, an importance / merge / bias value outside its enum, T <
// 1, D outside [1, kMaxHeadDim] (index/summary/block_layout.h), span sizes that do
// not match T and D, queries not a multiple of D, query_positions not W
// long or negative, kSnapKV / kH2O without queries, or a non-finite key,
// value or query.
absl::StatusOr<CompactedHead> CompactHead(const HeadKv& head, const CompactOptions& options);

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_SELKV_H_
