#include "daemon/tenant.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/auth/auth_processor.h"

namespace kvtier::daemon {

absl::StatusOr<TenantPtr> CallerOf(const TenantRegistry& registry,
                                   const grpc::CallbackServerContext* ctx) {
  if (!registry.enabled()) return registry.ByName(kDefaultTenant);
  // Per call, from the call's own metadata: one connection may carry calls
  // of several tenants (a process holding two tokens, channels sharing a
  // subchannel, a proxy), so nothing is taken from connection state except
  // the verified client certificate, which is the connection's.
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it != md.end()) {
    const absl::string_view value(it->second.data(), it->second.size());
    constexpr absl::string_view kBearer = "Bearer ";
    if (absl::StartsWith(value, kBearer)) {
      TenantPtr tenant = registry.ByToken(value.substr(kBearer.size()));
      if (tenant != nullptr) return tenant;
    }
    return absl::UnauthenticatedError("unknown bearer token");
  }
  std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
  if (auth != nullptr) {
    for (const grpc::string_ref& cn : auth->FindPropertyValues("x509_common_name")) {
      TenantPtr tenant = registry.ByCertName(absl::string_view(cn.data(), cn.size()));
      if (tenant != nullptr) return tenant;
    }
  }
  return absl::UnauthenticatedError("the call carries no credentials of a known tenant");
}

absl::StatusOr<TenantPtr> AdminCallerOf(const TenantRegistry& registry,
                                        const grpc::CallbackServerContext* ctx) {
  absl::StatusOr<TenantPtr> caller = CallerOf(registry, ctx);
  if (!caller.ok()) return caller;
  if ((*caller)->role != Role::kAdmin) {
    return absl::PermissionDeniedError(
        absl::StrCat("tenant \"", (*caller)->name, "\" has the data role; the Admin service "
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
