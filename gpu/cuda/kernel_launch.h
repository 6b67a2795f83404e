// Raw launchers of the device-tier kernels: enqueue on `stream` (which must
// belong to the current device) and return the error of this launch only
// (cudaLaunchKernelEx; an unrelated earlier failure of the thread is not
// reported, see launch.cuh). Callers check shapes first with the
// Check*Params functions of kernels.h; these do not. Most callers want the
// checked wrappers in kernels.h instead.
//
// C++17 and CUDA runtime only, so the .cu files can include it.
#ifndef KVTIER_GPU_CUDA_KERNEL_LAUNCH_H_
#define KVTIER_GPU_CUDA_KERNEL_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "gpu/cuda/kernel_shapes.h"

namespace kvtier::gpu {

// Grid: one CTA per block; CTA of G x D threads (G = 512 / D row groups,
// clamped to 1..8), each thread owns one dim.
cudaError_t LaunchPoolKeys(const PoolKeysParams& params, cudaStream_t stream);

// B <= 8: one warp per row with the anchors in shared memory. B > 8: 64
// rows x 32 anchors per CTA, each thread a 4 x 4 tile, D in chunks of 32.
cudaError_t LaunchScoreLevels(const ScoreParams& params, cudaStream_t stream);

// One kernel: grid (C, B) with C = TopKCtasPerAnchor(N) CTAs of 512
// threads per anchor, a thread-block cluster on sm_90 (topk.cu).
cudaError_t LaunchTopK(const TopKParams& params, cudaStream_t stream);

// CTAs (one cluster) TopK gives each anchor on `device`: ceil(N / 4096),
// at most 16 (or the largest cluster the device can hold), and for a batch
// of num_anchors > 1 at most 2 x SMs / num_anchors so the grid stays one
// wave; at least 1; 1 on chips without clusters.
int TopKCtasPerAnchor(int64_t num_rows, int device, int64_t num_anchors = 1);

// One warp per row, grid-stride over all segments' rows.
cudaError_t LaunchScoreSegments(const SegmentScoreParams& params, cudaStream_t stream);

}  // namespace kvtier::gpu

#endif  // KVTIER_GPU_CUDA_KERNEL_LAUNCH_H_
