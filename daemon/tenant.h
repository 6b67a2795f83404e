// The tenant of a call. It comes from the connection's credentials, never
// from a request field; until authentication is configured every caller is
// the tenant "default".
#ifndef KVTIER_DAEMON_TENANT_H_
#define KVTIER_DAEMON_TENANT_H_

#include <grpcpp/grpcpp.h>

#include <string>

namespace kvtier::daemon {

inline constexpr char kDefaultTenant[] = "default";

inline std::string TenantOf(const grpc::CallbackServerContext* /*ctx*/) { return kDefaultTenant; }

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_TENANT_H_
