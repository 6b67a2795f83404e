// CudaDeviceOps in builds without CUDA: Create always fails with
// kUnavailable, so no object of the class ever exists.
#include "gpu/cuda/cuda_device_ops.h"
#include "gpu/cuda/not_compiled.h"

namespace kvtier::gpu {

struct CudaDeviceOps::Impl {
  ArenaInfo info;
};

bool CudaDeviceOpsCompiled() { return false; }

GpuStatus CudaDeviceOps::Create(const CudaDeviceOpsOptions& options,
                                std::unique_ptr<CudaDeviceOps>* out) {
  GpuStatus valid = ValidateCudaDeviceOpsOptions(options);
  if (!valid.ok()) return valid;
  return NotCompiled();
}

CudaDeviceOps::CudaDeviceOps(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaDeviceOps::~CudaDeviceOps() = default;
const ArenaInfo& CudaDeviceOps::arena() const { return impl_->info; }
void* CudaDeviceOps::arena_base() const { return nullptr; }
GpuStatus CudaDeviceOps::SubmitToArena(std::span<const HostToArenaCopy>, Fence*) {
  return NotCompiled();
}
GpuStatus CudaDeviceOps::SubmitToHost(std::span<const ArenaToHostCopy>, Fence*) {
  return NotCompiled();
}
bool CudaDeviceOps::IsComplete(Fence fence) { return fence.value == 0; }
GpuStatus CudaDeviceOps::Wait(Fence, std::chrono::nanoseconds) { return NotCompiled(); }
GpuStatus CudaDeviceOps::AllocHost(uint64_t, HostBuffer*) { return NotCompiled(); }
GpuStatus CudaDeviceOps::FreeHost(const HostBuffer&) { return NotCompiled(); }
GpuStatus CudaDeviceOps::RegisterHost(void*, uint64_t) { return NotCompiled(); }
GpuStatus CudaDeviceOps::UnregisterHost(void*) { return NotCompiled(); }
GpuStatus CudaDeviceOps::OrderStreamAfter(Fence, CUstream_st*) { return NotCompiled(); }
GpuStatus CudaDeviceOps::OrderCopiesAfter(CUstream_st*) { return NotCompiled(); }
bool CudaDeviceOps::UsesBatchedCopies() const { return false; }
void CudaDeviceOps::PauseCopiesForTesting(bool) {}
void CudaDeviceOps::PauseDirectionForTesting(CopyDirection, bool) {}

}  // namespace kvtier::gpu
