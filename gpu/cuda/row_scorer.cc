#include "gpu/cuda/row_scorer.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/cuda/batch_copy.h"
#include "gpu/cuda/cuda_status.h"
#include "gpu/cuda/kernels.h"
#include "gpu/cuda/scoped_device.h"

namespace kvtier::gpu {
namespace {

GpuStatus Invalid(std::string message) {
  return GpuStatus::Error(GpuStatus::kInvalidArgument, std::move(message));
}

size_t AlignUp(size_t n) { return (n + 63) / 64 * 64; }

// Grows a pinned host buffer to at least `need` bytes (doubling), keeping
// the first `keep` bytes. The device must be current.
cudaError_t GrowPinned(std::byte** buffer, size_t* capacity, size_t need, size_t keep) {
  if (need <= *capacity) return cudaSuccess;
  size_t grown = *capacity == 0 ? size_t{1} << 20 : *capacity;
  while (grown < need) grown *= 2;
  void* fresh = nullptr;
  const cudaError_t err = cudaHostAlloc(&fresh, grown, cudaHostAllocPortable);
  if (err != cudaSuccess) return err;
  if (keep > 0) std::memcpy(fresh, *buffer, keep);
  if (*buffer != nullptr) cudaFreeHost(*buffer);
  *buffer = static_cast<std::byte*>(fresh);
  *capacity = grown;
  return cudaSuccess;
}

// Grows device scratch to at least `need` bytes (doubling); contents are
// not kept. Only called while no work of the scorer is in flight.
cudaError_t GrowDevice(void** buffer, size_t* capacity, size_t need) {
  if (need <= *capacity) return cudaSuccess;
  size_t grown = *capacity == 0 ? size_t{64} << 10 : *capacity;
  while (grown < need) grown *= 2;
  void* fresh = nullptr;
  const cudaError_t err = cudaMalloc(&fresh, grown);
  if (err != cudaSuccess) return err;
  if (*buffer != nullptr) cudaFree(*buffer);
  *buffer = fresh;
  *capacity = grown;
  return cudaSuccess;
}

}  // namespace

struct CudaRowScorer::Impl {
  struct Write {
    CudaRowTable* table;
    int64_t first_row;
    int64_t count;
    size_t staging_offset;
  };

  int device = -1;
  cudaStream_t stream = nullptr;
  std::atomic<bool> use_batch{BatchCopyCompiled()};

  // Pinned: the queued rows, then (during Score) anchors and segments.
  std::byte* staging = nullptr;
  size_t staging_capacity = 0;
  size_t staging_used = 0;
  std::vector<Write> writes;

  void* d_anchors = nullptr;
  size_t d_anchors_capacity = 0;
  void* d_segments = nullptr;
  size_t d_segments_capacity = 0;
  void* d_scores = nullptr;
  size_t d_scores_capacity = 0;
  std::byte* h_scores = nullptr;  // pinned
  size_t h_scores_capacity = 0;

  ~Impl() {
    ScopedDevice scoped(device);
    if (stream != nullptr) cudaStreamSynchronize(stream);
    if (staging != nullptr) cudaFreeHost(staging);
    if (h_scores != nullptr) cudaFreeHost(h_scores);
    for (void* p : {d_anchors, d_segments, d_scores}) {
      if (p != nullptr) cudaFree(p);
    }
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  GpuStatus Fail(cudaError_t err, const char* step) {
    cudaStreamSynchronize(stream);  // nothing may still read the staging
    writes.clear();
    staging_used = 0;
    return CudaErrorToGpuStatus(err, std::string("CudaRowScorer ") + step);
  }
};

CudaRowTable::~CudaRowTable() {
  ScopedDevice scoped(device_);
  cudaFree(rows_);
}

GpuStatus CudaRowScorer::Create(int device_ordinal, std::unique_ptr<CudaRowScorer>* out) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return CudaErrorToGpuStatus(err, "cudaGetDeviceCount");
  if (count == 0) return GpuStatus::Error(GpuStatus::kUnavailable, "no CUDA device");
  if (device_ordinal < 0 || device_ordinal >= count) {
    return Invalid("device_ordinal " + std::to_string(device_ordinal) + " but " +
                   std::to_string(count) + " CUDA devices are visible");
  }
  auto impl = std::make_unique<Impl>();
  impl->device = device_ordinal;
  ScopedDevice scoped(device_ordinal);
  if (scoped.status() != cudaSuccess) return CudaErrorToGpuStatus(scoped.status(), "cudaSetDevice");
  err = cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) return CudaErrorToGpuStatus(err, "cudaStreamCreateWithFlags");
  out->reset(new CudaRowScorer(std::move(impl)));
  return GpuStatus::Ok();
}

