#include "daemon/summarizer.h"

#include <utility>


namespace kvtier::daemon {
namespace {

index::Dtype ToIndexDtype(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kFp16:
      return index::Dtype::kFp16;
    case KvDtype::kBf16:
      return index::Dtype::kBf16;
    case KvDtype::kFp32:
      return index::Dtype::kFp32;
  }
  return index::Dtype::kFp16;
}

std::shared_ptr<const index::HeadWeights> UniformWeights(const index::BlockLayout& layout) {
  auto w = std::make_shared<index::HeadWeights>();
  w->version = 0;
  w->num_layers = layout.num_layers;
  w->num_kv_heads = layout.num_kv_heads;
  w->weights.assign(static_cast<size_t>(layout.num_layers) * layout.num_kv_heads, 1.0f);
  return w;
}

}  // namespace

index::BlockLayout LayoutOf(const ModelProfile& profile) {
  index::BlockLayout layout;
  layout.num_layers = static_cast<int32_t>(profile.layers);
  layout.num_kv_heads = static_cast<int32_t>(profile.kv_heads);
  layout.head_dim = static_cast<int32_t>(profile.head_dim);
  layout.block_size_tokens = static_cast<int32_t>(profile.block_size_tokens);
  layout.dtype = ToIndexDtype(profile.dtype);
  return layout;
}

Summarizer::ProfileState::ProfileState(const index::BlockLayout& layout)
    : tracker(layout.num_layers, layout.num_kv_heads, layout.head_dim),
      weights(UniformWeights(layout)) {}

Summarizer::ProfileState* Summarizer::StateOf(const ModelProfile& profile,
                                              const index::BlockLayout& layout) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<ProfileState>& state = profiles_[profile.profile_id];
  if (state == nullptr) {
    state = std::make_unique<ProfileState>(layout);
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
  options.head_weights = weights.get();
  index::HeadStats stats;
  absl::StatusOr<index::BlockSummary> summary = index::ComputeBlockSummary(
      layout, absl::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()),
      options, &stats);
  absl::StatusOr<std::string> encoded =
      summary.ok() ? index::EncodeSummary(*summary, options_.encoding) : summary.status();
  if (!encoded.ok() && summary.ok() && options_.encoding == index::SummaryEncoding::kFp16) {
    // A value beyond binary16 (possible for bf16/fp32 payloads).
    encoded = index::EncodeSummary(*summary, index::SummaryEncoding::kFp32);
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

index::HeadWeights Summarizer::HeadWeightsOf(uint64_t profile_id) const {
  ProfileState* state = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = profiles_.find(profile_id);
    if (it == profiles_.end()) return index::HeadWeights{};
    state = it->second.get();
  }
  absl::MutexLock lock(&state->mu);
  if (state->weights->version == 0) return index::HeadWeights{};
  return *state->weights;
}

}  // namespace kvtier::daemon
