#include "gpu/cuda/device_ops_factory.h"

#include "gpu/device_probe.h"

namespace kvtier::gpu {

GpuStatus ValidateCudaDeviceOpsOptions(const CudaDeviceOpsOptions& options) {
  if (options.arena_bytes == 0 || options.arena_bytes > kMaxCudaArenaBytes) {
    return GpuStatus::Error(
        GpuStatus::kInvalidArgument,
        "arena_bytes must be in 1..kMaxCudaArenaBytes, got " + std::to_string(options.arena_bytes));
  }
  if (options.max_inflight_batches == 0 || options.max_inflight_batches > 1'000'000) {
    return GpuStatus::Error(GpuStatus::kInvalidArgument,
                            "max_inflight_batches must be in 1..1000000, got " +
                                std::to_string(options.max_inflight_batches));
  }
  if (options.device_ordinal < 0) {
    return GpuStatus::Error(
        GpuStatus::kInvalidArgument,
        "device_ordinal must be >= 0, got " + std::to_string(options.device_ordinal));
  }
  return GpuStatus::Ok();
}

GpuStatus NewCudaDeviceOps(const CudaDeviceOpsOptions& options, std::unique_ptr<DeviceOps>* out) {
  std::unique_ptr<CudaDeviceOps> ops;
  GpuStatus status = CudaDeviceOps::Create(options, &ops);
  if (status.ok()) *out = std::move(ops);
  return status;
}

GpuStatus NewCudaDeviceOpsPerDevice(std::span<const int> ordinals,
                                    const CudaDeviceOpsOptions& options,
                                    std::vector<std::unique_ptr<DeviceOps>>* out) {
  std::vector<std::unique_ptr<DeviceOps>> created;
  for (int ordinal : ordinals) {
    CudaDeviceOpsOptions one = options;
    one.device_ordinal = ordinal;
    one.arena_id = 0;  // every arena gets its own id
    std::unique_ptr<DeviceOps> ops;
    GpuStatus status = NewCudaDeviceOps(one, &ops);
    if (!status.ok()) {
      return GpuStatus::Error(status.code,
                              "device " + std::to_string(ordinal) + ": " + status.message);
    }
    created.push_back(std::move(ops));
  }
  for (auto& ops : created) out->push_back(std::move(ops));
  return GpuStatus::Ok();
}

GpuStatus NewDeviceOps(const DeviceTierOptions& options, std::unique_ptr<DeviceOps>* out,
                       std::string* why) {
  bool use_cuda = options.backend == DeviceBackend::kCuda;
  std::string reason;
  if (options.backend == DeviceBackend::kAuto) {
    const DeviceProbe probe = ProbeDevices();
    use_cuda = probe.device_count > 0;
    reason = use_cuda ? "auto: " + probe.description
                      : "auto: no CUDA device (" + probe.description + ")";
  } else {
    reason = use_cuda ? "configured: cuda" : "configured: shm";
  }
  GpuStatus status;
  if (use_cuda) {
    CudaDeviceOpsOptions cuda = options.cuda;
    cuda.arena_bytes = options.arena_bytes;
    cuda.arena_id = options.arena_id;
    status = NewCudaDeviceOps(cuda, out);
  } else {
    ShmDeviceOpsOptions shm = options.shm;
    shm.arena_id = options.arena_id;
    status = NewShmDeviceOps(options.shm_path, options.arena_bytes, shm, out);
  }
  if (why != nullptr) *why = reason;
  return status;
}

}  // namespace kvtier::gpu
