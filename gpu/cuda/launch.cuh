// Kernel launches that report their own error: cudaLaunchKernelEx returns
// the status of this launch, where `kernel<<<...>>>` followed by
// cudaGetLastError() would also return an unrelated earlier failure of the
// same thread (a host range already registered, a bad cudaSetDevice), so a
// good launch could report failure. Errors of earlier asynchronous work
// that broke the context are still reported: they are sticky.
//
// For .cu files only (needs the CUDA C++ runtime API). Thread-safe.
#ifndef KVTIER_GPU_CUDA_LAUNCH_CUH_
#define KVTIER_GPU_CUDA_LAUNCH_CUH_

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

namespace kvtier::gpu {

template <typename... Params, typename... Args>
cudaError_t LaunchKernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                         cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace kvtier::gpu

#endif  // KVTIER_GPU_CUDA_LAUNCH_CUH_
