// kvtierctl tenants add / list / rotate.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/kvtierctl/commands.h"
#include "client/kvtierctl/tenants_file.h"
#include "proto/auth/token.h"

namespace kvtier::ctl {
namespace {

constexpr char kApplyHint[] =
    "kvtierctl: apply it to a running daemon with `kill -HUP <kvtierd pid>` or "
    "`systemctl reload kvtierd`\n";

int Fail(const absl::Status& status, std::ostream& err) {
  err << "kvtierctl: " << status.message() << "\n";
  return 1;
}

int Usage(const std::string& message, std::ostream& err) {
  err << "kvtierctl: " << message << "\n";
  return 2;
}

// Prints a new token: the token alone on out (or JSON), the warnings on err.
void PrintToken(const std::string& name, const std::string& token, const std::string& file,
                const GlobalOptions& options, std::ostream& out, std::ostream& err) {
  if (options.json) {
    out << "{\"tenant\": " << QuoteString(name) << ", \"token\": " << QuoteString(token) << "}\n";
  } else {
    out << token << "\n";
  }
  err << "kvtierctl: new token of tenant \"" << name << "\" written (as SHA-256) to " << file
      << "; it is shown only this once\n"
      << kApplyHint;
}

// The file's tenants, or none when it does not exist yet.
absl::StatusOr<std::vector<TenantEntry>> ReadOrEmpty(const std::string& file, bool* exists) {
  struct stat st;
  *exists = stat(file.c_str(), &st) == 0;
  if (!*exists) return std::vector<TenantEntry>();
  return ReadTenantsFile(file);
}

absl::StatusOr<std::string> ReadText(const std::string& file) {
  FILE* f = std::fopen(file.c_str(), "rb");
  if (f == nullptr) return absl::ErrnoToStatus(errno, "open " + file);
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return absl::DataLossError("read " + file + " failed");
  return text;
}

// The new file's text: the old text with the entry appended (comments and
// layout kept) when that parses back to exactly old + entry, else the
// whole table rewritten.
std::string TextWithAppended(const std::string& old_text, const std::vector<TenantEntry>& all,
                             const std::string& file) {
  std::string text = old_text;
  if (!text.empty() && text.back() != '\n') text += "\n";
  text += "\n" + FormatTenant(all.back());
  absl::StatusOr<std::vector<TenantEntry>> back = ParseTenants(text, file);
  return back.ok() && *back == all ? text : FormatTenantsFile(all);
}

class FolderLock {
 public:
  explicit FolderLock(int fd) : fd_(fd) {}
  ~FolderLock() { CloseLock(fd_); }

