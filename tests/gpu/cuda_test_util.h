// Helpers for the CUDA tests and benchmark: skip without a device, and an
// owning device buffer. CUDA builds only.
//
// Thread safety: DeviceBuffer is not synchronised; DeviceAvailable is
// thread-safe.
#ifndef KVTIER_TESTS_GPU_CUDA_TEST_UTIL_H_
#define KVTIER_TESTS_GPU_CUDA_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier::gpu::testing {

// True when a CUDA device is usable; otherwise *why says why not.
inline bool DeviceAvailable(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    *why = std::string("no usable CUDA device: ") + cudaGetErrorString(err);
    return false;
  }
  if (count == 0) {
    *why = "no CUDA device present";
    return false;
  }
  return true;
}

// Use at the top of a test (or SetUp) that needs a device.
#define KVTIER_SKIP_WITHOUT_DEVICE()                             \
  do {                                                           \
    std::string kvtier_why;                                      \
    if (!::kvtier::gpu::testing::DeviceAvailable(&kvtier_why)) { \
      GTEST_SKIP() << kvtier_why;                                \
    }                                                            \
  } while (0)

#define KVTIER_ASSERT_CUDA(expr)                                                           \
  do {                                                                                     \
    const cudaError_t kvtier_err = (expr);                                                 \
    ASSERT_EQ(kvtier_err, cudaSuccess) << #expr << ": " << cudaGetErrorString(kvtier_err); \
  } while (0)

// cudaMalloc'd bytes, freed on destruction. size 0 holds nothing.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t size_bytes) : size_bytes_(size_bytes) {
    if (size_bytes > 0 && cudaMalloc(&data_, size_bytes) != cudaSuccess) {
      data_ = nullptr;
      size_bytes_ = 0;
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_bytes_(std::exchange(other.size_bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_bytes_, other.size_bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }

  bool ok() const { return data_ != nullptr || size_bytes_ == 0; }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(data_);
  }
  size_t size_bytes() const { return size_bytes_; }

  // Synchronous host <-> device copies of the first n bytes.
  cudaError_t Upload(const void* host, size_t n) {
    return cudaMemcpy(data_, host, n, cudaMemcpyHostToDevice);
  }
  template <typename T>
  cudaError_t Download(std::vector<T>* out, size_t count) const {
    out->resize(count);
    return cudaMemcpy(out->data(), data_, count * sizeof(T), cudaMemcpyDeviceToHost);
  }

 private:
  void* data_ = nullptr;
  size_t size_bytes_ = 0;
};

}  // namespace kvtier::gpu::testing

#endif  // KVTIER_TESTS_GPU_CUDA_TEST_UTIL_H_
