// The status of every CUDA entry point in builds without CUDA (the
// *_stub.cc files). Header-only.
#ifndef KVTIER_GPU_CUDA_NOT_COMPILED_H_
#define KVTIER_GPU_CUDA_NOT_COMPILED_H_

#include "gpu/device_ops.h"

namespace kvtier::gpu {

inline GpuStatus NotCompiled() {
  return GpuStatus::Error(GpuStatus::kUnavailable,
                          "built without CUDA (KVTIER_WITH_CUDA=OFF or nvcc not found)");
}

}  // namespace kvtier::gpu

#endif  // KVTIER_GPU_CUDA_NOT_COMPILED_H_
