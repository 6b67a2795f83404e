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
// least the calibration's head_min_mass (copy_min_mass while the head
// copies, with copy tracking on; calibration.h).
//
// Both are finite for any finite input: cosines are computed on unit
// vectors found with scale-safe norms (unit_vector.h), logits in double.
//
// Thread safety: pure functions of their arguments; `scratch` is the
// caller's.
#ifndef KVTIER_INDEX_SELECT_KEY_SCORERS_H_
#define KVTIER_INDEX_SELECT_KEY_SCORERS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "index/select/calibration.h"
#include "index/summary/key_table.h"

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

// Copy tracking of one retrieval head (calibration.h, copy_run).
struct CopyTrack {
  int64_t step = -1;       // the last step that observed the head; -1 none
  int64_t token = -1;      // its strongest key then: page * key_tokens + offset
  int32_t run = 0;         // consecutive observations moving forward with the step
  int64_t confirmed = -1;  // the last step that confirmed copying; -1 never
  friend bool operator==(const CopyTrack&, const CopyTrack&) = default;
};

// What the mass scorer remembers of a context's last steps: every head's
// copy track. Begin(step) at every Select with head queries: a new step
// makes the last one's tracks `tracks_before`; a repeated step recomputes
// from the same state (the same answer).
struct MassMemory {
  int64_t step = INT64_MIN;
  std::vector<CopyTrack> tracks_before, tracks;
  void Begin(int64_t s) {
    if (s != step) {
      tracks_before = tracks;
      step = s;
    }
    tracks = tracks_before;
  }
};

// How retrieval head `head`'s terms count at this step.
struct HeadGate {
  float min_mass = 0.0f;  // a term counts from this share up
  float weight = 1.0f;    // and counts this multiple of itself
  int32_t lead = 0;       // tokens its attention is moved forward (copy_lead)
};

// Where a head's strongest key lies: its token (page * key_tokens +
// offset; -1 when none) and how many pages before the context's last one
// its page is.
struct KeyPosition {
  int64_t token = -1;
  int64_t pages_back = 0;
};
inline KeyPosition PositionOf(int64_t token, int64_t n, int32_t key_tokens) {
  return {token, token >= 0 && key_tokens > 0 ? n - 1 - token / key_tokens : n - 1};
}

// Observes head's strongest key at memory->step, updates
// memory->tracks[head] from memory->tracks_before[head], and returns the
// head's gate: copying (copy_min_mass, copy_weight, copy_lead), not copying
// (head_min_mass, uncopied_weight, 0). With copy_run 0 or no memory:
// (head_min_mass, 1, 0).
HeadGate ObserveCopy(const SelectionCalibration& calibration, MassMemory* memory, int32_t head,
                     KeyPosition key);

// The smallest share a head's term may count from at any step (the
// descent of mass_tree.h checks that it is > 0).
inline float MinHeadMass(const SelectionCalibration& c) {
  return c.copy_run > 0 && c.copy_min_mass >= 0 && c.copy_min_mass < c.head_min_mass
             ? c.copy_min_mass
             : c.head_min_mass;
}

// The smallest share head's term may count from at memory->step, from the
// track before it: MinHeadMass() when the head may be copying at this step
// (still held, or one forward step from confirming; or no memory), else
// head_min_mass. The descent opens pages down to it.
float StepMinHeadMass(const SelectionCalibration& c, const MassMemory* memory, int32_t head);

// out[b] for b in [0, n) (n == table.size() when the table has head keys).
// head_queries is empty or [R][dim] in calibration.retrieval_heads order;
// slots maps retrieval head i to its KeyTable slot (KeyHeadSlots()).
// With a memory (its Begin() called for this step): each head's gate is
// ObserveCopy()'s for its strongest key. Without, every target counts
// whole from head_min_mass.
struct MassScoreInput {
  const KeyTable* table = nullptr;                    // may be null when head_queries is empty
  const SelectionCalibration* calibration = nullptr;  // required
  absl::Span<const int32_t> slots;
  int32_t dim = 0;
  int64_t n = 0;
  absl::Span<const float> head_queries;
  MassMemory* memory = nullptr;  // null: no copy tracking
};
absl::Status MassScores(const MassScoreInput& in, KeyScorerScratch* scratch, absl::Span<float> out);

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_SELECT_KEY_SCORERS_H_