CudaRowScorer::CudaRowScorer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaRowScorer::~CudaRowScorer() = default;

int CudaRowScorer::device() const { return impl_->device; }

bool CudaRowScorer::UsesBatchedCopies() const { return impl_->use_batch.load(); }

GpuStatus CudaRowScorer::NewTable(int32_t dim, int64_t capacity_rows,
                                  std::unique_ptr<CudaRowTable>* out) {
  if (dim < 1 || dim > kMaxScoreDim) {
    return Invalid("NewTable dim must be in 1.." + std::to_string(kMaxScoreDim) + ", got " +
                   std::to_string(dim));
  }
  if (capacity_rows < 1 || capacity_rows > kMaxRowTableRows) {
    return Invalid("NewTable capacity_rows must be in 1..kMaxRowTableRows, got " +
                   std::to_string(capacity_rows));
  }
  ScopedDevice scoped(impl_->device);
  void* rows = nullptr;
  const size_t bytes = static_cast<size_t>(capacity_rows) * dim * sizeof(uint16_t);
  const cudaError_t err = cudaMalloc(&rows, bytes);
  if (err != cudaSuccess) {
    return CudaErrorToGpuStatus(err, "NewTable cudaMalloc " + std::to_string(bytes));
  }
  out->reset(new CudaRowTable(impl_->device, dim, capacity_rows, static_cast<uint16_t*>(rows)));
  return GpuStatus::Ok();
}

GpuStatus CudaRowScorer::QueueWrite(CudaRowTable* table, int64_t first_row, const uint16_t* rows,
                                    int64_t count) {
  if (table == nullptr || rows == nullptr) return Invalid("QueueWrite: null table or rows");
  if (table->device() != impl_->device) {
    return Invalid("QueueWrite: table of device " + std::to_string(table->device()) +
                   ", scorer of device " + std::to_string(impl_->device));
  }
  if (first_row < 0 || count < 1 || first_row > table->capacity_rows() - count) {
    return Invalid("QueueWrite: rows [" + std::to_string(first_row) + ", +" +
                   std::to_string(count) + ") outside a table of " +
                   std::to_string(table->capacity_rows()) + " rows");
  }
  const size_t bytes = static_cast<size_t>(count) * table->dim() * sizeof(uint16_t);
  const size_t offset = AlignUp(impl_->staging_used);
  ScopedDevice scoped(impl_->device);
  const cudaError_t err =
      GrowPinned(&impl_->staging, &impl_->staging_capacity, offset + bytes, impl_->staging_used);
  if (err != cudaSuccess) return CudaErrorToGpuStatus(err, "QueueWrite cudaHostAlloc");
  std::memcpy(impl_->staging + offset, rows, bytes);
  impl_->staging_used = offset + bytes;
  impl_->writes.push_back({table, first_row, count, offset});
  return GpuStatus::Ok();
}

void CudaRowScorer::DiscardQueued() {
  impl_->writes.clear();
  impl_->staging_used = 0;
}

