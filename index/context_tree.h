// The Grid / Chunk / Page tree of one context.
//
// Pages are the context's blocks in order (segment after segment, then the
// blocks appended while decoding). Each page contributes its summary vector
// normalised to unit length, u_b = v_b / |v_b| (0 for a zero vector), so
// every page weighs the same in its parents whatever its key norm. A chunk's
// vector is the mean of its pages' u_b, a grid's vector the mean of its
// chunks' vectors. Scoring is cosine similarity, so each level also keeps its
// rows rounded to fp16, the form the Selector multiplies: [num_pages][dim],
// [num_chunks][dim], [num_grids][dim]. Page rows are u_b; chunk and grid rows
// are their means, so anchor . row is the mean affinity of the pages below
// (a group whose children point in many directions is not favoured, as it
// would be by normalising its short mean).
//
// Segments: every segment (a document, the prefix, the running sequence)
// starts a new chunk and a new grid, so no chunk or grid mixes two documents;
// the last chunk and grid of a segment may be partial. Append adds to the
// last segment, updating only the last chunk and grid: chunk sums are kept in
// fp32 and added in page order, so the incremental result is bitwise the one
// a full rebuild gives; the grid's mean is recomputed from its <=
// chunks_per_grid chunk means.
//
// Memory per page: dim * 2 bytes (fp16 row) plus its share of the chunk
// level (dim * 6 / pages_per_chunk bytes) and grid level; with
// keep_summaries the fp32 summary table (mean, min, max, radius) adds
// dim * 12 + 4 bytes.
//
// Thread safety: not synchronised. Mutations (AddSegment, Append) and a
// Select of the same context must be serialised by the caller; concurrent
// const access is safe.
#ifndef KVTIER_INDEX_CONTEXT_TREE_H_
#define KVTIER_INDEX_CONTEXT_TREE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "index/select/scorer.h"
#include "index/summary/summary.h"

namespace kvtier::index {

inline constexpr int64_t kMaxPagesPerContext = int64_t{1} << 22;
inline constexpr int32_t kMaxFanOut = 4096;

enum class TreeVector : uint8_t {
  kMean = 0,          // BlockSummary::mean (key-key plain)
  kWeightedMean = 1,  // BlockSummary::weighted_mean (head-weighted)
};

struct TreeOptions {
  int32_t dim = 128;
  int32_t pages_per_chunk = 16;
  int32_t chunks_per_grid = 16;
  int32_t block_size_tokens = 16;  // converts token budgets to blocks
  TreeVector vector = TreeVector::kMean;
  // Keep every page's fp32 summary (mean, weighted_mean, min, max, radius)
  // so the flat scorers (Quest, ArkVale, KeyDiff, ...) can run on the
  // context. Requires the BlockSummary overloads.
  bool keep_summaries = false;
};

class ContextTree {
 public:
  // InvalidArgument naming the field when an option is out of range.
  static absl::StatusOr<std::unique_ptr<ContextTree>> Create(const TreeOptions& options);

  // Adds a segment of pages. `vectors` is row-major [n][dim], n >= 1.
  // InvalidArgument: empty, wrong length, NaN/Inf, too many pages.
  // FailedPrecondition with keep_summaries (use the summary overload).
  // On error the tree is unchanged.
  absl::Status AddSegment(absl::Span<const float> vectors);
  absl::Status AddSegment(absl::Span<const BlockSummary> summaries);

  // Appends one page to the last segment (starting the first segment of an
  // empty tree). Same errors as AddSegment.
  absl::Status Append(absl::Span<const float> vector);
  absl::Status Append(const BlockSummary& summary);

  const TreeOptions& options() const { return options_; }
  int32_t dim() const { return options_.dim; }
  int64_t num_pages() const { return num_pages_; }
  int64_t num_chunks() const { return static_cast<int64_t>(chunk_count_.size()); }
  int64_t num_grids() const { return static_cast<int64_t>(grid_first_chunk_.size()) - 1; }
  int64_t num_segments() const { return static_cast<int64_t>(segment_first_page_.size()); }

  // Normalised fp16 rows of each level, row-major [count][dim].
  const uint16_t* page_rows() const { return page_rows_.data(); }
  const uint16_t* chunk_rows() const { return chunk_rows_.data(); }
  const uint16_t* grid_rows() const { return grid_rows_.data(); }

  // Children ranges: pages [ChunkFirstPage(c), ChunkFirstPage(c + 1)) and
  // chunks [GridFirstChunk(g), GridFirstChunk(g + 1)); valid for
  // c in [0, num_chunks()], g in [0, num_grids()].
  int64_t ChunkFirstPage(int64_t c) const { return chunk_first_page_[c]; }
  int64_t GridFirstChunk(int64_t g) const { return grid_first_chunk_[g]; }
  int64_t SegmentFirstPage(int64_t s) const { return segment_first_page_[s]; }

  // Exact fp32 means (before normalisation): chunk = mean of its pages' u_b,
  // grid = mean of its chunks' means, context = mean of all u_b.
  std::vector<float> ChunkMean(int64_t c) const;
  std::vector<float> GridMean(int64_t g) const;
  std::vector<float> ContextMean() const;
  // The same into out ([dim]); no allocation (the per-step KeyDiff path).
  void ContextMean(absl::Span<float> out) const;

  // Kept summaries (keep_summaries), for ScoreBlocks; num_blocks 0 otherwise.
  SummaryView summaries() const;

  // Bytes held by this tree (capacity of its arrays).
  size_t MemoryBytes() const;

 private:
  explicit ContextTree(const TreeOptions& options);
  absl::Status CheckRows(absl::Span<const float> vectors, int64_t* n) const;
  absl::Status AddSummaries(absl::Span<const BlockSummary> summaries, bool new_segment);
  // Adds pages without touching level rows; Refresh* rebuild them.
  void AddPages(const float* vectors, int64_t n, bool new_segment);
  void RefreshChunk(int64_t c);
  void RefreshGrid(int64_t g);

  const TreeOptions options_;
  int64_t num_pages_ = 0;
  std::vector<uint16_t> page_rows_, chunk_rows_, grid_rows_;
  std::vector<float> chunk_sum_;           // [C][D], unit page vectors
  std::vector<int32_t> chunk_count_;       // [C]
  std::vector<int64_t> chunk_first_page_;  // [C + 1]
  std::vector<int64_t> grid_first_chunk_;  // [G + 1]
  std::vector<int64_t> segment_first_page_;
  std::vector<double> context_sum_;      // [D]
  std::unique_ptr<SummaryTable> table_;  // keep_summaries only
};

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_CONTEXT_TREE_H_
