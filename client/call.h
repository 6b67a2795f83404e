// Internal to the client library: the one way a unary call is made
// (deadline from ClientOptions, grpc::Status -> absl::Status).
#ifndef KVTIER_CLIENT_CALL_H_
#define KVTIER_CLIENT_CALL_H_

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "absl/status/statusor.h"
#include "client/client.h"

namespace kvtier::internal {

inline void SetDeadline(grpc::ClientContext* ctx, std::chrono::milliseconds timeout) {
  ctx->set_deadline(std::chrono::system_clock::now() + timeout);
}

// Calls method(ctx, request, &response) with a deadline of `timeout`.
template <class Response, class Request, class Method>
absl::StatusOr<Response> Unary(std::chrono::milliseconds timeout, Method method,
                               const Request& request) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  Response response;
  grpc::Status st = method(&ctx, request, &response);
  if (!st.ok()) return FromGrpcStatus(st);
  return response;
}

// How much longer than call_timeout calls over whole contexts may take
// (CompactContext, DropContextVersion).
inline constexpr int kWholeContextTimeouts = 10;

}  // namespace kvtier::internal

#endif  // KVTIER_CLIENT_CALL_H_
