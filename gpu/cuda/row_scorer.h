// CudaRowScorer: fp16 row tables kept in HBM and scored, many tables at
// once, against one anchor each: the device half of the index's GPU level
// scoring (index/select/gpu_scoring.h keeps each open context's grid, chunk and
// page rows in such tables and scores a whole Select batch here).
//
// CudaRowTable: device memory for capacity_rows rows of dim fp16 elements
// on one device, freed with the object. Tables are not tied to the scorer
// that made them: any CudaRowScorer of the same device may write and score
// them (a context's rows stay in HBM whichever Select stream uses it).
//
// CudaRowScorer owns a non-blocking stream, pinned host staging and device
// scratch. QueueWrite copies rows into the pinned staging at once (the
// caller's memory may change right after) and queues nothing on the device
// yet. Score then runs one sequence on the stream: one batched host ->
// device copy of every queued write, the anchors and the segment table
// (cudaMemcpyBatchAsync where available, batch_copy.h), one ScoreSegments
// launch over all segments (kernel_shapes.h), one device -> host copy of the
// scores, and one stream synchronisation. Writes and scoring are therefore
// ordered on the device by the stream alone; nothing waits on the host in
// between.
//
// Errors: GpuStatus; kInvalidArgument naming the argument, kUnavailable
// without CUDA (this build) or a device, kOutOfMemory, kInternal for CUDA
// failures. After a failed Score the queued writes are dropped and the
// contents of the tables it wrote are unspecified: rewrite them in full.
//
// Thread safety: a CudaRowScorer is used by one thread at a time. The
// caller serialises all use of one table (the index holds the context's
// lock). Destroying a table while a Score that names it runs is undefined;
// Score returns only after its work finished, so a table may be destroyed
// whenever no Score call is in progress.
#ifndef KVTIER_GPU_CUDA_ROW_SCORER_H_
#define KVTIER_GPU_CUDA_ROW_SCORER_H_

#include <cstdint>
#include <memory>
#include <span>

#include "gpu/device_ops.h"

namespace kvtier::gpu {

// Largest table CudaRowScorer::NewTable makes.
inline constexpr int64_t kMaxRowTableRows = int64_t{1} << 26;

class CudaRowTable {
 public:
  ~CudaRowTable();
  CudaRowTable(const CudaRowTable&) = delete;
  CudaRowTable& operator=(const CudaRowTable&) = delete;

  int device() const { return device_; }
  int32_t dim() const { return dim_; }
  int64_t capacity_rows() const { return capacity_rows_; }
  // Device pointer to [capacity_rows][dim] fp16 elements.
  const uint16_t* rows() const { return rows_; }

 private:
  friend class CudaRowScorer;
  CudaRowTable(int device, int32_t dim, int64_t capacity_rows, uint16_t* rows)
      : device_(device), dim_(dim), capacity_rows_(capacity_rows), rows_(rows) {}

  const int device_;
  const int32_t dim_;
  const int64_t capacity_rows_;
  uint16_t* const rows_;
};

// num_rows rows of `table` (from row 0) scored against anchor `anchor`.
struct CudaRowSegment {
  const CudaRowTable* table = nullptr;
  int64_t num_rows = 0;  // 1..table->capacity_rows()
  int32_t anchor = 0;
};

class CudaRowScorer {
 public:
  // kUnavailable without CUDA in this build or without a usable device;
  // kInvalidArgument for an ordinal that names no device.
  static GpuStatus Create(int device_ordinal, std::unique_ptr<CudaRowScorer>* out);
  ~CudaRowScorer();

  int device() const;

  // A table of capacity_rows (1..kMaxRowTableRows) rows of dim
  // (1..kMaxScoreDim) elements on this scorer's device, contents unset.
  GpuStatus NewTable(int32_t dim, int64_t capacity_rows, std::unique_ptr<CudaRowTable>* out);

  // Stages rows [first_row, first_row + count) of `table` from host fp16
  // rows [count][table->dim()]; they reach the device at the next Score.
  // kInvalidArgument when the range exceeds the table or the table belongs
  // to another device.
  GpuStatus QueueWrite(CudaRowTable* table, int64_t first_row, const uint16_t* rows, int64_t count);

  // Runs the queued writes, then scores: for segment s, row i
  //   out[sum of earlier segments' num_rows + i] = anchors[anchor_s] . row_i
  // with anchors [num_anchors][dim] (host, fp32) and every segment's table
  // of that dim. Returns when `out` is filled.
  GpuStatus Score(const float* anchors, int32_t num_anchors, int32_t dim,
                  std::span<const CudaRowSegment> segments, float* out);

  // Drops the queued writes.
  void DiscardQueued();

  // Whether copies go through cudaMemcpyBatchAsync (batch_copy.h).
  bool UsesBatchedCopies() const;

 private:
  struct Impl;
  explicit CudaRowScorer(std::unique_ptr<Impl> impl);
  const std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::gpu

#endif  // KVTIER_GPU_CUDA_ROW_SCORER_H_
