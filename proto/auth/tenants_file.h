// The tenants file (auth.tenants_file): its format and rules, in one
// place for both sides. The daemon loads it (daemon/auth/tenants.h,
// TenantRegistry) and kvtierctl edits it (`kvtierctl tenants`), so a file
// kvtierctl writes is one the daemon loads, with the same messages for the
// same mistakes. It lives in proto/ because proto/ holds what the daemon
// and its clients share and neither may own: like the wire format, the
// tenants file and bearer tokens (token.h) are a contract between them,
// and client/ must not link daemon/. Depends on abseil and toml++ only.
//
//   [[tenants]]
//   name = "engine-a"               1..64 bytes of [A-Za-z0-9._-], unique
//   role = "data"                   "data" | "admin" (absent: "data")
//   token_sha256 = ["9f86..."]      SHA-256 hex of each token, never a token
//   cert_names = ["engine-a"]       optional, 1..256 bytes, unique across tenants
//   uids = [1001]                   optional, local users on auth.peer_socket_path,
//                                   unique across tenants
//   [tenants.quotas]                optional, keys in kQuotaKeys
//   device_bytes = "256MiB"         "_bytes" keys: a size or an integer
//   staging_slots = 64              others: a non-negative integer
//
// Every tenant needs at least one of token_sha256, cert_names, uids. At
// most kMaxTenants tenants. No other keys.
//
// Thread safety: free functions without shared state.
#ifndef KVTIER_PROTO_AUTH_TENANTS_FILE_H_
#define KVTIER_PROTO_AUTH_TENANTS_FILE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/auth/token.h"

namespace kvtier::auth {

inline constexpr size_t kMaxTenants = 4096;
inline constexpr size_t kMaxCertNameBytes = 256;

// Every quota the daemon knows (daemon/auth/tenants.h TenantQuotas).
// Keys ending in "_bytes" take a size (4096 or "64MiB"); the others a count.
inline constexpr const char* kQuotaKeys[] = {"device_bytes",       "pinned_bytes",  "leases",
                                             "staging_bytes",      "staging_slots", "contexts",
                                             "blocks_per_context", "host_bytes",    "nvme_bytes",
                                             "retained_bytes",     "profiles"};

// A byte size as the daemon's configuration and the tenants file write it:
// 1 to 19 digits, optional spaces, then an optional unit (B, KiB, MiB, GiB,
// TiB, KB, MB, GB, TB); the product must fit 64 bits. nullopt if not.
// daemon/config.cc's ParseSize is this with an error message.
std::optional<uint64_t> ParseSizeText(absl::string_view text);

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

// Reads and checks the file. NOT_FOUND naming the file when it does not
// exist; INVALID_ARGUMENT naming the file, the entry (tenants[i]) and the
// field.
absl::StatusOr<std::vector<TenantEntry>> ReadTenantsFile(const std::string& path);
// The same checks on text (path only names it in messages).
absl::StatusOr<std::vector<TenantEntry>> ParseTenants(const std::string& text,
                                                      const std::string& path);

// Checks the whole table: names, roles, hashes, unique names, hashes, cert
// names and uids, at least one credential per tenant, the tenant count.
absl::Status ValidateTenants(const std::vector<TenantEntry>& tenants, const std::string& path);

// One "[[tenants]]" block, ending in a newline.
std::string FormatTenant(const TenantEntry& tenant);
// A whole file: a header comment and every tenant.
std::string FormatTenantsFile(const std::vector<TenantEntry>& tenants);

// A quota's value in bytes or as a count (the value was checked when
// parsed: ParseTenants or ParseQuotaArgument).
uint64_t QuotaValue(const Quota& quota);

}  // namespace kvtier::auth

#endif  // KVTIER_PROTO_AUTH_TENANTS_FILE_H_
