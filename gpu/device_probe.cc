#include "gpu/device_probe.h"

#ifdef KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvtier::gpu {

DeviceProbe ProbeDevices() {
  DeviceProbe probe;
#ifdef KVTIER_HAVE_CUDA
  probe.cuda_compiled = true;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    probe.description = std::string("no usable CUDA device: ") + cudaGetErrorString(err);
    return probe;
  }
  probe.device_count = count;
  if (count == 0) {
    probe.description = "no CUDA device present";
    return probe;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    probe.description = std::string("cuda:0 ") + prop.name;
  } else {
    probe.description = "cuda:0";
  }
#else
  probe.description = "built without CUDA (KVTIER_WITH_CUDA=OFF or nvcc not found)";
#endif
  return probe;
}

}  // namespace kvtier::gpu
