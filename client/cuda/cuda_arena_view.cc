#include "client/cuda/cuda_arena_view.h"

#include <cuda_runtime_api.h>

#include <cstring>

namespace kvtier::client {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == 64, "CudaArenaDescriptor documents 64 bytes");

std::string CudaMessage(const char* call, cudaError_t err) {
  return std::string(call) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Makes `device` current for one scope and restores the previous device.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) status_ = cudaSetDevice(device);
  }
  ~ScopedDevice() {
    if (previous_ >= 0 && status_ == cudaSuccess) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

}  // namespace

bool ParseDeviceUuid(const std::string& text, DeviceUuid* out) {
  if (text.size() == out->size()) {
    std::memcpy(out->data(), text.data(), out->size());
    return true;
  }
  std::string hex = text;
  if (hex.rfind("GPU-", 0) == 0) hex = hex.substr(4);
  std::string digits;
  for (char c : hex) {
    if (c == '-') continue;
    if (HexValue(c) < 0) return false;
    digits.push_back(c);
  }
  if (digits.size() != 2 * out->size()) return false;
  for (size_t i = 0; i < out->size(); ++i) {
    (*out)[i] = static_cast<uint8_t>(HexValue(digits[2 * i]) * 16 + HexValue(digits[2 * i + 1]));
  }
  return true;
}

std::string FormatDeviceUuid(const DeviceUuid& uuid) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (size_t i = 0; i < uuid.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    out.push_back(kHex[uuid[i] >> 4]);
    out.push_back(kHex[uuid[i] & 0xf]);
  }
  return out;
}

std::unique_ptr<CudaArenaView> CudaArenaView::Open(const CudaArenaDescriptor& descriptor,
                                                   std::string* error) {
  if (descriptor.arena_id == 0) {
    *error = "arena_id is 0";
    return nullptr;
  }
  if (descriptor.size_bytes == 0) {
    *error = "size_bytes is 0";
    return nullptr;
  }
  if (descriptor.ipc_handle.size() != sizeof(cudaIpcMemHandle_t)) {
    *error = "ipc_handle has " + std::to_string(descriptor.ipc_handle.size()) +
             " bytes, expected " + std::to_string(sizeof(cudaIpcMemHandle_t));
    return nullptr;
  }
  DeviceUuid wanted;
  if (!ParseDeviceUuid(descriptor.device_uuid, &wanted)) {
    *error = "device_uuid is neither 16 bytes nor 32 hex digits";
    return nullptr;
  }
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    *error = CudaMessage("cudaGetDeviceCount", err);
    return nullptr;
  }
  int device = -1;
  for (int i = 0; i < count && device < 0; ++i) {
    cudaDeviceProp prop{};
    err = cudaGetDeviceProperties(&prop, i);
    if (err != cudaSuccess) {
      *error = CudaMessage("cudaGetDeviceProperties", err);
      return nullptr;
    }
    if (std::memcmp(prop.uuid.bytes, wanted.data(), wanted.size()) == 0) device = i;
  }
  if (device < 0) {
    *error = "no visible CUDA device has UUID " + FormatDeviceUuid(wanted) + " (" +
             std::to_string(count) + " visible; check CUDA_VISIBLE_DEVICES)";
    return nullptr;
  }
  ScopedDevice scoped(device);
  if (scoped.status() != cudaSuccess) {
    *error = CudaMessage("cudaSetDevice", scoped.status());
    return nullptr;
  }
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, descriptor.ipc_handle.data(), sizeof(handle));
  void* base = nullptr;
  err = cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    *error = CudaMessage("cudaIpcOpenMemHandle", err);
    return nullptr;
  }
  return std::unique_ptr<CudaArenaView>(
      new CudaArenaView(descriptor.arena_id, descriptor.size_bytes, device, base));
}

CudaArenaView::~CudaArenaView() {
  ScopedDevice scoped(device_ordinal_);
  cudaIpcCloseMemHandle(base_);
}

DeviceRange CudaArenaView::Block(uint64_t arena_id, uint64_t offset, uint64_t size_bytes,
                                 std::string* error) const {
  if (arena_id != arena_id_) {
    *error = "stale arena: handle names arena " + std::to_string(arena_id) + ", open arena is " +
             std::to_string(arena_id_) + "; reopen the arena";
    return {};
  }
  if (size_bytes == 0 || offset > size_bytes_ || size_bytes > size_bytes_ - offset) {
    *error = "block [" + std::to_string(offset) + ", +" + std::to_string(size_bytes) +
             ") is empty or outside the arena of " + std::to_string(size_bytes_) + " bytes";
    return {};
  }
  return DeviceRange{static_cast<std::byte*>(base_) + offset, size_bytes};
}

}  // namespace kvtier::client
