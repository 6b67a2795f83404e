// Device-tier kernels for blocks already in HBM: key pooling (block
// summaries), batched scoring of stacked level vectors against anchors,
// segmented scoring (many row tables, one anchor each: the Selector's
// levels of a whole batch of contexts) and top-K per anchor. Shapes and
// semantics are in kernel_shapes.h.
//
// Two layers, as in FlashInfer:
//   Check*Params   validate shapes and limits on the host (no device
//                  needed); kInvalidArgument naming the field.
//   Launch*        (kernel_launch.h) enqueue the kernels on `stream` and
//                  return the error of that launch (not an earlier one of
//                  the thread). They assume the params passed Check*.
//   PoolKeys, ScoreLevels, TopK   Check* + Launch*, errors as GpuStatus.
//
// All work is asynchronous on `stream`: outputs are ready when the stream
// reaches that point. Device pointers are not checked beyond non-null; the
// pooling kernel checks every block offset against arena_bytes and flags
// (never reads) blocks outside the arena.
//
// Thread safety: the functions hold no state beyond a per-device probe of
// cluster support (taken once, under a lock). Concurrent launches must not
// share outputs.
#ifndef KVTIER_GPU_CUDA_KERNELS_H_
#define KVTIER_GPU_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "gpu/cuda/kernel_launch.h"
#include "gpu/cuda/kernel_shapes.h"
#include "gpu/device_ops.h"

namespace kvtier::gpu {

// ---- (a) pooling --------------------------------------------------------
GpuStatus CheckPoolKeysParams(const PoolKeysParams& params);
GpuStatus PoolKeys(const PoolKeysParams& params, cudaStream_t stream);

// ---- (b) scoring --------------------------------------------------------
GpuStatus CheckScoreParams(const ScoreParams& params);
GpuStatus ScoreLevels(const ScoreParams& params, cudaStream_t stream);

// ---- (c) segmented scoring ----------------------------------------------
GpuStatus CheckSegmentScoreParams(const SegmentScoreParams& params);
GpuStatus ScoreSegments(const SegmentScoreParams& params, cudaStream_t stream);

// ---- top-K --------------------------------------------------------------
GpuStatus CheckTopKParams(const TopKParams& params);
GpuStatus TopK(const TopKParams& params, cudaStream_t stream);

}  // namespace kvtier::gpu

#endif  // KVTIER_GPU_CUDA_KERNELS_H_
