#include "daemon/summarizer.h"

#include <memory>
#include <utility>

#include "index/summary/summary_builder.h"

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

// One block's summary: the profile's weights and options when it began,
// and the builder the payload's chunks feed.
class Summarizer::Stream final : public SummaryStream {
 public:
  Stream(Summarizer* owner, const ModelProfile& profile) : owner_(owner) {
    const index::BlockLayout layout = LayoutOf(profile);
    state_ = owner->StateOf(profile, layout);
    {
      absl::MutexLock lock(&state_->mu);
      weights_ = state_->weights;
    }
    options_.bounds = owner->options_.bounds;
    options_.per_layer = owner->options_.per_layer;
    options_.per_layer_bounds = owner->options_.per_layer_bounds;
    options_.head_weights = owner->options_.weighted ? weights_.get() : nullptr;
    options_.key_heads = state_->key_heads;
    builder_ = index::BlockSummaryBuilder::Create(layout, options_, &stats_);
  }

  void Advance(absl::Span<const uint8_t> written) override {
    if (builder_.ok()) {
      // An error sticks in the builder; Finish reports it.
      builder_
          ->Advance(
              absl::string_view(reinterpret_cast<const char*>(written.data()), written.size()))
          .IgnoreError();
    }
  }

  absl::StatusOr<std::string> Finish(absl::Span<const uint8_t> payload) override {
    absl::StatusOr<index::BlockSummary> summary =
        builder_.ok() ? builder_->Finish(absl::string_view(
                            reinterpret_cast<const char*>(payload.data()), payload.size()))
                      : builder_.status();
    return owner_->Conclude(state_, std::move(summary), stats_);
  }

 private:
  Summarizer* const owner_;
  ProfileState* state_ = nullptr;
  std::shared_ptr<const index::HeadWeights> weights_;
  index::SummaryOptions options_;
  index::HeadStats stats_;
  absl::StatusOr<index::BlockSummaryBuilder> builder_ = absl::UnknownError("not created");
};

std::unique_ptr<SummaryStream> Summarizer::Begin(const ModelProfile& profile) {
  return std::make_unique<Stream>(this, profile);
}

absl::StatusOr<std::string> Summarizer::Summarize(const ModelProfile& profile,
                                                  absl::Span<const uint8_t> payload) {
  Stream stream(this, profile);
  return stream.Finish(payload);
}

absl::StatusOr<std::string> Summarizer::Conclude(ProfileState* state,
                                                 absl::StatusOr<index::BlockSummary> summary,
                                                 const index::HeadStats& stats) {
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
