#include "index/context_tree.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "index/kernels/simd.h"
#include "index/validate.h"

namespace kvtier::index {
absl::StatusOr<std::unique_ptr<ContextTree>> ContextTree::Create(const TreeOptions& o) {
  absl::Status s = CheckCount("options", "dim", o.dim, kMaxHeadDim);
  if (s.ok()) s = CheckCount("options", "pages_per_chunk", o.pages_per_chunk, kMaxFanOut);
  if (s.ok()) s = CheckCount("options", "chunks_per_grid", o.chunks_per_grid, kMaxFanOut);
  if (s.ok()) {
    s = CheckCount("options", "block_size_tokens", o.block_size_tokens, kMaxBlockSizeTokens);
  }
  if (!s.ok()) return s;
  if (o.vector != TreeVector::kMean && o.vector != TreeVector::kWeightedMean) {
    return absl::InvalidArgumentError("options.vector is unknown");
  }
  return std::unique_ptr<ContextTree>(new ContextTree(o));
}

ContextTree::ContextTree(const TreeOptions& options)
    : options_(options),
      chunk_first_page_{0},
      grid_first_chunk_{0},
      context_sum_(options.dim, 0.0) {
  if (options_.keep_summaries) {
    table_ = std::make_unique<SummaryTable>(options_.dim);
  }
}

absl::Status ContextTree::CheckRows(absl::Span<const float> vectors, int64_t* n) const {
  const size_t D = static_cast<size_t>(options_.dim);
  if (vectors.empty()) {
    return absl::InvalidArgumentError("segment is empty (no pages)");
  }
  if (vectors.size() % D != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("vectors has ", vectors.size(), " elements, not a multiple of dim ", D));
  }
  *n = static_cast<int64_t>(vectors.size() / D);
  if (num_pages_ + *n > kMaxPagesPerContext) {
    return absl::InvalidArgumentError(absl::StrCat("context would hold ", num_pages_ + *n,
                                                   " pages, limit ", kMaxPagesPerContext));
  }
  return CheckFinite("vectors", vectors.data(), vectors.size());
}

absl::Status ContextTree::AddSegment(absl::Span<const float> vectors) {
  if (table_ != nullptr) {
    return absl::FailedPreconditionError("keep_summaries trees take BlockSummary pages");
  }
  int64_t n = 0;
  if (absl::Status s = CheckRows(vectors, &n); !s.ok()) return s;
  AddPages(vectors.data(), n, /*new_segment=*/true);
  return absl::OkStatus();
}

absl::Status ContextTree::Append(absl::Span<const float> vector) {
  if (table_ != nullptr) {
    return absl::FailedPreconditionError("keep_summaries trees take BlockSummary pages");
  }
  if (absl::Status s = CheckVector("vector", vector, options_.dim, false); !s.ok()) {
    return s;
  }
  int64_t n = 0;
  if (absl::Status s = CheckRows(vector, &n); !s.ok()) return s;
  AddPages(vector.data(), 1, /*new_segment=*/num_pages_ == 0);
  return absl::OkStatus();
}

absl::Status ContextTree::AddSegment(absl::Span<const BlockSummary> pages) {
  if (pages.empty()) {
    return absl::InvalidArgumentError("segment is empty (no pages)");
  }
  return AddSummaries(pages, /*new_segment=*/true);
}

absl::Status ContextTree::Append(const BlockSummary& summary) {
  return AddSummaries(absl::MakeConstSpan(&summary, 1), num_pages_ == 0);
}

absl::Status ContextTree::AddSummaries(absl::Span<const BlockSummary> pages, bool new_segment) {
  const size_t D = static_cast<size_t>(options_.dim);
  const bool weighted = options_.vector == TreeVector::kWeightedMean;
  std::vector<float> vectors;
  vectors.reserve(pages.size() * D);
  for (size_t i = 0; i < pages.size(); ++i) {
    const std::vector<float>& v = weighted ? pages[i].weighted_mean : pages[i].mean;
    if (pages[i].dim != options_.dim || v.size() != D) {
      return absl::InvalidArgumentError(
          absl::StrCat("summaries[", i, "].", weighted ? "weighted_mean" : "mean", " has ",
                       v.size(), " elements (dim ", pages[i].dim, "), expected dim ", D));
    }
    vectors.insert(vectors.end(), v.begin(), v.end());
  }
  int64_t n = 0;
  if (absl::Status s = CheckRows(vectors, &n); !s.ok()) return s;
  if (table_ != nullptr) {
    // Validate every page in a scratch table first so that a failure leaves
    // the context unchanged.
    SummaryTable probe(options_.dim);
    for (const BlockSummary& p : pages) {
      if (absl::Status s = probe.Add(p); !s.ok()) return s;
    }
    const SummaryView a = table_->view(), b = probe.view();
    if (table_->size() > 0 && ((a.weighted_mean == nullptr) != (b.weighted_mean == nullptr) ||
                               (a.min == nullptr) != (b.min == nullptr))) {
      return absl::InvalidArgumentError(
          "summaries have a different set of optional arrays than the "
          "context's earlier pages");
    }
    for (const BlockSummary& p : pages) {
      if (absl::Status s = table_->Add(p); !s.ok()) return s;
    }
  }
  AddPages(vectors.data(), n, new_segment);
  return absl::OkStatus();
}

