// Queues a list of copies of one direction on a stream, in stream order:
// one cudaMemcpyBatchAsync for the list where the runtime has it (CUDA 13)
// and *use_batch is set, else one cudaMemcpyAsync per copy. When the batch
// call is refused (older drivers), the copies are queued one by one and,
// if that works, *use_batch is cleared so later lists skip the batch call.
// A copy the refused call may already have queued runs twice: same bytes,
// same place, so the result is the same.
//
// CUDA builds only; the device of `stream` must be current. Thread-safe
// (*use_batch is atomic).
#ifndef KVTIER_GPU_CUDA_BATCH_COPY_H_
#define KVTIER_GPU_CUDA_BATCH_COPY_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <vector>

#include "gpu/device_ops.h"
#include "gpu/host_regions.h"

namespace kvtier::gpu {

// True when this build can call cudaMemcpyBatchAsync.
bool BatchCopyCompiled();

cudaError_t EnqueueCopies(const std::vector<PlannedCopy>& copies, CopyDirection direction,
                          int device, cudaStream_t stream, std::atomic<bool>* use_batch);

}  // namespace kvtier::gpu

#endif  // KVTIER_GPU_CUDA_BATCH_COPY_H_