GpuStatus CudaRowScorer::Score(const float* anchors, int32_t num_anchors, int32_t dim,
                               std::span<const CudaRowSegment> segments, float* out) {
  Impl& m = *impl_;
  if (anchors == nullptr || out == nullptr) return Invalid("Score: null anchors or out");
  if (num_anchors < 1 || dim < 1 || dim > kMaxScoreDim) {
    return Invalid("Score: num_anchors " + std::to_string(num_anchors) + ", dim " +
                   std::to_string(dim));
  }
  if (segments.empty() || segments.size() > static_cast<size_t>(kMaxSegments)) {
    return Invalid("Score: " + std::to_string(segments.size()) + " segments");
  }
  int64_t total = 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    const CudaRowSegment& seg = segments[s];
    if (seg.table == nullptr || seg.table->device() != m.device || seg.table->dim() != dim ||
        seg.num_rows < 1 || seg.num_rows > seg.table->capacity_rows() || seg.anchor < 0 ||
        seg.anchor >= num_anchors) {
      return Invalid("Score: segment " + std::to_string(s) +
                     " names no table of this device and dim, or rows or anchor out of range");
    }
    total += seg.num_rows;
  }
  if (total > kMaxScoreRows) return Invalid("Score: above kMaxScoreRows rows in all");

  ScopedDevice scoped(m.device);
  if (scoped.status() != cudaSuccess) return m.Fail(scoped.status(), "cudaSetDevice");
  const size_t anchor_bytes = static_cast<size_t>(num_anchors) * dim * sizeof(float);
  const size_t segment_bytes = segments.size() * sizeof(RowSegment);
  const size_t score_bytes = static_cast<size_t>(total) * sizeof(float);
  const size_t anchor_offset = AlignUp(m.staging_used);
  const size_t segment_offset = AlignUp(anchor_offset + anchor_bytes);
  cudaError_t err =
      GrowPinned(&m.staging, &m.staging_capacity, segment_offset + segment_bytes, m.staging_used);
  if (err == cudaSuccess) err = GrowDevice(&m.d_anchors, &m.d_anchors_capacity, anchor_bytes);
  if (err == cudaSuccess) err = GrowDevice(&m.d_segments, &m.d_segments_capacity, segment_bytes);
  if (err == cudaSuccess) err = GrowDevice(&m.d_scores, &m.d_scores_capacity, score_bytes);
  if (err == cudaSuccess) err = GrowPinned(&m.h_scores, &m.h_scores_capacity, score_bytes, 0);
  if (err != cudaSuccess) return m.Fail(err, "buffers");

  std::memcpy(m.staging + anchor_offset, anchors, anchor_bytes);
  auto* table = reinterpret_cast<RowSegment*>(m.staging + segment_offset);
  int64_t offset = 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    RowSegment row;
    row.rows = segments[s].table->rows();
    row.num_rows = segments[s].num_rows;
    row.out_offset = offset;
    row.anchor = segments[s].anchor;
    std::memcpy(&table[s], &row, sizeof(row));
    offset += segments[s].num_rows;
  }

  std::vector<PlannedCopy> copies;
  copies.reserve(m.writes.size() + 2);
  for (const Impl::Write& w : m.writes) {
    const size_t bytes = static_cast<size_t>(w.count) * w.table->dim() * sizeof(uint16_t);
    copies.push_back({const_cast<uint16_t*>(w.table->rows()) + w.first_row * w.table->dim(),
                      m.staging + w.staging_offset, bytes, 0});
  }
  copies.push_back({m.d_anchors, m.staging + anchor_offset, anchor_bytes, 0});
  copies.push_back({m.d_segments, m.staging + segment_offset, segment_bytes, 0});
  err = EnqueueCopies(copies, CopyDirection::kToArena, m.device, m.stream, &m.use_batch);
  if (err != cudaSuccess) return m.Fail(err, "host -> device copies");

  SegmentScoreParams p;
  p.segments = static_cast<const RowSegment*>(m.d_segments);
  p.num_segments = static_cast<int32_t>(segments.size());
  p.total_rows = total;
  p.anchors = static_cast<const float*>(m.d_anchors);
  p.num_anchors = num_anchors;
  p.dim = dim;
  p.scores = static_cast<float*>(m.d_scores);
  GpuStatus launched = ScoreSegments(p, m.stream);
  if (!launched.ok()) {
    cudaStreamSynchronize(m.stream);
    DiscardQueued();
    return launched;
  }
  err = cudaMemcpyAsync(m.h_scores, m.d_scores, score_bytes, cudaMemcpyDeviceToHost, m.stream);
  if (err != cudaSuccess) return m.Fail(err, "device -> host copy");
  err = cudaStreamSynchronize(m.stream);
  if (err != cudaSuccess) return m.Fail(err, "cudaStreamSynchronize");
  std::memcpy(out, m.h_scores, score_bytes);
  DiscardQueued();
  return GpuStatus::Ok();
}

}  // namespace kvtier::gpu
