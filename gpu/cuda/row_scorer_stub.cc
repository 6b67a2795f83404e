// CudaRowScorer in builds without CUDA: Create always fails with
// kUnavailable, so no scorer or table of this build ever exists.
#include "gpu/cuda/not_compiled.h"
#include "gpu/cuda/row_scorer.h"

namespace kvtier::gpu {

struct CudaRowScorer::Impl {};

CudaRowTable::~CudaRowTable() = default;
GpuStatus CudaRowScorer::Create(int, std::unique_ptr<CudaRowScorer>*) { return NotCompiled(); }
CudaRowScorer::CudaRowScorer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaRowScorer::~CudaRowScorer() = default;
int CudaRowScorer::device() const { return -1; }
bool CudaRowScorer::UsesBatchedCopies() const { return false; }
GpuStatus CudaRowScorer::NewTable(int32_t, int64_t, std::unique_ptr<CudaRowTable>*) {
  return NotCompiled();
}
GpuStatus CudaRowScorer::QueueWrite(CudaRowTable*, int64_t, const uint16_t*, int64_t) {
  return NotCompiled();
}
GpuStatus CudaRowScorer::Score(const float*, int32_t, int32_t, std::span<const CudaRowSegment>,
                               float*) {
  return NotCompiled();
}
void CudaRowScorer::DiscardQueued() {}

}  // namespace kvtier::gpu
