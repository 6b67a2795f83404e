// Raw launcher of the device-tier kernel: enqueue on `stream` (which must
// belong to the current device) and return the error of this launch only
// (cudaLaunchKernelEx; an unrelated earlier failure of the thread is not
// reported, see launch.cuh). Callers check shapes first with
// CheckSegmentScoreParams (kernels.h); this does not. Most callers want the
// checked wrapper ScoreSegments in kernels.h instead.
//
// C++17 and CUDA runtime only, so the .cu files can include it.
#ifndef KVTIER_GPU_CUDA_KERNEL_LAUNCH_H_
#define KVTIER_GPU_CUDA_KERNEL_LAUNCH_H_

#include <cuda_runtime_api.h>

#include "gpu/cuda/kernel_shapes.h"

namespace kvtier::gpu {

// One warp per row, grid-stride over all segments' rows; one full wave of
// CTAs on the current device.
cudaError_t LaunchScoreSegments(const SegmentScoreParams& params, cudaStream_t stream);

}  // namespace kvtier::gpu

#endif  // KVTIER_GPU_CUDA_KERNEL_LAUNCH_H_
