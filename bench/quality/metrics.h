// Quality metrics of a block selection against exact attention
// (attention.h), and their accumulation over steps, layers, heads and dumps.
//
// One selection S (block indices) is shared by every layer and head, as a
// block store loads whole blocks. F = the always-kept blocks (sinks and the
// local window), O = the oracle: F plus the free blocks of highest total
// mass (summed over layers and heads), the best shared set of that size.
// Per step, layer and query head (lh):
//   recall        m(S)                     mass of the chosen blocks
//   recall_free   m(S \ F)                 without sinks and local blocks
//   oracle_ratio  m(S) / m(O)
//   share         m(S \ F) / m(O \ F)      share of the oracle's mass beyond
//                                          the always-kept blocks (headline)
//   rel_l2        |o_S - o| / |o|, o_S = sum_{b in S} u_b / m(S): the output
//                 of attention restricted to S (softmax renormalised)
// and per step: overlap |(S & O) \ F| / |O \ F| (steps with O \ F empty are
// skipped), churn = blocks of S that existed at the previous step but were
// not chosen then (they must be loaded), latency of the selection call.
//
// Summaries: "mean" pools sums over every step, layer and head (so share is
// sum m(S \ F) / sum m(O \ F)); "worst" takes the worst (layer, head) of its
// own step-summed ratio; rel_l2_gqa_worst averages, over steps and KV
// groups, the worst query head of each group.
//
// Thread safety: pure functions; an accumulator is not synchronised.
#ifndef KVTIER_BENCH_QUALITY_METRICS_H_
#define KVTIER_BENCH_QUALITY_METRICS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "bench/quality/attention.h"

namespace kvtier::quality {

// The always-kept blocks of a step: [0, sinks) and [num_blocks - locals,
// num_blocks), disjoint.
struct ForcedBlocks {
  int64_t num_blocks = 0;
  int64_t sinks = 0;
  int64_t locals = 0;
  static ForcedBlocks Make(int64_t num_blocks, int64_t sink_blocks, int64_t local_blocks);
  bool Contains(int64_t b) const { return b < sinks || b >= num_blocks - locals; }
  int64_t count() const { return sinks + locals; }
};

// F plus the best (budget - |F|) other blocks by `score` (ties to the lower
// index), ascending. budget >= num_blocks gives every block.
std::vector<int64_t> TopBlocks(absl::Span<const double> score, const ForcedBlocks& forced,
                               int64_t budget);

double SetMass(const float* mass, absl::Span<const int64_t> blocks);
double FreeMass(const float* mass, absl::Span<const int64_t> blocks, const ForcedBlocks& forced);
// |o_S - o| / |o| for head lh (requires outputs); 1 when m(S) is 0.
double RelativeL2Error(const StepAttention& a, int32_t lh, absl::Span<const int64_t> blocks);
// Blocks of `cur` below prev_num_blocks that are not in `prev` (both
// ascending).
int64_t NewBlocks(absl::Span<const int64_t> prev, absl::Span<const int64_t> cur,
                  int64_t prev_num_blocks);

struct MetricSummary {
  int64_t steps = 0;
  double budget_blocks = 0;  // mean chosen blocks per step
  double share = 0, share_worst = 0;
  double recall = 0, recall_worst = 0;
  double recall_free = 0, recall_free_worst = 0;
  double oracle_ratio = 0, oracle_ratio_worst = 0;
  double overlap = 0;
  double rel_l2 = 0, rel_l2_worst = 0, rel_l2_gqa_worst = 0;
  double churn_blocks = 0;  // per step
  double bytes_per_step = 0;
  double latency_us = 0;  // mean per selection
};

class MetricAccumulator {
 public:
  // num_heads = layers * q_heads; group_size = q_heads / kv_heads.
  MetricAccumulator(int32_t num_heads, int32_t group_size);

  // One step of a shared selection. `oracle` is the oracle of the same
  // budget. Requires a with outputs.
  void AddStep(const StepAttention& a, const ForcedBlocks& forced, absl::Span<const int64_t> chosen,
               absl::Span<const int64_t> oracle, int64_t new_blocks, double latency_us);
  // One step where head lh chose per_head[lh] (a reference that a shared
  // store cannot realise); churn and overlap are not recorded.
  void AddPerHeadStep(const StepAttention& a, const ForcedBlocks& forced,
                      const std::vector<std::vector<int64_t>>& per_head,
                      absl::Span<const int64_t> oracle);

  // InvalidArgument when the shapes differ.
  absl::Status Merge(const MetricAccumulator& other);
  MetricSummary Summarise(int64_t block_bytes) const;
  int64_t steps() const { return steps_; }

 private:
  void AddHead(const StepAttention& a, int32_t lh, const ForcedBlocks& forced,
               absl::Span<const int64_t> chosen, absl::Span<const int64_t> oracle, double* err);

  int32_t num_heads_;
  int32_t group_size_;
  int64_t steps_ = 0;
  // Per head, summed over steps.
  std::vector<double> mass_s_, mass_sf_, mass_o_, mass_of_, l2_;
  double gqa_worst_sum_ = 0;  // sum over steps and groups
  double overlap_sum_ = 0;
  int64_t overlap_steps_ = 0;
  double churn_sum_ = 0;
  double latency_sum_us_ = 0;
  double budget_sum_ = 0;
};

}  // namespace kvtier::quality

#endif  // KVTIER_BENCH_QUALITY_METRICS_H_
