// LevelScorer: scores the grid, chunk and page rows of a batch of contexts
// against each context's unit anchor somewhere other than this thread: the
// Selector's one-pass ("gemm") scoring of pooled key-key requests, handed
// to a device (index/select/gpu_scoring.h: a GPU) behind one interface. The
// Selector falls back to its own CPU pass whenever a LevelScorer fails
// (selector.h, SetLevelScorer / SelectorOptions::level_scorer).
//
// The mirrored scorer (NewMirroredLevelScorer) keeps, for every context it
// has scored, a copy of the tree's three row levels in the backend's memory
// (HBM for the GPU), attached to the ContextIndex (ContextIndex::
// attachment(), freed with the context). Each batch first brings the copies
// up to date, knowing how a tree changes (context_tree.h): rows are only
// ever appended, except that Append rewrites the last chunk's and the last
// grid's row. So per level it sends the rows from the last synchronised one
// on (pages) or from the last synchronised one's predecessor on (chunks,
// grids); a copy that no longer fits is replaced by one 1.5x as large and
// sent in full. Then one Score call covers every context of the batch.
// After any error the batch's copies are marked stale and are sent in full
// next time, so a failure never leaves a context scored on old rows.
//
// RowBackend is the device side: tables of fp16 rows, queued writes, and
// one scoring call (writes first, then every segment against its anchor).
// NewHostRowBackend keeps tables in host memory and scores them with
// simd::DotRowsHalf, the CPU pass's own per-row kernel, so a Selector using
// it selects bitwise what the CPU pass selects: the tests use it to check
// the mirroring (growth, appends, errors, several Selectors sharing a
// context) without a GPU.
//
// Thread safety: a LevelScorer (and its backend) is used by one thread at a
// time (the Selector's). The contexts of a batch are serialised by the
// caller as for Select (selector.h); a context's copy may be brought up to
// date by any LevelScorer whose backend has the same family().
#ifndef KVTIER_INDEX_SELECT_LEVEL_SCORER_H_
#define KVTIER_INDEX_SELECT_LEVEL_SCORER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "index/context_index.h"

namespace kvtier::index {

// One context of a batch and its anchor, already scaled to unit length
// (UnitVector), [context->tree().dim()] values.
struct LevelJob {
  ContextIndex* context = nullptr;
  const float* unit_anchor = nullptr;
};

class LevelScorer {
 public:
  virtual ~LevelScorer() = default;

  // For each job in order, the dot products of its unit anchor with every
  // grid, chunk and page row of its context's tree, written to out job
  // after job: [G_0][C_0][N_0][G_1]... (the Selector's kGemm layout). The
  // values equal simd::DotRowsHalf's up to fp32 summation order. On error
  // out is unspecified.
  virtual absl::Status ScoreLevels(absl::Span<const LevelJob> jobs, float* out) = 0;

  // "host" or "cuda:<ordinal>".
  virtual std::string name() const = 0;
};

class RowBackend {
 public:
  class Table {
   public:
    virtual ~Table() = default;
    virtual int64_t capacity_rows() const = 0;
  };
  // num_rows rows of `table` from row 0, scored against anchors[anchor].
  struct Segment {
    const Table* table = nullptr;
    int64_t num_rows = 0;
    int32_t anchor = 0;
  };

  virtual ~RowBackend() = default;

  // Tables of backends of one family are interchangeable (one device).
  virtual uint64_t family() const = 0;
  virtual std::string name() const = 0;

  // A table for capacity_rows rows of dim fp16 values; contents unset.
  virtual absl::StatusOr<std::unique_ptr<Table>> NewTable(int32_t dim, int64_t capacity_rows) = 0;
  // Queues rows [first_row, first_row + count) of `table` from host fp16
  // rows [count][dim]; the caller's memory may change once this returns.
  // They land at the next Score.
  virtual absl::Status QueueWrite(Table* table, int64_t first_row, const uint16_t* rows,
                                  int64_t count) = 0;
  // Applies the queued writes, then out[stacked row] = anchors[anchor] .
  // row for every segment in order; anchors [num_anchors][dim].
  virtual absl::Status Score(absl::Span<const float> anchors, int32_t dim,
                             absl::Span<const Segment> segments, float* out) = 0;
  virtual void DiscardQueued() = 0;
};

// Host tables scored with simd::DotRowsHalf (family 1).
std::unique_ptr<RowBackend> NewHostRowBackend();

// The mirrored LevelScorer over `backend` (see above).
std::unique_ptr<LevelScorer> NewMirroredLevelScorer(std::unique_ptr<RowBackend> backend);

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_SELECT_LEVEL_SCORER_H_
