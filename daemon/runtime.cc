#include "daemon/runtime.h"

#include "absl/strings/str_cat.h"

namespace kvtier::daemon {

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create(const Config& config) {
  gpu::DeviceProbe probe = gpu::ProbeDevices();
  // The device tier runs on the shared-memory arena until the CUDA arena
  // exists; "auto" picks it, "cuda" is refused rather than pretended.
  if (config.device.backend == "cuda") {
    return absl::FailedPreconditionError(absl::StrCat(
        "key 'tiers.device.backend' is \"cuda\" but this build has no CUDA arena (device: ",
        probe.description, "); use \"auto\" or \"shm\""));
  }
  std::string backend = "shm-arena";
  return std::unique_ptr<Runtime>(new Runtime(config, std::move(probe), std::move(backend)));
}

Runtime::Runtime(const Config& config, gpu::DeviceProbe probe, std::string backend)
    : config_(config),
      probe_(std::move(probe)),
      device_backend_(std::move(backend)),
      started_(std::chrono::steady_clock::now()) {}

uint64_t Runtime::uptime_s() const {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::steady_clock::now() - started_)
                                   .count());
}

}  // namespace kvtier::daemon
