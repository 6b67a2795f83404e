#include "index/summary/key_table.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace kvtier::index {

KeyTable::KeyTable(const KeyTableOptions& options)
    : options_(options),
      dim_(static_cast<size_t>(options.dim)),
      head_elems_(static_cast<size_t>(options.key_tokens) * options.dim),
      layer_sum_(static_cast<size_t>(options.num_layers) * options.dim, 0.0),
      heads_(options.key_heads.size()) {
  for (HeadColumn& h : heads_) {
    h.open_sum.assign(dim_, 0.0f);
    h.open_max.assign(dim_, 0.0f);
    h.open_min.assign(dim_, 0.0f);
  }
}

absl::Status KeyTable::Check(const BlockSummary& s, size_t i) const {
  const size_t L = static_cast<size_t>(options_.num_layers);
  if (L > 0 && (s.num_layers != options_.num_layers || s.layer_mean.size() != L * dim_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("summaries[", i, "] has ", s.layer_mean.size() / std::max<size_t>(dim_, 1),
                     " per-layer means, the context needs ", L,
                     " (index.summary_per_layer was off when it was put?)"));
  }
  if (!options_.key_heads.empty() &&
      (s.key_heads != options_.key_heads || s.key_tokens != options_.key_tokens ||
       s.head_keys.size() != options_.key_heads.size() * head_elems_ ||
       s.key_scales.size() != options_.key_heads.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("summaries[", i, "] holds keys of ", s.key_heads.size(),
                     " KV heads, the profile's calibration needs ", options_.key_heads.size()));
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
    if (!options_.key_heads.empty()) AddHeadKeys(s);
    ++num_pages_;
  }
  return absl::OkStatus();
}

void KeyTable::AddHeadKeys(const BlockSummary& s) {
  const size_t D = dim_;
  const size_t T = static_cast<size_t>(options_.key_tokens);
  const int64_t P = options_.pages_per_chunk;
  const bool new_chunk = num_pages_ % P == 0;
  std::vector<float> mean(D);
  for (size_t j = 0; j < heads_.size(); ++j) {
    HeadColumn& h = heads_[j];
    const int8_t* src = &s.head_keys[j * head_elems_];
    const float scale = s.key_scales[j];
    // -128 cannot come from QuantizeInt8; a decoded summary holding one is
    // clamped, so every int8 kernel (int8_dot.h) sees [-127, 127].
    const size_t at = h.keys.size();
    h.keys.resize(at + head_elems_);
    for (size_t i = 0; i < head_elems_; ++i) h.keys[at + i] = std::max<int8_t>(src[i], -127);
    const int8_t* k = &h.keys[at];
    h.scales.push_back(scale);

    // Page summary: the mean key (own scale), the per-channel max and min
    // and the key of the largest norm (the keys' own int8 values, scale
    // `scale`).
    const size_t prow = h.page_rows.size();
    h.page_rows.resize(prow + kSummaryRows * D);
    int8_t* pmax = &h.page_rows[prow + D];
    int8_t* pmin = &h.page_rows[prow + 2 * D];
    size_t top = 0;
    int64_t top_norm2 = -1;
    for (size_t t = 0; t < T; ++t) {
      int64_t n2 = 0;
      for (size_t d = 0; d < D; ++d) n2 += int32_t{k[t * D + d]} * k[t * D + d];
      if (n2 > top_norm2) top_norm2 = n2, top = t;
    }
    std::copy(k + top * D, k + (top + 1) * D, &h.page_rows[prow + 3 * D]);
    const float top_norm = scale * std::sqrt(static_cast<float>(top_norm2));
    for (size_t d = 0; d < D; ++d) {
      int32_t sum = 0;
      int8_t hi = -127, lo = 127;
      for (size_t t = 0; t < T; ++t) {
        const int8_t v = k[t * D + d];
        sum += v;
        hi = std::max(hi, v);
        lo = std::min(lo, v);
      }
      mean[d] = scale * static_cast<float>(sum) / static_cast<float>(T);
      pmax[d] = hi;
      pmin[d] = lo;
    }
    h.page_mean_scales.push_back(QuantizeInt8(mean.data(), D, &h.page_rows[prow]));

    // Chunk summary: the mean of its pages' means and the per-channel max
    // and min of its pages' means (a box around them: Quest's bound on the
    // best page mean, far tighter than one over all the chunk's tokens,
    // whose rotary channels span everything), kept in float for the open
    // chunk and re-quantised per page.
    if (new_chunk) {
      std::fill(h.open_sum.begin(), h.open_sum.end(), 0.0f);
      h.chunk_rows.resize(h.chunk_rows.size() + kSummaryRows * D);
      h.chunk_scales.resize(h.chunk_scales.size() + 3);
      h.open_top_norm = -1.0f;
    }
    const int64_t in_chunk = num_pages_ % P + 1;
    for (size_t d = 0; d < D; ++d) {
      h.open_sum[d] += mean[d];
      h.open_max[d] = new_chunk ? mean[d] : std::max(h.open_max[d], mean[d]);
      h.open_min[d] = new_chunk ? mean[d] : std::min(h.open_min[d], mean[d]);
    }
    const size_t crow = h.chunk_rows.size() - kSummaryRows * D;
    float* cs = &h.chunk_scales[h.chunk_scales.size() - 3];
    if (top_norm > h.open_top_norm) {  // the chunk's key of the largest norm
      h.open_top_norm = top_norm;
      std::copy(k + top * D, k + (top + 1) * D, &h.chunk_rows[crow + 3 * D]);
      cs[2] = scale;
    }
    for (size_t d = 0; d < D; ++d) mean[d] = h.open_sum[d] / static_cast<float>(in_chunk);
    cs[0] = QuantizeInt8(mean.data(), D, &h.chunk_rows[crow]);
    float bound = 0.0f;
    for (size_t d = 0; d < D; ++d) {
      bound = std::max({bound, std::fabs(h.open_max[d]), std::fabs(h.open_min[d])});
    }
    cs[1] = bound / 127.0f;
    for (size_t d = 0; d < D; ++d) {
      const float inv = bound > 0 ? 127.0f / bound : 0.0f;
      h.chunk_rows[crow + D + d] =
          static_cast<int8_t>(std::clamp(std::nearbyint(h.open_max[d] * inv), -127.0f, 127.0f));
      h.chunk_rows[crow + 2 * D + d] =
          static_cast<int8_t>(std::clamp(std::nearbyint(h.open_min[d] * inv), -127.0f, 127.0f));
    }
  }
}

size_t KeyTable::HeadKeyBytes() const {
  size_t bytes = 0;
  for (const HeadColumn& h : heads_) {
    bytes +=
        h.keys.capacity() + h.scales.capacity() * sizeof(float) + h.page_rows.capacity() +
        h.page_mean_scales.capacity() * sizeof(float) + h.chunk_rows.capacity() +
        h.chunk_scales.capacity() * sizeof(float) +
        (h.open_sum.capacity() + h.open_max.capacity() + h.open_min.capacity()) * sizeof(float);
  }
  return bytes;
}

size_t KeyTable::MemoryBytes() const {
  return sizeof(*this) + layer_rows_.capacity() + layer_scales_.capacity() * sizeof(float) +
         layer_norm2_.capacity() * sizeof(double) + layer_sum_.capacity() * sizeof(double) +
         HeadKeyBytes();
}

}  // namespace kvtier::index
