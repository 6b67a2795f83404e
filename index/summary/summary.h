// Per-block key summaries computed from a raw block payload (layout in
// block_layout.h), and the per-profile head-variance statistics that weight
// KV heads.
//
//   mean          v_b: mean key over tokens, KV heads and layers      [D]
//   weighted_mean head-weighted v_b: sum_{l,h} w_lh * mean_lh / sum w  [D]
//   min, max      per-dimension bounds over every key (Quest)          [D]
//   radius        max_k ||k - mean||: the sphere centred at mean that
//                 holds every key (ArkVale's bounding sphere)
//   layer_mean    mean key per layer over tokens and heads          [L][D]
//   layer_min/max per-layer Quest bounds                            [L][D]
//   head_keys     the keys of selected KV heads (a calibrated profile's
//                 retrieval heads, calibration.h), int8 with one scale per
//                 head: value = head_keys[(j * T + t) * D + d] *
//                 key_scales[j] for slot j (KV head key_heads[j]),
//                 token t, dim d                                  [R][T][D]
//
// Head variance: for every (layer, kv_head) of a profile the index keeps a
// running mean vector and the sum of squared deviations (Welford, merged with
// Chan's formula), so statistics from many blocks, threads or restarts
// combine exactly. A head's variance is the mean over dimensions of the
// per-dimension variance of its keys. Weights are variance / mean variance
// (mean weight 1): high-variance heads discriminate, near-constant ones
// mostly carry position. Every ComputeWeights bumps the version; a summary
// records the version its weighted_mean was computed with.
//
// ComputeBlockSummary takes a whole payload; BlockSummaryBuilder
// (summary_builder.h) computes the same summary while a payload is copied in.
//
// Thread safety: ComputeBlockSummary is pure and thread-safe.
// HeadVarianceTracker is not synchronised: callers serialise access (one per
// profile, behind the caller's mutex).
#ifndef KVTIER_INDEX_SUMMARY_SUMMARY_H_
#define KVTIER_INDEX_SUMMARY_SUMMARY_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "index/summary/block_layout.h"

namespace kvtier::index {

// Head weights of one profile: weights[l * num_kv_heads + h].
struct HeadWeights {
  uint32_t version = 0;  // 0 = never computed
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  std::vector<float> weights;
};

struct SummaryOptions {
  bool bounds = true;             // min, max, radius
  bool per_layer = false;         // layer_mean
  bool per_layer_bounds = false;  // layer_min, layer_max (needs per_layer)
  // When set, weighted_mean is computed with these weights; their shape must
  // match the layout.
  const HeadWeights* head_weights = nullptr;
  // KV heads (layer * num_kv_heads + kv_head, ascending, distinct) whose
  // keys are kept as int8 head_keys; empty keeps none.
  std::vector<int32_t> key_heads;
};

struct BlockSummary {
  int32_t dim = 0;
  int32_t num_layers = 0;  // rows of the layer_* arrays (0 when absent)
  std::vector<float> mean;
  std::vector<float> weighted_mean;  // empty when no weights were given
  uint32_t weights_version = 0;      // HeadWeights::version used, or 0
  std::vector<float> min;            // empty unless bounds
  std::vector<float> max;
  float radius = 0.0f;
  std::vector<float> layer_mean;  // empty unless per_layer
  std::vector<float> layer_min;   // empty unless per_layer_bounds
  std::vector<float> layer_max;
  std::vector<int32_t> key_heads;  // empty unless SummaryOptions::key_heads
  int32_t key_tokens = 0;          // T of head_keys (0 when absent)
  std::vector<int8_t> head_keys;   // [R][T][D]
  std::vector<float> key_scales;   // [R], >= 0
};

// Symmetric int8 quantisation of n values: scale = max |v| / 127 (0 for an
// all-zero input), q = round(v / scale). Returns the scale.
float QuantizeInt8(const float* v, size_t n, int8_t* q);

// Per-(layer, kv_head) key statistics of a set of keys, index l * H + h.
struct HeadStats {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  std::vector<int64_t> count;  // keys seen                 [L*H]
  std::vector<double> mean;    // running mean              [L*H][D]
  std::vector<double> m2;      // sum of squared deviations [L*H]
};

// Summarises the keys of one block. `payload` must be exactly
// PayloadSizeBytes(layout) bytes. When head_stats is not null it is reset and
// filled with this block's per-head statistics (for
// HeadVarianceTracker::Merge). Errors: InvalidArgument naming the field for a
// bad layout, wrong payload size, mismatched head weights, or non-finite
// keys (NaN/Inf in the payload), key_heads out of range or unsorted.
absl::StatusOr<BlockSummary> ComputeBlockSummary(const BlockLayout& layout,
                                                 absl::string_view payload,
                                                 const SummaryOptions& options,
                                                 HeadStats* head_stats);

// Running per-head variance of one profile.
class HeadVarianceTracker {
 public:
  HeadVarianceTracker(int32_t num_layers, int32_t num_kv_heads, int32_t head_dim);

  // Adds statistics from ComputeBlockSummary (or another tracker's
  // stats()). InvalidArgument when the shape differs.
  absl::Status Merge(const HeadStats& stats);

  // Population variance of head (layer, head), averaged over dimensions;
  // 0 before any key was seen.
  double Variance(int32_t layer, int32_t head) const;
  int64_t Count(int32_t layer, int32_t head) const;
  const HeadStats& stats() const { return stats_; }

  // Weights proportional to each head's variance, normalised to mean 1
  // (uniform when every variance is 0), with a new version (previous + 1).
  HeadWeights ComputeWeights();
  uint32_t version() const { return version_; }

 private:
  HeadStats stats_;
  uint32_t version_ = 0;
};

// Reduces a per-(layer, head) anchor [L*H][D] to one head-weighted anchor [D]
// with the same formula as weighted_mean, so that it can be compared with
// weighted_mean. InvalidArgument on shape mismatch or non-finite input.
absl::StatusOr<std::vector<float>> WeightedAnchor(const std::vector<float>& per_head_anchor,
                                                  int32_t head_dim, const HeadWeights& weights);

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_SUMMARY_SUMMARY_H_
