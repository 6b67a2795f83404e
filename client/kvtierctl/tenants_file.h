// The tenants file (auth.tenants_file) as kvtierctl edits it. Its format,
// parsing, checks and formatting are shared with the daemon
// (proto/auth/tenants_file.h, brought into this namespace below); this
// adds only how kvtierctl replaces the file and serialises its editors.
//
// Writes are atomic: a temporary file beside the target, fsync, rename,
// fsync of the folder. A new file is mode 0600; a rewritten one keeps its
// owner, group and mode, less any bits for "other".
//
// Thread safety: free functions without shared state. Two processes editing
// one file are serialised by LockTenantsFolder.
#ifndef KVTIER_CLIENT_KVTIERCTL_TENANTS_FILE_H_
#define KVTIER_CLIENT_KVTIERCTL_TENANTS_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/auth/tenants_file.h"

namespace kvtier::ctl {

using auth::FormatTenant;
using auth::FormatTenantsFile;
using auth::kMaxCertNameBytes;
using auth::kMaxTenantNameBytes;
using auth::kMaxTenants;
using auth::kQuotaKeys;
using auth::ParseQuotaArgument;
using auth::ParseTenants;
using auth::Quota;
using auth::QuoteString;
using auth::ReadTenantsFile;
using auth::SortQuotas;
using auth::TenantEntry;
using auth::ValidateTenants;
using auth::ValidTenantName;

// Replaces path's content with text atomically (see above).
absl::Status WriteFileAtomically(const std::string& path, const std::string& text);

// An exclusive flock on the folder holding path, held until the returned
// descriptor is closed (CloseLock). Advisory: it serialises kvtierctl
// processes, not editors.
absl::StatusOr<int> LockTenantsFolder(const std::string& path);
void CloseLock(int fd);

}  // namespace kvtier::ctl

#endif  // KVTIER_CLIENT_KVTIERCTL_TENANTS_FILE_H_