 private:
  const int fd_;
};

}  // namespace

int RunTenantsAdd(const TenantAddOptions& add, const GlobalOptions& options, std::ostream& out,
                  std::ostream& err) {
  if (!ValidTenantName(add.name)) {
    return Usage(absl::StrCat("tenant name \"", add.name, "\": must be 1..", kMaxTenantNameBytes,
                              " bytes of [A-Za-z0-9._-]"),
                 err);
  }
  if (add.role != "data" && add.role != "admin") {
    return Usage("--role " + add.role + ": must be data or admin", err);
  }
  TenantEntry entry;
  entry.name = add.name;
  entry.role = add.role;
  for (const std::string& arg : add.quotas) {
    absl::StatusOr<Quota> q = ParseQuotaArgument(arg);
    if (!q.ok()) return Usage(std::string(q.status().message()), err);
    for (const Quota& seen : entry.quotas) {
      if (seen.key == q->key) return Usage("--quota " + q->key + ": given twice", err);
    }
    entry.quotas.push_back(*q);
  }
  SortQuotas(&entry.quotas);
  for (const std::string& cn : add.cert_names) {
    if (cn.empty() || cn.size() > kMaxCertNameBytes) {
      return Usage(
          absl::StrCat("--cert-name \"", cn, "\": must be 1..", kMaxCertNameBytes, " bytes"), err);
    }
    if (std::find(entry.cert_names.begin(), entry.cert_names.end(), cn) != entry.cert_names.end()) {
      return Usage("--cert-name " + cn + ": given twice", err);
    }
    entry.cert_names.push_back(cn);
  }
  for (uint32_t uid : add.uids) {
    if (uid == 0xFFFFFFFFu) return Usage("--uid 4294967295: not a uid", err);
    if (std::find(entry.uids.begin(), entry.uids.end(), uid) != entry.uids.end()) {
      return Usage(absl::StrCat("--uid ", uid, ": given twice"), err);
    }
    entry.uids.push_back(uid);
  }

  absl::StatusOr<int> lock = LockTenantsFolder(add.file);
  if (!lock.ok()) return Fail(lock.status(), err);
  FolderLock unlock(*lock);
  bool exists = false;
  absl::StatusOr<std::vector<TenantEntry>> tenants = ReadOrEmpty(add.file, &exists);
  if (!tenants.ok()) return Fail(tenants.status(), err);
  for (const TenantEntry& t : *tenants) {
    if (t.name == add.name) {
      return Usage(
          absl::StrCat("tenant \"", add.name, "\" already exists in ", add.file,
                       " (`kvtierctl tenants rotate ", add.name, "` gives it a new token)"),
          err);
    }
    for (const std::string& cn : entry.cert_names) {
      if (std::find(t.cert_names.begin(), t.cert_names.end(), cn) != t.cert_names.end()) {
        return Usage("--cert-name " + cn + ": already listed by tenant \"" + t.name + "\"", err);
      }
    }
    for (uint32_t uid : entry.uids) {
      if (std::find(t.uids.begin(), t.uids.end(), uid) != t.uids.end()) {
        return Usage(absl::StrCat("--uid ", uid, ": already listed by tenant \"", t.name, "\""),
                     err);
      }
    }
  }
  const std::string token = auth::NewToken();
  if (token.empty()) return Fail(absl::InternalError("the OpenSSL random generator failed"), err);
  entry.token_sha256.push_back(auth::HashToken(token));
  tenants->push_back(entry);
  if (absl::Status st = ValidateTenants(*tenants, add.file); !st.ok())
    return Usage(std::string(st.message()), err);

  std::string text;
  if (exists) {
    absl::StatusOr<std::string> old_text = ReadText(add.file);
    if (!old_text.ok()) return Fail(old_text.status(), err);
    text = TextWithAppended(*old_text, *tenants, add.file);
  } else {
    text = FormatTenantsFile(*tenants);
  }
  if (absl::Status st = WriteFileAtomically(add.file, text); !st.ok()) return Fail(st, err);
  PrintToken(add.name, token, add.file, options, out, err);
  return 0;
}

int RunTenantsList(const std::string& file, const GlobalOptions& options, std::ostream& out,
                   std::ostream& err) {
  absl::StatusOr<std::vector<TenantEntry>> tenants = ReadTenantsFile(file);
  if (!tenants.ok()) return Fail(tenants.status(), err);
  auto quota_text = [](const TenantEntry& t) {
    std::vector<std::string> parts;
    for (const Quota& q : t.quotas) parts.push_back(q.key + "=" + q.value);
    return parts.empty() ? std::string("-") : absl::StrJoin(parts, " ");
  };
  if (options.json) {
    out << "[";
    for (size_t i = 0; i < tenants->size(); ++i) {
      const TenantEntry& t = (*tenants)[i];
      std::vector<std::string> certs, quotas;
      for (const std::string& c : t.cert_names) certs.push_back(QuoteString(c));
      for (const Quota& q : t.quotas) {
        quotas.push_back(QuoteString(q.key) + ": " +
                         (q.is_size_string ? QuoteString(q.value) : q.value));
      }
      out << (i ? ",\n " : "\n ") << "{\"name\": " << QuoteString(t.name)
          << ", \"role\": " << QuoteString(t.role) << ", \"tokens\": " << t.token_sha256.size()
          << ", \"cert_names\": [" << absl::StrJoin(certs, ", ") << "], \"uids\": ["
          << absl::StrJoin(t.uids, ", ") << "], \"quotas\": {" << absl::StrJoin(quotas, ", ")
          << "}}";
    }
    out << (tenants->empty() ? "]\n" : "\n]\n");
    return 0;
  }
  if (tenants->empty()) {
    out << "(no tenants in " << file << ")\n";
    return 0;
  }
  size_t width = 4;
  for (const TenantEntry& t : *tenants) width = std::max(width, t.name.size());
  char line[512];
  std::snprintf(line, sizeof(line), "%-*s  %-5s  %6s  %-20s  %s\n", static_cast<int>(width), "NAME",
                "ROLE", "TOKENS", "CERT_NAMES", "QUOTAS");
  out << line;
  for (const TenantEntry& t : *tenants) {
    const std::string certs = t.cert_names.empty() ? "-" : absl::StrJoin(t.cert_names, ",");
    out << absl::StrCat(t.name, std::string(width - t.name.size(), ' '), "  ");
    std::snprintf(line, sizeof(line), "%-5s  %6zu  %-20s  ", t.role.c_str(), t.token_sha256.size(),
                  certs.c_str());
    out << line << quota_text(t) << "\n";
  }
  return 0;
}

int RunTenantsRotate(const TenantsRotateOptions& rotate, const GlobalOptions& options,
                     std::ostream& out, std::ostream& err) {
  const std::string& name = rotate.name;
  const std::string& file = rotate.file;
  const bool revoke_others = rotate.revoke_others;
  absl::StatusOr<int> lock = LockTenantsFolder(file);
  if (!lock.ok()) return Fail(lock.status(), err);
  FolderLock unlock(*lock);
  absl::StatusOr<std::vector<TenantEntry>> tenants = ReadTenantsFile(file);
  if (!tenants.ok()) return Fail(tenants.status(), err);
  auto it = std::find_if(tenants->begin(), tenants->end(),
                         [&](const TenantEntry& t) { return t.name == name; });
  if (it == tenants->end()) {
    return Usage(absl::StrCat("tenant \"", name, "\" is not in ", file,
                              " (`kvtierctl tenants add` creates it)"),
                 err);
  }
  const std::string token = auth::NewToken();
  if (token.empty()) return Fail(absl::InternalError("the OpenSSL random generator failed"), err);
  const size_t revoked = revoke_others ? it->token_sha256.size() : 0;
  if (revoke_others) it->token_sha256.clear();
  it->token_sha256.push_back(auth::HashToken(token));
  if (absl::Status st = ValidateTenants(*tenants, file); !st.ok()) return Fail(st, err);
  if (absl::Status st = WriteFileAtomically(file, FormatTenantsFile(*tenants)); !st.ok()) {
    return Fail(st, err);
  }
  PrintToken(name, token, file, options, out, err);
  if (revoke_others) {
    err << "kvtierctl: revoked " << revoked << " other token(s) of \"" << name
        << "\" (calls carrying them fail once the daemon reloads)\n";
  }
  return 0;
}

}  // namespace kvtier::ctl
