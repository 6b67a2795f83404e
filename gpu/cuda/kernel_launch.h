// Raw launchers of the device-tier kernels: enqueue on `stream`, return the
// launch error (cudaGetLastError). Callers check shapes first with the
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

// Device workspace TopK needs for num_anchors anchors (8 KiB + 32 B each);
// 0 for num_anchors <= 0.
size_t TopKWorkspaceBytes(int32_t num_anchors);

// One memset of the workspace, three histogram passes and one gather, each
// over all anchors at once.
cudaError_t LaunchTopK(const TopKParams& params, cudaStream_t stream);

}  // namespace kvtier::gpu

#endif  // KVTIER_GPU_CUDA_KERNEL_LAUNCH_H_
