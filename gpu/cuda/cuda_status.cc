#include "gpu/cuda/cuda_status.h"

namespace kvtier::gpu {

bool IsNoDeviceError(cudaError_t err) {
  switch (err) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorStubLibrary:
      return true;
    default:
      return false;
  }
}

GpuStatus CudaErrorToGpuStatus(cudaError_t err, const std::string& context) {
  if (err == cudaSuccess) return GpuStatus::Ok();
  GpuStatus::Code code = GpuStatus::kInternal;
  switch (err) {
    case cudaErrorMemoryAllocation:
      code = GpuStatus::kOutOfMemory;
      break;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorHostMemoryAlreadyRegistered:
    case cudaErrorHostMemoryNotRegistered:
    case cudaErrorInvalidConfiguration:
      code = GpuStatus::kInvalidArgument;
      break;
    case cudaErrorNotReady:
      code = GpuStatus::kUnavailable;
      break;
    default:
      code = IsNoDeviceError(err) ? GpuStatus::kUnavailable : GpuStatus::kInternal;
      break;
  }
  return GpuStatus::Error(code,
                          context + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

}  // namespace kvtier::gpu
