#include "index/key_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvtier::index {

KeyTable::KeyTable(const KeyTableOptions& options)
    : options_(options),
      dim_(static_cast<size_t>(options.dim)),
      head_elems_(static_cast<size_t>(options.key_tokens) * options.dim),
      layer_sum_(static_cast<size_t>(options.num_layers) * options.dim, 0.0) {}

absl::Status KeyTable::Check(const BlockSummary& s, size_t i) const {
  const size_t L = static_cast<size_t>(options_.num_layers);
  if (L > 0 && (s.num_layers != options_.num_layers ||
                s.layer_mean.size() != L * dim_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "summaries[", i, "] has ", s.layer_mean.size() / std::max<size_t>(dim_, 1),
        " per-layer means, the context needs ", L,
        " (index.summary_per_layer was off when it was put?)"));
  }
  if (!options_.key_heads.empty() &&
      (s.key_heads != options_.key_heads || s.key_tokens != options_.key_tokens ||
       s.head_keys.size() != options_.key_heads.size() * head_elems_ ||
       s.key_scales.size() != options_.key_heads.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "summaries[", i, "] holds keys of ", s.key_heads.size(),
        " KV heads, the profile's calibration needs ",
        options_.key_heads.size()));
  }
  return absl::OkStatus();
}

absl::Status KeyTable::Validate(absl::Span<const BlockSummary> pages) const {
  for (size_t i = 0; i < pages.size(); ++i) {
    if (absl::Status s = Check(pages[i], i); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status KeyTable::Add(absl::Span<const BlockSummary> pages) {
  if (absl::Status s = Validate(pages); !s.ok()) return s;
  const size_t L = static_cast<size_t>(options_.num_layers);
  std::vector<int8_t> q(dim_);
  for (const BlockSummary& s : pages) {
    for (size_t l = 0; l < L; ++l) {
      const float* mean = &s.layer_mean[l * dim_];
      const float scale = QuantizeInt8(mean, dim_, q.data());
      layer_rows_.insert(layer_rows_.end(), q.begin(), q.end());
      layer_scales_.push_back(scale);
      double n2 = 0;
      double* sum = &layer_sum_[l * dim_];
      for (size_t d = 0; d < dim_; ++d) {
        const double v = static_cast<double>(q[d]) * scale;
        n2 += v * v;
        sum[d] += v;
      }
      layer_norm2_.push_back(n2);
    }
    if (!options_.key_heads.empty()) {
      head_keys_.insert(head_keys_.end(), s.head_keys.begin(), s.head_keys.end());
      head_scales_.insert(head_scales_.end(), s.key_scales.begin(),
                          s.key_scales.end());
    }
    ++num_pages_;
  }
  return absl::OkStatus();
}

size_t KeyTable::MemoryBytes() const {
  return sizeof(*this) + layer_rows_.capacity() +
         layer_scales_.capacity() * sizeof(float) +
         layer_norm2_.capacity() * sizeof(double) +
         layer_sum_.capacity() * sizeof(double) + head_keys_.capacity() +
         head_scales_.capacity() * sizeof(float);
}

}  // namespace kvtier::index
