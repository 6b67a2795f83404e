// Runtime: what the services share for the lifetime of the daemon: the
// effective configuration, the start time and the device probe. Later
// capabilities (block store, index) hang off it.
//
// Thread safety: constant after construction; safe for concurrent reads.
#ifndef KVTIER_DAEMON_RUNTIME_H_
#define KVTIER_DAEMON_RUNTIME_H_

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/config.h"
#include "gpu/device_probe.h"

namespace kvtier::daemon {

class Runtime {
 public:
  // Probes the device and checks that the configured device backend can be
  // honoured (tiers.device.backend = "cuda" without a device is
  // FAILED_PRECONDITION naming the key).
  static absl::StatusOr<std::unique_ptr<Runtime>> Create(const Config& config);

  const Config& config() const { return config_; }
  const gpu::DeviceProbe& device_probe() const { return probe_; }
  // "cuda:0 <name>" or "shm-arena".
  const std::string& device_backend() const { return device_backend_; }
  uint64_t uptime_s() const;

 private:
  Runtime(const Config& config, gpu::DeviceProbe probe, std::string backend);

  const Config config_;
  const gpu::DeviceProbe probe_;
  const std::string device_backend_;
  const std::chrono::steady_clock::time_point started_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_RUNTIME_H_
