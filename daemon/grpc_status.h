// The one place where absl::Status becomes grpc::Status (and back, for
// per-item statuses carried inside messages).
#ifndef KVTIER_DAEMON_GRPC_STATUS_H_
#define KVTIER_DAEMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "kvtier/v1/types.pb.h"

namespace kvtier::daemon {

// Same code (the canonical codes are numerically identical), same message.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Fills a per-item status of a batched response.
void ToItemStatus(const absl::Status& status, v1::ItemStatus* out);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_GRPC_STATUS_H_
