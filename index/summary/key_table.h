// KeyTable: the per-page key data of one context that the flat per-layer
// and mass scorers read, beside the pooled rows of the context's tree.
//
//   layer rows  per-layer mean keys, int8 with one scale per (page, layer):
//               value = LayerRow(p, l)[d] * LayerScale(p, l)      [N][L][D]
//   head keys   int8 keys of the calibrated retrieval heads' KV heads, one
//               column per KV head (slot j) so a head's keys stream from
//               one array:
//               value = HeadKeys(p, j)[t * D + d] * HeadScale(p, j)
//                                                         [R][N][T][D]
//   summaries   per slot, page and chunk of pages_per_chunk pages, what the
//               mass scorer's tree (mass_tree.h) screens before it reads a
//               page's keys:
//               PageSummary(p, j)  = [mean | max | min | top] of the
//                                    page's keys (mean: own scale; max,
//                                    min: the keys' int8 values; top: the
//                                    key of the largest norm)      [4][D]
//               ChunkSummary(c, j) = [mean | max | min] of its pages' mean
//                                    keys (mean: own scale; max, min: one
//                                    shared scale) and top, the key of the
//                                    largest norm of its tokens (its
//                                    page's scale)                 [4][D]
//
// Memory per page: L * (D + 12) bytes with layer rows (the int8 row, its
// scale and its squared norm), R * (T * D + 4 * D + 8) with head keys, plus
// R * (4 * D + 12) per chunk. The table also keeps the running fp64 sum of
// every layer's dequantised mean, for centring on the context mean.
//
// Thread safety: not synchronised; mutated and read under the caller's
// per-context serialisation, like ContextTree.
#ifndef KVTIER_INDEX_SUMMARY_KEY_TABLE_H_
#define KVTIER_INDEX_SUMMARY_KEY_TABLE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "index/summary/summary.h"

namespace kvtier::index {

struct KeyTableOptions {
  int32_t dim = 0;
  int32_t num_layers = 0;          // > 0: keep layer rows
  std::vector<int32_t> key_heads;  // KV heads whose keys are kept (ascending)
  int32_t key_tokens = 0;          // tokens per block (with key_heads)
  int32_t pages_per_chunk = 16;    // pages per head-key chunk summary, >= 1
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
  int32_t num_key_heads() const { return static_cast<int32_t>(options_.key_heads.size()); }

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
    return &heads_[slot].keys[page * head_elems_];
  }
  float HeadScale(int64_t page, int32_t slot) const { return heads_[slot].scales[page]; }

  // Head-key summaries (see the file comment). Rows are [mean | max | min |
  // top], each dim int8 values; the mean's scale is MeanScale, max and min
  // share BoundScale (for a page: HeadScale), top's is TopScale (for a
  // page: HeadScale).
  static constexpr size_t kSummaryRows = 4;
  int32_t pages_per_chunk() const { return options_.pages_per_chunk; }
  int64_t num_chunks() const {
    return (num_pages_ + options_.pages_per_chunk - 1) / options_.pages_per_chunk;
  }
  const int8_t* PageSummary(int64_t page, int32_t slot) const {
    return &heads_[slot].page_rows[page * kSummaryRows * dim_];
  }
  float PageMeanScale(int64_t page, int32_t slot) const {
    return heads_[slot].page_mean_scales[page];
  }
  const int8_t* ChunkSummary(int64_t chunk, int32_t slot) const {
    return &heads_[slot].chunk_rows[chunk * kSummaryRows * dim_];
  }
  float ChunkMeanScale(int64_t chunk, int32_t slot) const {
    return heads_[slot].chunk_scales[3 * chunk];
  }
  float ChunkBoundScale(int64_t chunk, int32_t slot) const {
    return heads_[slot].chunk_scales[3 * chunk + 1];
  }
  float ChunkTopScale(int64_t chunk, int32_t slot) const {
    return heads_[slot].chunk_scales[3 * chunk + 2];
  }

  size_t MemoryBytes() const;
  // Bytes of the head keys and their summaries alone.
  size_t HeadKeyBytes() const;

 private:
  // One retrieval KV head's keys and summaries.
  struct HeadColumn {
    std::vector<int8_t> keys;             // [N][T][D]
    std::vector<float> scales;            // [N]
    std::vector<int8_t> page_rows;        // [N][4][D]
    std::vector<float> page_mean_scales;  // [N]
    std::vector<int8_t> chunk_rows;       // [C][4][D]
    std::vector<float> chunk_scales;      // [C][3]: mean, bound, top
    // The last chunk's dequantised page means (sum) and bounds, in float,
    // so appending a page updates its summary without re-reading pages.
    std::vector<float> open_sum, open_max, open_min;  // [D]
    float open_top_norm = -1.0f;                      // norm of the open chunk's top key
  };
  absl::Status Check(const BlockSummary& s, size_t i) const;
  void AddHeadKeys(const BlockSummary& s);

  const KeyTableOptions options_;
  const size_t dim_;
  const size_t head_elems_;
  int64_t num_pages_ = 0;
  std::vector<int8_t> layer_rows_;
  std::vector<float> layer_scales_;
  std::vector<double> layer_norm2_;
  std::vector<double> layer_sum_;  // [L][D]
  std::vector<HeadColumn> heads_;  // one per key_heads entry
};

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_SUMMARY_KEY_TABLE_H_
