#include "storage/host/gpu_status.h"

namespace kvtier {

absl::Status GpuToStatus(const gpu::GpuStatus& status) {
  absl::StatusCode code = absl::StatusCode::kInternal;
  switch (status.code) {
    case gpu::GpuStatus::kOk:
      return absl::OkStatus();
    case gpu::GpuStatus::kInvalidArgument:
      code = absl::StatusCode::kInvalidArgument;
      break;
    case gpu::GpuStatus::kOutOfMemory:
      code = absl::StatusCode::kResourceExhausted;
      break;
    case gpu::GpuStatus::kUnavailable:
      code = absl::StatusCode::kUnavailable;
      break;
    case gpu::GpuStatus::kDeadlineExceeded:
      code = absl::StatusCode::kDeadlineExceeded;
      break;
    case gpu::GpuStatus::kInternal:
      code = absl::StatusCode::kInternal;
      break;
  }
  return absl::Status(code, status.message);
}

}  // namespace kvtier
