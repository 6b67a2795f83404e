#include "index/summary/summary_builder.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "index/kernels/simd.h"

namespace kvtier::index {
namespace {

// Converts `n` elements of `dtype` starting at `src` to floats.
void ToFloat(Dtype dtype, const char* src, float* dst, size_t n) {
  switch (dtype) {
    case Dtype::kFp16:
      simd::HalfToFloatN(src, dst, n);
      return;
    case Dtype::kBf16:
      simd::BfloatToFloatN(src, dst, n);
      return;
    case Dtype::kFp32:
      std::copy_n(reinterpret_cast<const char*>(src), n * sizeof(float),
                  reinterpret_cast<char*>(dst));
      return;
  }
}

absl::Status CheckWeights(const BlockLayout& layout, const HeadWeights& w) {
  if (w.num_layers != layout.num_layers || w.num_kv_heads != layout.num_kv_heads ||
      w.weights.size() != static_cast<size_t>(layout.num_layers) * layout.num_kv_heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_weights shape (", w.num_layers, " layers x ", w.num_kv_heads, " heads, ",
                     w.weights.size(), " weights) does not match the layout (", layout.num_layers,
                     " x ", layout.num_kv_heads, ")"));
  }
  double total = 0;
  for (size_t i = 0; i < w.weights.size(); ++i) {
    if (!std::isfinite(w.weights[i]) || w.weights[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("head_weights.weights[", i, "] (",
                                                     w.weights[i], ") must be finite and >= 0"));
    }
    total += w.weights[i];
  }
  if (total <= 0) {
    return absl::InvalidArgumentError("head_weights.weights sum to 0");
  }
  return absl::OkStatus();
}

absl::Status CheckKeyHeads(const BlockLayout& layout, const std::vector<int32_t>& heads) {
  const int64_t total = int64_t{layout.num_layers} * layout.num_kv_heads;
  for (size_t i = 0; i < heads.size(); ++i) {
    if (heads[i] < 0 || heads[i] >= total || (i > 0 && heads[i] <= heads[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat("options.key_heads[", i, "] (", heads[i],
                                                     ") must be ascending, distinct and in [0, ",
                                                     total, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BlockSummaryBuilder> BlockSummaryBuilder::Create(const BlockLayout& layout,
                                                                const SummaryOptions& options,
                                                                HeadStats* head_stats) {
  if (absl::Status s = ValidateLayout(layout); !s.ok()) return s;
  if (options.per_layer_bounds && !options.per_layer) {
    return absl::InvalidArgumentError("options.per_layer_bounds requires options.per_layer");
  }
  if (options.head_weights != nullptr) {
    if (absl::Status s = CheckWeights(layout, *options.head_weights); !s.ok()) return s;
  }
  if (absl::Status s = CheckKeyHeads(layout, options.key_heads); !s.ok()) return s;
  return BlockSummaryBuilder(layout, options, head_stats);
}

BlockSummaryBuilder::BlockSummaryBuilder(const BlockLayout& layout, const SummaryOptions& options,
                                         HeadStats* head_stats)
    : layout_(layout),
      options_(&options),
      head_stats_(head_stats),
      L_(layout.num_layers),
      H_(layout.num_kv_heads),
      T_(layout.block_size_tokens),
      D_(static_cast<size_t>(layout.head_dim)),
      head_elems_(static_cast<size_t>(T_) * D_),
      elem_bytes_(static_cast<size_t>(DtypeSizeBytes(layout.dtype))),
      keys_(head_elems_),
      head_sum_(D_),
      head_meanf_(D_),
      dev_sq_(D_),
      block_sum_(D_, 0.0),
      layer_sum_(D_, 0.0),
      weighted_sum_(D_, 0.0) {
  Prepare();
}

// Sizes out_'s optional fields (and resets *head_stats_) for the options,
// filled with the identities of their reductions.
void BlockSummaryBuilder::Prepare() {
  const SummaryOptions& options = *options_;
  out_.dim = layout_.head_dim;
  if (head_stats_ != nullptr) {
    head_stats_->num_layers = L_;
    head_stats_->num_kv_heads = H_;
    head_stats_->head_dim = layout_.head_dim;
    head_stats_->count.assign(static_cast<size_t>(L_) * H_, T_);
    head_stats_->mean.assign(static_cast<size_t>(L_) * H_ * D_, 0.0);
    head_stats_->m2.assign(static_cast<size_t>(L_) * H_, 0.0);
  }
  if (options.bounds) {
    out_.min.assign(D_, std::numeric_limits<float>::infinity());
    out_.max.assign(D_, -std::numeric_limits<float>::infinity());
  }
  if (options.per_layer) {
    out_.num_layers = L_;
    out_.layer_mean.assign(static_cast<size_t>(L_) * D_, 0.0f);
  }
  if (options.per_layer_bounds) {
    out_.layer_min.assign(static_cast<size_t>(L_) * D_, std::numeric_limits<float>::infinity());
    out_.layer_max.assign(static_cast<size_t>(L_) * D_, -std::numeric_limits<float>::infinity());
  }
  if (!options.key_heads.empty()) {
    out_.key_heads = options.key_heads;
    out_.key_tokens = T_;
    out_.head_keys.assign(options.key_heads.size() * head_elems_, 0);
    out_.key_scales.assign(options.key_heads.size(), 0.0f);
  }
}

size_t BlockSummaryBuilder::HeadOffset(int64_t lh) const {
  const size_t l = static_cast<size_t>(lh / H_), h = static_cast<size_t>(lh % H_);
  return ((l * 2) * static_cast<size_t>(H_) + h) * head_elems_ * elem_bytes_;
}

void BlockSummaryBuilder::LoadHeadKeys(const char* payload, int32_t l, int32_t h) {
  ToFloat(layout_.dtype, payload + HeadOffset(int64_t{l} * H_ + h), keys_.data(), head_elems_);
}

// Head lh's statistics from its keys in keys_ and its mean:
// squared deviations from the head's mean, per dimension in float over the
// block's tokens (deviations, not raw squares, so large per-dimension
// offsets cannot cancel), then summed in double. The inner loop runs along
// the dimension and vectorises.
void BlockSummaryBuilder::RecordHeadStats(size_t lh) {
  // The head's mean is in head_stats_->mean and head_meanf_ (AddHeadSums).
  std::fill(dev_sq_.begin(), dev_sq_.end(), 0.0f);
  simd::AccumulateSquaredDeviations(keys_.data(), static_cast<size_t>(T_), D_, head_meanf_.data(),
                                    dev_sq_.data());
  double m2 = 0;
  for (size_t d = 0; d < D_; ++d) m2 += dev_sq_[d];
  head_stats_->m2[lh] = m2;
}

// Adds the keys of (layer l, head h) to the sums and bounds, quantises them
// when h is a key head, and records its statistics. InvalidArgument when a
// key is not finite.
absl::Status BlockSummaryBuilder::SummarizeHead(const char* payload, int32_t l, int32_t h) {
  const SummaryOptions& options = *options_;
  LoadHeadKeys(payload, l, h);
  std::fill(head_sum_.begin(), head_sum_.end(), 0.0f);
  simd::AccumulateRows(keys_.data(), static_cast<size_t>(T_), D_, head_sum_.data(),
                       options.bounds ? out_.min.data() : nullptr,
                       options.bounds ? out_.max.data() : nullptr);
  if (options.per_layer_bounds) {
    // Only the bounds: the sum goes to a scratch row.
    std::fill(dev_sq_.begin(), dev_sq_.end(), 0.0f);
    simd::AccumulateRows(keys_.data(), static_cast<size_t>(T_), D_, dev_sq_.data(),
                         &out_.layer_min[l * D_], &out_.layer_max[l * D_]);
  }
  // NaN and Inf propagate into the sum (min/max would hide NaN).
  for (size_t d = 0; d < D_; ++d) {
    if (!std::isfinite(head_sum_[d])) {
      return absl::InvalidArgumentError(
          absl::StrCat("payload keys of layer ", l, " head ", h, " are not finite (dim ", d, ")"));
    }
  }
  const size_t lh = static_cast<size_t>(l) * H_ + h;
  const auto slot = std::lower_bound(options.key_heads.begin(), options.key_heads.end(),
                                     static_cast<int32_t>(lh));
  if (slot != options.key_heads.end() && *slot == static_cast<int32_t>(lh)) {
    const size_t j = static_cast<size_t>(slot - options.key_heads.begin());
    out_.key_scales[j] = QuantizeInt8(keys_.data(), head_elems_, &out_.head_keys[j * head_elems_]);
  }
  const double w = options.head_weights ? options.head_weights->weights[lh] : 0.0;
  weight_total_ += w;
  simd::HeadSums sums;
  sums.block_sum = block_sum_.data();
  sums.layer_sum = options.per_layer ? layer_sum_.data() : nullptr;
  sums.weighted_sum = options.head_weights != nullptr ? weighted_sum_.data() : nullptr;
  if (head_stats_ != nullptr) {
    sums.mean = &head_stats_->mean[lh * D_];
    sums.mean_f = head_meanf_.data();
  }
  simd::AddHeadSums(head_sum_.data(), D_, static_cast<double>(T_), w, sums);
  if (head_stats_ != nullptr) RecordHeadStats(lh);
  return absl::OkStatus();
}

// After the last head of layer l: its mean, and a fresh layer sum.
void BlockSummaryBuilder::FinishLayer(int32_t l) {
  if (options_->per_layer) {
    const double n = static_cast<double>(H_) * T_;
    for (size_t d = 0; d < D_; ++d) {
      out_.layer_mean[l * D_ + d] = static_cast<float>(layer_sum_[d] / n);
    }
  }
  std::fill(layer_sum_.begin(), layer_sum_.end(), 0.0);
}

absl::Status BlockSummaryBuilder::Advance(absl::string_view prefix) {
  const int64_t heads = int64_t{L_} * H_;
  const size_t head_bytes = head_elems_ * elem_bytes_;
  while (status_.ok() && next_head_ < heads &&
         HeadOffset(next_head_) + head_bytes <= prefix.size()) {
    const auto l = static_cast<int32_t>(next_head_ / H_);
    const auto h = static_cast<int32_t>(next_head_ % H_);
    status_ = SummarizeHead(prefix.data(), l, h);
    if (!status_.ok()) break;
    ++next_head_;
    if (h == H_ - 1) FinishLayer(l);
  }
  return status_;
}

// After every head: the mean, the weighted mean and (second pass over the
// keys, as the radius needs the final mean) the radius.
void BlockSummaryBuilder::FinishSummary(const char* payload) {
  const SummaryOptions& options = *options_;
  const double total_keys = static_cast<double>(L_) * H_ * T_;
  out_.mean.resize(D_);
  for (size_t d = 0; d < D_; ++d) {
    out_.mean[d] = static_cast<float>(block_sum_[d] / total_keys);
  }
  if (options.head_weights != nullptr) {
    out_.weights_version = options.head_weights->version;
    out_.weighted_mean.resize(D_);
    for (size_t d = 0; d < D_; ++d) {
      out_.weighted_mean[d] = static_cast<float>(weighted_sum_[d] / weight_total_);
    }
  }
  if (options.bounds) {
    float r2 = 0;
    for (int32_t l = 0; l < L_; ++l) {
      for (int32_t h = 0; h < H_; ++h) {
        LoadHeadKeys(payload, l, h);
        r2 = std::max(r2, simd::MaxSquaredDistance(keys_.data(), static_cast<size_t>(T_), D_,
                                                   out_.mean.data()));
      }
    }
    out_.radius = std::sqrt(r2);
  }
}

absl::StatusOr<BlockSummary> BlockSummaryBuilder::Finish(absl::string_view payload) {
  if (static_cast<int64_t>(payload.size()) != PayloadSizeBytes(layout_)) {
    return absl::InvalidArgumentError(absl::StrCat("payload size (", payload.size(),
                                                   " bytes) does not match the layout (",
                                                   PayloadSizeBytes(layout_), " bytes)"));
  }
  if (absl::Status s = Advance(payload); !s.ok()) return s;
  FinishSummary(payload.data());
  return std::move(out_);
}

}  // namespace kvtier::index
