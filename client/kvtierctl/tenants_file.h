// The tenants file (auth.tenants_file) as kvtierctl edits it: read with
// toml++, written by hand. The format and its rules are the daemon's
// (daemon/auth/tenants.h); this reads them as strictly as the daemon does,
// so a file kvtierctl writes is one the daemon loads:
//
//   [[tenants]]
//   name = "engine-a"               1..64 bytes of [A-Za-z0-9._-], unique
//   role = "data"                   "data" | "admin"
//   token_sha256 = ["9f86..."]      SHA-256 hex of each token, never a token
//   cert_names = ["engine-a"]       optional, unique across tenants
//   uids = [1001]                   optional, local users on auth.peer_socket_path,
//                                   unique across tenants
//   [tenants.quotas]                optional, keys in kQuotaKeys
//   device_bytes = "256MiB"
//   staging_slots = 64
//
// Writes are atomic: a temporary file beside the target, fsync, rename,
// fsync of the folder. A new file is mode 0600; a rewritten one keeps its
// owner, group and mode, less any bits for "other".
//
// Thread safety: free functions without shared state. Two processes editing
// one file are serialised by LockTenantsFolder.
#ifndef KVTIER_CLIENT_KVTIERCTL_TENANTS_FILE_H_
#define KVTIER_CLIENT_KVTIERCTL_TENANTS_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/auth/token.h"

namespace kvtier::ctl {

// The daemon's limits (daemon/auth/tenants.h).
inline constexpr size_t kMaxTenantNameBytes = daemon::kMaxTenantNameBytes;
inline constexpr size_t kMaxTenants = 4096;
inline constexpr size_t kMaxCertNameBytes = 256;

// Every quota the daemon knows, as in daemon/auth/tenants.h TenantQuotas.
// Keys ending in "_bytes" take a size (4096 or "64MiB"); the others a count.
inline constexpr const char* kQuotaKeys[] = {"device_bytes",       "pinned_bytes",  "leases",
                                             "staging_bytes",      "staging_slots", "contexts",
                                             "blocks_per_context", "host_bytes",    "nvme_bytes",
                                             "retained_bytes",     "profiles"};

struct Quota {
  std::string key;
  std::string value;    // as given: "64MiB" or "64"
  bool is_size_string;  // written as a TOML string ("64MiB"), else an integer
  bool operator==(const Quota&) const = default;
};

struct TenantEntry {
  std::string name;
  std::string role = "data";
  std::vector<std::string> token_sha256;
  std::vector<std::string> cert_names;
  std::vector<uint32_t> uids;
  std::vector<Quota> quotas;  // in kQuotaKeys order (SortQuotas)
  bool operator==(const TenantEntry&) const = default;
};

bool ValidTenantName(absl::string_view name);

// s as a double-quoted string with quotes, backslashes and control bytes
// escaped (\uXXXX): a TOML basic string, and also a JSON string.
std::string QuoteString(absl::string_view s);

// Puts quotas in kQuotaKeys order: the order ParseTenants returns (toml++
// does not keep a table's key order) and FormatTenant writes.
void SortQuotas(std::vector<Quota>* quotas);

// Checks "key=value" (from --quota) against kQuotaKeys and the value's
// syntax; INVALID_ARGUMENT naming the key and what it takes.
absl::StatusOr<Quota> ParseQuotaArgument(absl::string_view key_equals_value);

// Reads and checks the file. NOT_FOUND when it does not exist;
// INVALID_ARGUMENT naming the file, the entry (tenants[i]) and the field.
absl::StatusOr<std::vector<TenantEntry>> ReadTenantsFile(const std::string& path);
// The same checks on text (path only names it in messages).
absl::StatusOr<std::vector<TenantEntry>> ParseTenants(const std::string& text,
                                                      const std::string& path);

// Checks the whole table as the daemon would: names, roles, hashes, unique
// names, hashes and cert names, at least one credential per tenant, the
// tenant count.
absl::Status ValidateTenants(const std::vector<TenantEntry>& tenants, const std::string& path);

// One "[[tenants]]" block, ending in a newline.
std::string FormatTenant(const TenantEntry& tenant);
// A whole file: a header comment and every tenant.
std::string FormatTenantsFile(const std::vector<TenantEntry>& tenants);

// Replaces path's content with text atomically (see above).
absl::Status WriteFileAtomically(const std::string& path, const std::string& text);

// An exclusive flock on the folder holding path, held until the returned
// descriptor is closed (CloseLock). Advisory: it serialises kvtierctl
// processes, not editors.
absl::StatusOr<int> LockTenantsFolder(const std::string& path);
void CloseLock(int fd);

}  // namespace kvtier::ctl

#endif  // KVTIER_CLIENT_KVTIERCTL_TENANTS_FILE_H_
