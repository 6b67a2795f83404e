// ScopedDevice: makes one CUDA device current for a scope and restores the
// caller's device afterwards. Every entry point of the CUDA code in gpu/
// that talks to the runtime opens one, so calls from threads whose current
// device is another one (or none yet) act on the right device.
//
// CUDA builds only. Thread-compatible (the current device is per thread).
#ifndef KVTIER_GPU_CUDA_SCOPED_DEVICE_H_
#define KVTIER_GPU_CUDA_SCOPED_DEVICE_H_

#include <cuda_runtime_api.h>

namespace kvtier::gpu {

class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) {
      status_ = cudaSetDevice(device);
      changed_ = status_ == cudaSuccess;
    }
  }
  ~ScopedDevice() {
    if (changed_ && previous_ >= 0) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  // cudaSuccess, or why the device could not be made current.
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  bool changed_ = false;
  cudaError_t status_ = cudaSuccess;
};

}  // namespace kvtier::gpu

#endif  // KVTIER_GPU_CUDA_SCOPED_DEVICE_H_