void ContextTree::AddPages(const float* vectors, int64_t n, bool new_segment) {
  const size_t D = static_cast<size_t>(options_.dim);
  page_rows_.resize((num_pages_ + n) * D);
  int64_t first_dirty_chunk = num_chunks();
  bool open_new = new_segment || num_pages_ == 0;
  if (open_new) segment_first_page_.push_back(num_pages_);
  std::vector<float> unit(D);
  for (int64_t i = 0; i < n; ++i) {
    const float* v = vectors + i * D;
    const float norm = std::sqrt(simd::Dot(v, v, D));
    const float inv = norm > 0 ? 1.0f / norm : 0.0f;
    for (size_t d = 0; d < D; ++d) unit[d] = v[d] * inv;
    simd::FloatToHalfN(unit.data(), page_rows_.data() + num_pages_ * D, D);
    for (size_t d = 0; d < D; ++d) context_sum_[d] += unit[d];

    const int64_t chunks = num_chunks();
    const bool chunk_full = chunks == 0 || chunk_count_.back() >= options_.pages_per_chunk;
    if (open_new || chunk_full) {
      const int64_t grids = num_grids();
      const int64_t grid_chunks =
          grids == 0 ? 0 : grid_first_chunk_[grids] - grid_first_chunk_[grids - 1];
      if (open_new || grids == 0 || grid_chunks >= options_.chunks_per_grid) {
        grid_first_chunk_.push_back(chunks + 1);
      } else {
        grid_first_chunk_.back() = chunks + 1;
      }
      chunk_count_.push_back(0);
      chunk_sum_.resize((chunks + 1) * D, 0.0f);
      chunk_first_page_.push_back(num_pages_);
      open_new = false;
    }
    const int64_t c = num_chunks() - 1;
    float* sum = &chunk_sum_[c * D];
    for (size_t d = 0; d < D; ++d) sum[d] += unit[d];
    ++chunk_count_[c];
    ++num_pages_;
    chunk_first_page_[c + 1] = num_pages_;
    first_dirty_chunk = std::min(first_dirty_chunk, c);
  }
  chunk_rows_.resize(num_chunks() * D);
  grid_rows_.resize(num_grids() * D);
  for (int64_t c = first_dirty_chunk; c < num_chunks(); ++c) RefreshChunk(c);
  // Grids holding a dirty chunk: from the one containing first_dirty_chunk.
  int64_t g = num_grids() - 1;
  while (g > 0 && grid_first_chunk_[g] > first_dirty_chunk) --g;
  for (; g < num_grids(); ++g) RefreshGrid(g);
}

void ContextTree::RefreshChunk(int64_t c) {
  const std::vector<float> mean = ChunkMean(c);
  simd::FloatToHalfN(mean.data(), chunk_rows_.data() + c * options_.dim, options_.dim);
}

void ContextTree::RefreshGrid(int64_t g) {
  const std::vector<float> mean = GridMean(g);
  simd::FloatToHalfN(mean.data(), grid_rows_.data() + g * options_.dim, options_.dim);
}

std::vector<float> ContextTree::ChunkMean(int64_t c) const {
  const size_t D = static_cast<size_t>(options_.dim);
  std::vector<float> m(D);
  const float inv = 1.0f / static_cast<float>(chunk_count_[c]);
  for (size_t d = 0; d < D; ++d) m[d] = chunk_sum_[c * D + d] * inv;
  return m;
}

std::vector<float> ContextTree::GridMean(int64_t g) const {
  const size_t D = static_cast<size_t>(options_.dim);
  std::vector<float> m(D, 0.0f);
  const int64_t first = grid_first_chunk_[g], last = grid_first_chunk_[g + 1];
  for (int64_t c = first; c < last; ++c) {
    const float inv = 1.0f / static_cast<float>(chunk_count_[c]);
    for (size_t d = 0; d < D; ++d) m[d] += chunk_sum_[c * D + d] * inv;
  }
  const float inv = 1.0f / static_cast<float>(last - first);
  for (size_t d = 0; d < D; ++d) m[d] *= inv;
  return m;
}

std::vector<float> ContextTree::ContextMean() const {
  std::vector<float> m(options_.dim, 0.0f);
  ContextMean(absl::MakeSpan(m));
  return m;
}

void ContextTree::ContextMean(absl::Span<float> out) const {
  for (size_t d = 0; d < out.size(); ++d) {
    out[d] = num_pages_ == 0
                 ? 0.0f
                 : static_cast<float>(context_sum_[d] / static_cast<double>(num_pages_));
  }
}

SummaryView ContextTree::summaries() const {
  if (table_ == nullptr) {
    SummaryView v;
    v.dim = options_.dim;
    return v;
  }
  return table_->view();
}

size_t ContextTree::MemoryBytes() const {
  size_t bytes = sizeof(*this);
  bytes +=
      (page_rows_.capacity() + chunk_rows_.capacity() + grid_rows_.capacity()) * sizeof(uint16_t);
  bytes += chunk_sum_.capacity() * sizeof(float);
  bytes += chunk_count_.capacity() * sizeof(int32_t);
  bytes += (chunk_first_page_.capacity() + grid_first_chunk_.capacity() +
            segment_first_page_.capacity()) *
           sizeof(int64_t);
  bytes += context_sum_.capacity() * sizeof(double);
  if (table_ != nullptr) {
    const SummaryView v = table_->view();
    const size_t D = static_cast<size_t>(options_.dim);
    size_t per_page = D;
    if (v.weighted_mean != nullptr) per_page += D;
    if (v.min != nullptr) per_page += 2 * D + 1;
    bytes += static_cast<size_t>(v.num_blocks) * per_page * sizeof(float);
  }
  return bytes;
}

}  // namespace kvtier::index
