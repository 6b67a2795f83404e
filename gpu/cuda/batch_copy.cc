#include "gpu/cuda/batch_copy.h"

namespace kvtier::gpu {
namespace {

cudaError_t EnqueueEach(const std::vector<PlannedCopy>& copies, CopyDirection direction,
                        cudaStream_t stream) {
  const cudaMemcpyKind kind =
      direction == CopyDirection::kToArena ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  for (const PlannedCopy& c : copies) {
    const cudaError_t err =
        cudaMemcpyAsync(c.dst, c.src, static_cast<size_t>(c.size_bytes), kind, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

#if CUDART_VERSION >= 13000
cudaError_t EnqueueBatched(const std::vector<PlannedCopy>& copies, CopyDirection direction,
                           int device, cudaStream_t stream) {
  std::vector<void*> dsts(copies.size());
  std::vector<const void*> srcs(copies.size());
  std::vector<size_t> sizes(copies.size());
  for (size_t i = 0; i < copies.size(); ++i) {
    dsts[i] = copies[i].dst;
    srcs[i] = copies[i].src;
    sizes[i] = static_cast<size_t>(copies[i].size_bytes);
  }
  const cudaMemLocation host{cudaMemLocationTypeHost, 0};
  const cudaMemLocation gpu{cudaMemLocationTypeDevice, device};
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.srcLocHint = direction == CopyDirection::kToArena ? host : gpu;
  attr.dstLocHint = direction == CopyDirection::kToArena ? gpu : host;
  attr.flags = 0;
  size_t first_copy = 0;  // the one attribute applies from copy 0 on
  return cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), copies.size(), &attr,
                              &first_copy, 1, stream);
}
#endif

}  // namespace

bool BatchCopyCompiled() { return CUDART_VERSION >= 13000; }

cudaError_t EnqueueCopies(const std::vector<PlannedCopy>& copies, CopyDirection direction,
                          int device, cudaStream_t stream, std::atomic<bool>* use_batch) {
#if CUDART_VERSION >= 13000
  if (copies.size() > 1 && use_batch->load(std::memory_order_relaxed)) {
    if (EnqueueBatched(copies, direction, device, stream) == cudaSuccess) return cudaSuccess;
    const cudaError_t err = EnqueueEach(copies, direction, stream);
    if (err == cudaSuccess) use_batch->store(false, std::memory_order_relaxed);
    return err;
  }
#endif
  return EnqueueEach(copies, direction, stream);
}

}  // namespace kvtier::gpu
