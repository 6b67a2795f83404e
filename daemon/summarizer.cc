#include "daemon/summarizer.h"

#include <utility>

namespace kvtier::daemon {
namespace {

std::shared_ptr<const index::HeadWeights> UniformWeights(const index::BlockLayout& layout) {
  auto w = std::make_shared<index::HeadWeights>();
  w->version = 0;
  w->num_layers = layout.num_layers;
  w->num_kv_heads = layout.num_kv_heads;
  w->weights.assign(static_cast<size_t>(layout.num_layers) * layout.num_kv_heads, 1.0f);
  return w;
}

}  // namespace

Summarizer::ProfileState::ProfileState(const index::BlockLayout& layout)
    : tracker(layout.num_layers, layout.num_kv_heads, layout.head_dim),
      weights(UniformWeights(layout)) {}

Summarizer::ProfileState* Summarizer::StateOf(const ModelProfile& profile,
                                              const index::BlockLayout& layout) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<ProfileState>& state = profiles_[{profile.owner, profile.profile_id}];
  if (state == nullptr) {
    state = std::make_unique<ProfileState>(layout);
    // Validated when the profile was registered; a calibration that no
    // longer parses keeps no head keys (OpenContext then names the blocks).
    absl::StatusOr<index::SelectionCalibration> calibration = CalibrationOf(profile);
    if (calibration.ok()) state->key_heads = index::KeyHeadsOf(*calibration, layout.num_kv_heads);
    absl::MutexLock state_lock(&state->mu);
    state->next_estimate_blocks = options_.head_weights_min_blocks;
  }
  return state.get();
}

absl::StatusOr<std::string> Summarizer::Summarize(const ModelProfile& profile,
                                                  absl::Span<const uint8_t> payload) {
  const index::BlockLayout layout = LayoutOf(profile);
  ProfileState* state = StateOf(profile, layout);
  std::shared_ptr<const index::HeadWeights> weights;
  {
    absl::MutexLock lock(&state->mu);
    weights = state->weights;
  }
  index::SummaryOptions options;
  options.bounds = options_.bounds;
  options.per_layer = options_.per_layer;
  options.per_layer_bounds = options_.per_layer_bounds;
  options.head_weights = options_.weighted ? weights.get() : nullptr;
  options.key_heads = state->key_heads;
  index::HeadStats stats;
  absl::StatusOr<index::BlockSummary> summary = index::ComputeBlockSummary(
      layout, absl::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()),
      options, &stats);
  index::SummaryCodecOptions codec;
  codec.encoding = options_.encoding;
  codec.layer_int8 = options_.layer_int8;
  absl::StatusOr<std::string> encoded =
      summary.ok() ? index::EncodeSummary(*summary, codec) : summary.status();
  if (!encoded.ok() && summary.ok() && options_.encoding == index::SummaryEncoding::kFp16) {
    // A value beyond binary16 (possible for bf16/fp32 payloads).
    codec.encoding = index::SummaryEncoding::kFp32;
    encoded = index::EncodeSummary(*summary, codec);
  }
  if (!encoded.ok()) {
    // Keys with NaN/Inf (or so large that their statistics overflow): the
    // block is stored all the same, without a summary, so it cannot join a
    // context (OpenContext names it) and does not skew the head weights.
    without_summary_.fetch_add(1, std::memory_order_relaxed);
    return std::string();
  }

  absl::MutexLock lock(&state->mu);
  // Statistics that do not merge (overflowing variances) are left out; the
  // summary itself is sound.
  if (!state->tracker.Merge(stats).ok()) return encoded;
  ++state->blocks;
  if (state->blocks >= state->next_estimate_blocks) {
    state->weights = std::make_shared<const index::HeadWeights>(state->tracker.ComputeWeights());
    state->next_estimate_blocks = state->blocks * 2;
  }
  return encoded;
}

index::HeadWeights Summarizer::HeadWeightsOf(const std::string& tenant, uint64_t profile_id) const {
  ProfileState* state = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = profiles_.find(std::make_pair(tenant, profile_id));
    if (it == profiles_.end()) return index::HeadWeights{};
    state = it->second.get();
  }
  absl::MutexLock lock(&state->mu);
  if (state->weights->version == 0) return index::HeadWeights{};
  return *state->weights;
}

}  // namespace kvtier::daemon
