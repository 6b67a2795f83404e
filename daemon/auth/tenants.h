// Tenants: who may call the daemon, with which role, and within which
// quotas. A tenant comes from the caller's credentials (a bearer token, or
// the common name of a verified client certificate), never from a request
// field, and scopes everything it touches: block keys, contexts, leases,
// staging slots and its own device arena.
//
// The table is the TOML file named by auth.tenants_file (format, parsing
// and checks in proto/auth/tenants_file.h, shared with kvtierctl):
//
//   [[tenants]]
//   name = "engine-a"           # 1..64 bytes of [A-Za-z0-9._-]
//   role = "data"               # "data" (KvTier service) or "admin" (both)
//   token_sha256 = ["9f86..."]  # SHA-256 (hex) of each bearer token
//   cert_names = ["engine-a"]   # optional: mTLS client-certificate CNs
//   uids = [1001]               # optional: local users on auth.peer_socket_path
//   [tenants.quotas]            # optional; 0 or absent = no quota
//   device_bytes = "256MiB"     # its device arena (pinned blocks live here)
//   pinned_bytes = "128MiB"     # blocks pinned by its leases at once
//   leases = 1024               # leases held at once (else auth.tenant_max_leases)
//   staging_bytes = "64MiB"     # its staging area for zero-copy puts
//   staging_slots = 64          # staging slots reserved at once
//   contexts = 256              # open contexts
//   blocks_per_context = 65536  # blocks of one context
//   host_bytes = "1GiB"         # its blocks' bytes in host DRAM
//   nvme_bytes = "8GiB"         # its blocks' bytes on NVMe
//   retained_bytes = "2GiB"     # its blocks put with retain (never evicted)
//   profiles = 16               # profiles it registered
//
// Tokens are stored hashed; `kvtierctl tenants add` writes an entry and
// prints the token once. Without auth.tenants_file authentication is off:
// every caller is the tenant "default" with the admin role and no quotas
// (auth.tenant_max_leases does not apply either).
//
// Thread safety: a TenantRegistry may be used from any thread; Reload swaps
// the whole table atomically (calls in flight keep the tenant they had).
#ifndef KVTIER_DAEMON_AUTH_TENANTS_H_
#define KVTIER_DAEMON_AUTH_TENANTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "proto/auth/tenants_file.h"

namespace kvtier::daemon {

inline constexpr char kDefaultTenant[] = "default";
inline constexpr size_t kMaxTenants = auth::kMaxTenants;

enum class Role : uint8_t { kData = 0, kAdmin = 1 };

// 0 means "no quota" (the daemon-wide limits still apply).
struct TenantQuotas {
  uint64_t device_bytes = 0;
  uint64_t pinned_bytes = 0;
  uint64_t leases = 0;  // 0: the daemon's auth.tenant_max_leases
  uint64_t staging_bytes = 0;
  uint64_t staging_slots = 0;
  uint64_t contexts = 0;
  uint64_t blocks_per_context = 0;
  uint64_t host_bytes = 0;
  uint64_t nvme_bytes = 0;
  uint64_t retained_bytes = 0;
  uint64_t profiles = 0;
};

struct Tenant {
  std::string name;
  Role role = Role::kData;
  TenantQuotas quotas;
};
using TenantPtr = std::shared_ptr<const Tenant>;

class TenantRegistry {
 public:
  // Authentication off: one tenant, "default", admin, no quotas.
  TenantRegistry();
  // Reads the tenants file. INVALID_ARGUMENT naming the file, the entry
  // (tenants[i]) and the field for a bad table; NOT_FOUND for a missing
  // file.
  static absl::StatusOr<std::unique_ptr<TenantRegistry>> Load(const std::string& path);

  // Re-reads the file given to Load; on error the table is unchanged and
  // the error returned. A no-op OK when authentication is off.
  absl::Status Reload();

  bool enabled() const { return !path_.empty(); }
  const std::string& path() const { return path_; }

  // The tenant a plaintext bearer token belongs to; nullptr when none.
  TenantPtr ByToken(absl::string_view token) const;
  // The tenant a verified client certificate's common name maps to.
  TenantPtr ByCertName(absl::string_view common_name) const;
  // The tenant whose `uids` list a local user (SO_PEERCRED) is in.
  TenantPtr ByUid(uint32_t uid) const;
  TenantPtr ByName(absl::string_view name) const;
  std::vector<TenantPtr> All() const;

 private:
  struct Table {
    absl::flat_hash_map<std::string, TenantPtr> by_name;
    absl::flat_hash_map<std::string, TenantPtr> by_token_hash;
    absl::flat_hash_map<std::string, TenantPtr> by_cert_name;
    absl::flat_hash_map<uint32_t, TenantPtr> by_uid;
  };
  static absl::StatusOr<std::shared_ptr<const Table>> Parse(const std::string& path);

  std::string path_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const Table> table_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_AUTH_TENANTS_H_
