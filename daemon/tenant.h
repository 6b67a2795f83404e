// The tenant of a call. It comes from the call's credentials, never from a
// request field: its own "authorization: Bearer" metadata (calls of several
// tenants may share one connection), else the uid of a connection to the
// peer socket (SO_PEERCRED, mapped by the tenants' `uids`), else the
// connection's verified client certificate. The TenantAuthProcessor (daemon/auth/auth_processor.h)
// has already refused calls without either before any handler runs.
//
//   absl::StatusOr<TenantPtr> caller = CallerOf(*runtime->tenants(), ctx);
//   if (!caller.ok()) return Finish(caller.status());   // UNAUTHENTICATED
//   ... BlockKey{(*caller)->name, ...}
//
// With authentication off every caller is the tenant "default" (admin, no
// quotas). With it on, a call whose tenant is missing from the current
// table (removed by a reload since the processor ran) is UNAUTHENTICATED:
// callers fail closed.
//
// Thread safety: every function is thread-safe.
#ifndef KVTIER_DAEMON_TENANT_H_
#define KVTIER_DAEMON_TENANT_H_

#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/auth/tenants.h"
#include "storage/store/block_store.h"

namespace kvtier::daemon {

absl::StatusOr<TenantPtr> CallerOf(const TenantRegistry& registry,
                                   const grpc::CallbackServerContext* ctx);

// What CallerOf resolves: the call's bearer token (when it sent an
// authorization header) or its connection's verified certificate names.
// A stream keeps its credentials so that a reload can check them again
// (daemon/streams.h cancels the streams of revoked tokens).
struct CallCredentials {
  bool has_authorization = false;
  std::string authorization;  // the header's value, "Bearer <token>"
  std::vector<std::string> cert_names;
  // The connection's uid (SO_PEERCRED) when it came through
  // auth.peer_socket_path (daemon/auth/peer_server.h); -1 otherwise.
  int64_t peer_uid = -1;
  // The client sent kvtier-peer-uid on a socket where only the daemon may
  // set it (the main server marks it kClaimedPeerUid): refused.
  bool claimed_peer_uid = false;
};

// The metadata key the peer socket's servers set to the connection's uid.
// A client never sets it: the peer servers overwrite it, and the token
// processor of the other listeners refuses a call that carries it.
inline constexpr char kPeerUidKey[] = "kvtier-peer-uid";
// The value the main Unix socket's server puts in place of a kvtier-peer-uid
// a client sent there (daemon/server.cc); Resolve refuses such a call.
inline constexpr char kClaimedPeerUid[] = "claimed";
CallCredentials CredentialsOf(const grpc::CallbackServerContext* ctx);
// The tenant `credentials` belong to in `registry` now; UNAUTHENTICATED when
// none (authentication off: "default").
absl::StatusOr<TenantPtr> Resolve(const TenantRegistry& registry,
                                  const CallCredentials& credentials);

// CallerOf, and PERMISSION_DENIED unless the caller has the admin role.
absl::StatusOr<TenantPtr> AdminCallerOf(const TenantRegistry& registry,
                                        const grpc::CallbackServerContext* ctx);

// The profile profile_id of `tenant`, for every RPC that names one:
// INVALID_ARGUMENT naming profile_id when it is 0 (the field is missing);
// NOT_FOUND "profile_id: N is not registered" for any other id that is not
// one of the tenant's profiles, another tenant's included: the same words,
// so that ids reveal nothing of other tenants.
absl::StatusOr<ModelProfile> ProfileOf(BlockStore* store, const std::string& tenant,
                                       uint64_t profile_id);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_TENANT_H_
