// Checks of two published claims on the replayed data, per layer.
//
// SamKV / CHESS: the top-K keys by key-key similarity to the anchor overlap
// the top-K keys by attention. Token level, per (layer, KV head): A = top-K
// positions of cos(anchor_lh, k_j), B = top-K positions of the attention the
// group's query heads give (sum of their p_j), K = ceil(fraction * (t + 1));
// overlap = |A & B| / K, against K / (t + 1) expected by chance. Two anchors:
// the per-head anchor and the pooled one (what a client sends).
//
// KeyDiff: keys unlike the mean key direction receive more attention.
// Token level, per (layer, KV head): Spearman rank correlation between
// distinctness -cos(k_j, mean_i k_i / |k_i|) and the group's attention p_j
// over j in [0, t]; also without the first block (the sink) and at block
// level (distinctness of the block's mean key vs the block's mass).
//
// Thread safety: an accumulator is not synchronised.
#ifndef KVTIER_BENCH_QUALITY_CLAIMS_H_
#define KVTIER_BENCH_QUALITY_CLAIMS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "bench/quality/attention.h"
#include "bench/quality/replay_data.h"

namespace kvtier::quality {

// Spearman's rho of x and y (average ranks for ties); 0 when either is
// constant or n < 2.
double Spearman(absl::Span<const double> x, absl::Span<const double> y);

class ClaimsAccumulator {
 public:
  ClaimsAccumulator(int32_t num_layers, std::vector<double> fractions);

  // One step; `a` must hold token probabilities (AttentionOptions::probs).
  void AddStep(const ReplayData& data, const StepAttention& a, const StepInput& in);
  absl::Status Merge(const ClaimsAccumulator& other);

  struct LayerRow {
    int32_t layer = 0;
    std::vector<double> overlap_head;    // per fraction
    std::vector<double> overlap_pooled;  // per fraction
    std::vector<double> chance;          // per fraction
    double keydiff_rho = 0;
    double keydiff_rho_no_sink = 0;
    double keydiff_rho_block = 0;
    int64_t samples = 0;  // (step, KV head) pairs
  };
  std::vector<LayerRow> Rows() const;
  const std::vector<double>& fractions() const { return fractions_; }

 private:
  int32_t num_layers_;
  std::vector<double> fractions_;
  // [layer][fraction]
  std::vector<double> overlap_head_, overlap_pooled_, chance_;
  std::vector<double> rho_, rho_no_sink_, rho_block_;  // [layer]
  std::vector<int64_t> samples_;                       // [layer]
};

}  // namespace kvtier::quality

#endif  // KVTIER_BENCH_QUALITY_CLAIMS_H_
