// The daemon's gRPC authentication: an AuthMetadataProcessor that maps every
// call's credentials to a tenant (auth/tenants.h) before any handler runs.
//
//   "authorization: Bearer <token>"  -> the tenant holding the token's hash
//   no token, a verified client certificate (mTLS on TCP)
//                                    -> the tenant listing its common name
//   anything else                    -> UNAUTHENTICATED, the call never
//                                       reaches a service
//
// The processor only admits or refuses: gRPC shares one AuthContext among
// all calls of a connection, so nothing per call is stored there; the
// handlers map each call to its tenant again (CallerOf, daemon/tenant.h)
// from the call's own metadata. Installed
// only when authentication is on (auth.tenants_file set); otherwise every
// caller is the default tenant.
//
// Thread safety: Process runs on gRPC threads concurrently; the registry is
// thread-safe.
#ifndef KVTIER_DAEMON_AUTH_AUTH_PROCESSOR_H_
#define KVTIER_DAEMON_AUTH_AUTH_PROCESSOR_H_

#include <grpcpp/security/auth_metadata_processor.h>

#include <memory>

#include "daemon/auth/tenants.h"

namespace kvtier::daemon {

class TenantAuthProcessor final : public grpc::AuthMetadataProcessor {
 public:
  // registry is not owned and outlives the processor.
  explicit TenantAuthProcessor(const TenantRegistry* registry) : registry_(registry) {}

  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  const TenantRegistry* const registry_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_AUTH_AUTH_PROCESSOR_H_
