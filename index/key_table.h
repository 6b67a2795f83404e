// KeyTable: the per-page key data of one context that the flat per-layer
// and mass scorers read, beside the pooled rows of the context's tree.
//
//   layer rows  per-layer mean keys, int8 with one scale per (page, layer):
//               value = LayerRow(p, l)[d] * LayerScale(p, l)      [N][L][D]
//   head keys   int8 keys of the calibrated retrieval heads' KV heads:
//               value = HeadKeys(p, j)[t * D + d] * HeadScale(p, j)
//                                                              [N][R][T][D]
//
// Memory per page: L * (D + 12) bytes with layer rows (the int8 row, its
// scale and its squared norm), R * (T * D + 4) with head keys. The table
// also keeps the running fp64 sum of every layer's dequantised mean, for
// centring on the context mean.
//
// Thread safety: not synchronised; mutated and read under the caller's
// per-context serialisation, like ContextTree.
#ifndef KVTIER_INDEX_KEY_TABLE_H_
#define KVTIER_INDEX_KEY_TABLE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "index/summary.h"

namespace kvtier::index {

struct KeyTableOptions {
  int32_t dim = 0;
  int32_t num_layers = 0;        // > 0: keep layer rows
  std::vector<int32_t> key_heads;  // KV heads whose keys are kept (ascending)
  int32_t key_tokens = 0;        // tokens per block (with key_heads)
  bool enabled() const { return num_layers > 0 || !key_heads.empty(); }
};

class KeyTable {
 public:
  explicit KeyTable(const KeyTableOptions& options);

  // OK when every summary carries what the options ask for (layer_mean of
  // num_layers rows; head keys of exactly key_heads and key_tokens), else
  // InvalidArgument naming summaries[i] and the missing part.
  absl::Status Validate(absl::Span<const BlockSummary> pages) const;
  // Validate, then append them all; on error nothing is added.
  absl::Status Add(absl::Span<const BlockSummary> pages);

  const KeyTableOptions& options() const { return options_; }
  int64_t size() const { return num_pages_; }
  bool has_layers() const { return options_.num_layers > 0; }
  int32_t num_key_heads() const {
    return static_cast<int32_t>(options_.key_heads.size());
  }

  const int8_t* LayerRow(int64_t page, int32_t layer) const {
    return &layer_rows_[(page * options_.num_layers + layer) * dim_];
  }
  float LayerScale(int64_t page, int32_t layer) const {
    return layer_scales_[page * options_.num_layers + layer];
  }
  // |dequantised row|^2, for cosines and centring.
  double LayerNorm2(int64_t page, int32_t layer) const {
    return layer_norm2_[page * options_.num_layers + layer];
  }
  // Sum over pages of the dequantised means of `layer` [D].
  const double* LayerSum(int32_t layer) const {
    return &layer_sum_[static_cast<size_t>(layer) * dim_];
  }

  const int8_t* HeadKeys(int64_t page, int32_t slot) const {
    return &head_keys_[(page * num_key_heads() + slot) * head_elems_];
  }
  float HeadScale(int64_t page, int32_t slot) const {
    return head_scales_[page * num_key_heads() + slot];
  }

  size_t MemoryBytes() const;

 private:
  absl::Status Check(const BlockSummary& s, size_t i) const;

  const KeyTableOptions options_;
  const size_t dim_;
  const size_t head_elems_;
  int64_t num_pages_ = 0;
  std::vector<int8_t> layer_rows_;
  std::vector<float> layer_scales_;
  std::vector<double> layer_norm2_;
  std::vector<double> layer_sum_;  // [L][D]
  std::vector<int8_t> head_keys_;
  std::vector<float> head_scales_;
};

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_KEY_TABLE_H_
