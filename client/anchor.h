// Anchors and head queries for ContextSelect, computed from what an engine
// already holds: the keys of its last tokens, in the block layout
//
//   [layer][k|v][kv_head][token][dim]   (little endian, the profile's dtype)
//
// An anchor is the mean key of the last few tokens (4-8), pooled over KV
// heads and either over layers too (head_dim values, "pooled") or one row
// per layer (num_layers x head_dim, "per layer"; the daemon needs
// index.summary_per_layer for those). The tokens may span blocks: add each
// block's share, the engine's partial block included (it has the same
// layout, with slots for block_size_tokens tokens of which the first few
// are written).
//
//   kvtier::AnchorBuilder anchor(profile);
//   anchor.AddTokens(previous_block, 12, 4);   // its last 4 tokens
//   anchor.AddTokens(partial_block, 0, 4);     // and the 4 written so far
//   std::vector<float> a = *anchor.Finish(kvtier::AnchorLayout::kPooled);
//
// Bytes an engine sends per sequence and step (float32): 4 * head_dim
// pooled (512 B at head_dim 128), 4 * num_layers * head_dim per layer (14
// KiB for 28 layers), 4 * R * head_dim for R retrieval heads' queries.
//
// Thread safety: an AnchorBuilder is a plain value (one thread at a time);
// the free functions are pure.
#ifndef KVTIER_CLIENT_ANCHOR_H_
#define KVTIER_CLIENT_ANCHOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kvtier/v1/types.pb.h"

namespace kvtier {

enum class AnchorLayout { kPooled, kPerLayer };

class AnchorBuilder {
 public:
  // The profile's shape; dtype FP16, BF16 or FP32.
  explicit AnchorBuilder(const v1::ModelProfile& profile);

  // Adds the keys of tokens [first_token, first_token + count) of `block`,
  // which holds exactly one block of the profile. INVALID_ARGUMENT naming
  // the argument: wrong size, a token range outside the block, a profile
  // with an unknown dtype or zero sizes; nothing is added on error.
  absl::Status AddTokens(absl::string_view block, uint32_t first_token, uint32_t count);

  // The mean of every key added. FAILED_PRECONDITION when no token was
  // added; INVALID_ARGUMENT when the keys are not finite.
  absl::StatusOr<std::vector<float>> Finish(AnchorLayout layout) const;

  uint32_t tokens() const { return tokens_; }
  void Reset();

 private:
  v1::ModelProfile profile_;
  uint32_t tokens_ = 0;
  std::vector<double> sum_;  // [layer][dim], summed over KV heads and tokens
};

// The current queries of `heads` ((layer, q_head) pairs, the calibration's
// retrieval heads in order) from an engine's query tensor of one token,
// row-major [num_layers][num_q_heads][head_dim] floats: R * head_dim values
// for ContextSelect.head_queries. INVALID_ARGUMENT naming the argument for
// a wrong-sized tensor or a head outside it.
absl::StatusOr<std::vector<float>> GatherHeadQueries(absl::Span<const float> queries,
                                                     uint32_t num_layers, uint32_t num_q_heads,
                                                     uint32_t head_dim,
                                                     const v1::SelectionCalibration& calibration);

}  // namespace kvtier

#endif  // KVTIER_CLIENT_ANCHOR_H_
