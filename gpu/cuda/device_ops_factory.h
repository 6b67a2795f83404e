// Picks and creates the device tier's DeviceOps: the CUDA arena when a GPU
// is there (or demanded), the shared-memory arena otherwise. The daemon
// calls NewDeviceOps once at start.
//
// Thread-safe (no shared state).
#ifndef KVTIER_GPU_CUDA_DEVICE_OPS_FACTORY_H_
#define KVTIER_GPU_CUDA_DEVICE_OPS_FACTORY_H_

#include <memory>
#include <string>

#include "gpu/cpu/shm_device_ops.h"
#include "gpu/cuda/cuda_device_ops.h"
#include "gpu/device_ops.h"

namespace kvtier::gpu {

enum class DeviceBackend {
  kAuto,  // CUDA when ProbeDevices() sees a device, else shm
  kCuda,  // CUDA or fail (kUnavailable without a device or CUDA build)
  kShm,   // shared-memory arena
};

struct DeviceTierOptions {
  DeviceBackend backend = DeviceBackend::kAuto;
  uint64_t arena_bytes = 0;   // both backends
  uint64_t arena_id = 0;      // 0: random
  std::string shm_path;       // shm backend: the arena file
  ShmDeviceOpsOptions shm;    // arena_id is taken from above
  CudaDeviceOpsOptions cuda;  // arena_bytes and arena_id are taken from above
};

// Creates the backend chosen by options.backend. In kAuto mode a CUDA
// failure on a machine that has a device is returned, not hidden behind a
// fallback. *out is set only on success; *why (optional) says which backend
// was picked and why, for the start-up log.
GpuStatus NewDeviceOps(const DeviceTierOptions& options, std::unique_ptr<DeviceOps>* out,
                       std::string* why);

}  // namespace kvtier::gpu

#endif  // KVTIER_GPU_CUDA_DEVICE_OPS_FACTORY_H_
