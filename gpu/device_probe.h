// Detects whether a CUDA device can back the device tier.
//
// Thread-safe. Never fails: without CUDA support compiled in, without a
// driver, or without a device it reports device_count == 0 and says why.
#ifndef KVTIER_GPU_DEVICE_PROBE_H_
#define KVTIER_GPU_DEVICE_PROBE_H_

#include <string>

namespace kvtier::gpu {

struct DeviceProbe {
  bool cuda_compiled = false;  // built with KVTIER_WITH_CUDA
  int device_count = 0;        // usable CUDA devices
  std::string description;     // e.g. "cuda:0 NVIDIA H200" or the reason none
};

DeviceProbe ProbeDevices();

}  // namespace kvtier::gpu

#endif  // KVTIER_GPU_DEVICE_PROBE_H_
