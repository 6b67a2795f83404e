// The one conversion from cudaError_t to GpuStatus in gpu/.
//
// Only built with CUDA (KVTIER_HAVE_CUDA). Thread-safe and pure.
#ifndef KVTIER_GPU_CUDA_CUDA_STATUS_H_
#define KVTIER_GPU_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include <string>

#include "gpu/device_ops.h"

namespace kvtier::gpu {

// cudaSuccess -> OK. Otherwise the code is
//   kOutOfMemory      cudaErrorMemoryAllocation
//   kInvalidArgument  cudaErrorInvalidValue, InvalidDevicePointer,
//                     InvalidDevice, InvalidResourceHandle,
//                     HostMemoryAlreadyRegistered, HostMemoryNotRegistered,
//                     InvalidConfiguration
//   kUnavailable      no usable device or driver: NoDevice,
//                     InsufficientDriver, DevicesUnavailable,
//                     CallRequiresNewerDriver, SystemDriverMismatch,
//                     StubLibrary, NotReady
//   kInternal         everything else (launch failures, illegal addresses,
//                     ECC errors, ... which are sticky for the context)
// and the message is "<context>: <cudaGetErrorName>: <cudaGetErrorString>".
GpuStatus CudaErrorToGpuStatus(cudaError_t err, const std::string& context);

// True for errors that mean "no usable CUDA device here" (the kUnavailable
// set above without NotReady); tests skip on them.
bool IsNoDeviceError(cudaError_t err);

}  // namespace kvtier::gpu

#endif  // KVTIER_GPU_CUDA_CUDA_STATUS_H_
