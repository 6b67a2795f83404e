// The device-tier kernel: segmented scoring (many fp16 row tables, one
// anchor each: the Selector's levels of a whole batch of contexts), used by
// CudaRowScorer (row_scorer.h). Shapes and semantics are in
// kernel_shapes.h.
//
// Two layers, as in FlashInfer:
//   CheckSegmentScoreParams  validates shapes and limits on the host (no
//                            device needed); kInvalidArgument naming the
//                            field.
//   LaunchScoreSegments      (kernel_launch.h) enqueues the kernel on
//                            `stream` and returns the error of that launch
//                            (not an earlier one of the thread). It assumes
//                            the params passed the check.
//   ScoreSegments            the check, then the launch, errors as GpuStatus.
//
// All work is asynchronous on `stream`: outputs are ready when the stream
// reaches that point. Device pointers are not checked beyond non-null.
//
// Thread safety: the functions hold no state beyond a per-device cache of
// the launch's wave size (filled once, under a lock). Concurrent launches
// must not share outputs.
#ifndef KVTIER_GPU_CUDA_KERNELS_H_
#define KVTIER_GPU_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include "gpu/cuda/kernel_launch.h"
#include "gpu/cuda/kernel_shapes.h"
#include "gpu/device_ops.h"

namespace kvtier::gpu {

GpuStatus CheckSegmentScoreParams(const SegmentScoreParams& params);
GpuStatus ScoreSegments(const SegmentScoreParams& params, cudaStream_t stream);

}  // namespace kvtier::gpu

#endif  // KVTIER_GPU_CUDA_KERNELS_H_
