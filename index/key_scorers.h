// The flat scorers over a context's KeyTable (key_table.h): per-layer
// key-key affinity and the calibrated mass estimate. Both score every page
// of the context; the Selector ranks their output like any flat scorer.
//
// Per-layer key-key (SelectRequest with an anchor of num_layers x head_dim):
//   aff_b = mean over layers l of (1 + cos(a_l, r_bl)) / 2
// with r_bl page b's mean key of layer l and a_l the anchor's row l. With
// `centered`, both vectors first lose their component along u_l, the unit
// direction of the context's mean key of layer l (x - (x . u_l) u_l): the
// direction every rotary key shares says nothing about which block is
// meant. (Subtracting the mean instead would make the score depend on the
// anchor's scale; the projection keeps it scale-invariant, and the quality
// harness measures the two within 0.001 of each other.)
//
// Mass estimate (ScorerKind::kMass): the attention the next step is
// expected to give page b, in units of one head's total attention:
//   est_b = prior[d_b] + sum_i w_i softmax_b(lse_i(b)),
// (block 0: max(prior[d_0], sink_mass) when the calibration has one),
//   lse_i(b) = log sum_{t in b} exp(s * q_i . k_{b,t})
// where d_b = n - 1 - b (blocks before the context's last one; distances
// past the prior's end use its last entry: the Selector breaks the ties
// of mass scores towards the more recent block), q_i the query of retrieval head
// i (head_queries row i), k_{b,t} the int8 keys of its KV head, s the
// calibration's softmax scale (1/sqrt(head_dim) when 0) and w_i its head
// weight (1 when none). Without head queries: est_b = prior_all[d_b]. An
// uncalibrated context scores est_b = (b + 1) / n, i.e. recency: the
// sliding window. A head's term counts only where its softmax share is at
// least the calibration's head_min_mass; a counted term also adds
// successor_weight times itself to block b + 1 (calibration.h).
//
// Both are finite for any finite input: cosines are computed on unit
// vectors found with scale-safe norms (unit_vector.h), logits in double.
//
// Thread safety: pure functions of their arguments; `scratch` is the
// caller's.
#ifndef KVTIER_INDEX_KEY_SCORERS_H_
#define KVTIER_INDEX_KEY_SCORERS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "index/calibration.h"
#include "index/key_table.h"

namespace kvtier::index {

// Reused buffers of the scorers (grown, never shrunk).
struct KeyScorerScratch {
  std::vector<float> unit;    // [L][D] unit anchor rows
  std::vector<float> centre;  // [L][D] unit mean directions
  std::vector<double> lse;    // [N]
  std::vector<double> top;    // [N] largest logit per block
  std::vector<float> row;     // [D]
  std::vector<float> logits;  // [N][T]
  std::vector<float> ra, ru;  // [N] per-layer dots
  std::vector<double> total;  // [N]
};

// out[b] for b in [0, table.size()). Requires anchor.size() ==
// table.options().num_layers * dim, finite, every layer row nonzero (the
// caller validates: InvalidArgument naming "anchor" otherwise).
absl::Status LayerKeyKeyScores(const KeyTable& table, absl::Span<const float> anchor, bool centered,
                               KeyScorerScratch* scratch, absl::Span<float> out);

// A retrieval head's target at one step: a block holding at least
// head_min_mass of its attention.
struct MassTarget {
  int32_t head = 0;  // index in calibration.retrieval_heads
  int64_t page = 0;
  int32_t chain = 1;  // consecutive steps the head has followed it (below)
  friend bool operator==(const MassTarget&, const MassTarget&) = default;
};

// The chain of head's target `page` at this step: 1 + the longest chain of
// `previous` (the targets of the context's previous step) that it
// continues: the same head on the same block or the one before it (a
// copying head moving forward); 1 when it continues none.
int32_t ChainOf(absl::Span<const MassTarget> previous, int32_t head, int64_t page);

// out[b] for b in [0, n) (n == table.size() when the table has head keys).
// head_queries is empty or [R][dim] in calibration.retrieval_heads order;
// slots maps retrieval head i to its KeyTable slot (KeyHeadSlots()).
// With `previous` (the targets of the context's previous step), a target
// whose chain is below the calibration's confirm_steps counts
// unconfirmed_weight times its term (calibration.h); without, every target
// counts whole. Every target of this step, with its chain, is appended to
// *current when given.
absl::Status MassScores(const KeyTable* table, const SelectionCalibration& calibration,
                        absl::Span<const int32_t> slots, int32_t dim, int64_t n,
                        absl::Span<const float> head_queries, KeyScorerScratch* scratch,
                        absl::Span<float> out, const std::vector<MassTarget>* previous = nullptr,
                        std::vector<MassTarget>* current = nullptr);

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_KEY_SCORERS_H_
