#include "daemon/grpc_status.h"

#include <string>

namespace kvtier::daemon {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

void ToItemStatus(const absl::Status& status, v1::ItemStatus* out) {
  out->set_code(static_cast<int32_t>(status.code()));
  out->set_message(std::string(status.message()));
}

}  // namespace kvtier::daemon
