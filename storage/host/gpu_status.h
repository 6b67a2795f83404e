// The one place where gpu::GpuStatus becomes absl::Status.
#ifndef KVTIER_STORAGE_HOST_GPU_STATUS_H_
#define KVTIER_STORAGE_HOST_GPU_STATUS_H_

#include "absl/status/status.h"
#include "gpu/device_ops.h"

namespace kvtier {

// kOk -> OK, kInvalidArgument -> INVALID_ARGUMENT, kOutOfMemory ->
// RESOURCE_EXHAUSTED, kUnavailable -> UNAVAILABLE, kDeadlineExceeded ->
// DEADLINE_EXCEEDED, kInternal -> INTERNAL. The message is kept.
absl::Status GpuToStatus(const gpu::GpuStatus& status);

}  // namespace kvtier

#endif  // KVTIER_STORAGE_HOST_GPU_STATUS_H_
