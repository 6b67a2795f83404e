#include "daemon/tenant.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/auth/auth_processor.h"

namespace kvtier::daemon {

CallCredentials CredentialsOf(const grpc::CallbackServerContext* ctx) {
  CallCredentials c;
  const auto& md = ctx->client_metadata();
  auto peer = md.find(kPeerUidKey);
  if (peer != md.end() &&
      absl::string_view(peer->second.data(), peer->second.size()) == kClaimedPeerUid) {
    c.claimed_peer_uid = true;
    return c;
  }
  auto it = md.find("authorization");
  if (it != md.end()) {
    c.has_authorization = true;
    c.authorization.assign(it->second.data(), it->second.size());
    return c;
  }
  if (peer != md.end()) {
    uint32_t uid = 0;
    if (absl::SimpleAtoi(absl::string_view(peer->second.data(), peer->second.size()), &uid)) {
      c.peer_uid = uid;
    }
    return c;
  }
  std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
  if (auth != nullptr) {
    for (const grpc::string_ref& cn : auth->FindPropertyValues("x509_common_name")) {
      c.cert_names.emplace_back(cn.data(), cn.size());
    }
  }
  return c;
}

absl::StatusOr<TenantPtr> Resolve(const TenantRegistry& registry,
                                  const CallCredentials& credentials) {
  if (!registry.enabled()) return registry.ByName(kDefaultTenant);
  if (credentials.claimed_peer_uid) {
    return absl::UnauthenticatedError(
        absl::StrCat(kPeerUidKey, " metadata is set by the daemon, never by a client"));
  }
  if (credentials.has_authorization) {
    constexpr absl::string_view kBearer = "Bearer ";
    const absl::string_view value = credentials.authorization;
    if (absl::StartsWith(value, kBearer)) {
      TenantPtr tenant = registry.ByToken(value.substr(kBearer.size()));
      if (tenant != nullptr) return tenant;
    }
    return absl::UnauthenticatedError("unknown bearer token");
  }
  if (credentials.peer_uid >= 0) {
    TenantPtr tenant = registry.ByUid(static_cast<uint32_t>(credentials.peer_uid));
    if (tenant != nullptr) return tenant;
    return absl::UnauthenticatedError(
        absl::StrCat("uid ", credentials.peer_uid, " is not in any tenant's uids"));
  }
  for (const std::string& cn : credentials.cert_names) {
    TenantPtr tenant = registry.ByCertName(cn);
    if (tenant != nullptr) return tenant;
  }
  return absl::UnauthenticatedError("the call carries no credentials of a known tenant");
}

absl::StatusOr<TenantPtr> CallerOf(const TenantRegistry& registry,
                                   const grpc::CallbackServerContext* ctx) {
  if (!registry.enabled()) return registry.ByName(kDefaultTenant);
  // Per call, from the call's own metadata: one connection may carry calls
  // of several tenants (a process holding two tokens, channels sharing a
  // subchannel, a proxy), so nothing is taken from connection state except
  // the verified client certificate, which is the connection's.
  return Resolve(registry, CredentialsOf(ctx));
}

absl::StatusOr<TenantPtr> AdminCallerOf(const TenantRegistry& registry,
                                        const grpc::CallbackServerContext* ctx) {
  absl::StatusOr<TenantPtr> caller = CallerOf(registry, ctx);
  if (!caller.ok()) return caller;
  if ((*caller)->role != Role::kAdmin) {
    return absl::PermissionDeniedError(absl::StrCat("tenant \"", (*caller)->name,
                                                    "\" has the data role; the Admin service "
                                                    "needs role = \"admin\""));
  }
  return caller;
}

absl::StatusOr<ModelProfile> ProfileOf(BlockStore* store, const std::string& tenant,
                                       uint64_t profile_id) {
  if (profile_id == 0) {
    return absl::InvalidArgumentError("profile_id: 0 (required: the id RegisterProfile returned)");
  }
  return store->GetProfile(tenant, profile_id);
}

}  // namespace kvtier::daemon
