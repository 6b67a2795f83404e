#include "daemon/auth/auth_processor.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "daemon/grpc_status.h"
#include "daemon/tenant.h"

namespace kvtier::daemon {
namespace {

constexpr absl::string_view kBearer = "Bearer ";

}  // namespace

grpc::Status TenantAuthProcessor::Process(const InputMetadata& auth_metadata,
                                          grpc::AuthContext* context,
                                          OutputMetadata* consumed_auth_metadata,
                                          OutputMetadata* /*response_metadata*/) {
  TenantPtr tenant;
  if (auth_metadata.find(kPeerUidKey) != auth_metadata.end()) {
    return ToGrpcStatus(absl::UnauthenticatedError(
        absl::StrCat(kPeerUidKey, " metadata is set by the daemon, never by a client")));
  }
  auto it = auth_metadata.find("authorization");
  if (it != auth_metadata.end()) {
    const absl::string_view value(it->second.data(), it->second.size());
    if (!absl::StartsWith(value, kBearer)) {
      return ToGrpcStatus(
          absl::UnauthenticatedError("authorization metadata must be 'Bearer <token>'"));
    }
    tenant = registry_->ByToken(value.substr(kBearer.size()));
    if (tenant == nullptr) {
      return ToGrpcStatus(absl::UnauthenticatedError("unknown bearer token"));
    }
    // Not consumed: the handler re-reads it per call (daemon/tenant.h), as
    // the AuthContext is shared by every call on the connection.
  } else {
    // A client certificate the TLS handshake verified (mTLS listeners only).
    for (const grpc::string_ref& cn : context->FindPropertyValues("x509_common_name")) {
      tenant = registry_->ByCertName(absl::string_view(cn.data(), cn.size()));
      if (tenant != nullptr) break;
    }
    if (tenant == nullptr) {
      return ToGrpcStatus(absl::UnauthenticatedError(
          "missing credentials: send 'authorization: Bearer <token>' metadata "
          "(or a client certificate a tenant lists, over TLS)"));
    }
  }
  return grpc::Status::OK;
}

}  // namespace kvtier::daemon
