#include "daemon/auth/tenants.h"

#include <toml++/toml.h>

#include <filesystem>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "daemon/config.h"

namespace kvtier::daemon {
namespace {

absl::Status Bad(const std::string& path, size_t i, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": tenants[", i, "]: ", what));
}

// A size ("64MiB" or an integer) or a count.
absl::StatusOr<uint64_t> QuotaValue(const toml::node& node, const std::string& key) {
  if (const auto* i = node.as_integer()) {
    if (i->get() < 0) return absl::InvalidArgumentError(absl::StrCat("quotas.", key, " < 0"));
    return static_cast<uint64_t>(i->get());
  }
  if (const auto* s = node.as_string()) {
    absl::StatusOr<uint64_t> v = ParseSize(s->get());
    if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat("quotas.", key, ": ",
                                                                v.status().message()));
    return *v;
  }
  return absl::InvalidArgumentError(absl::StrCat("quotas.", key, ": not a number or size"));
}

absl::Status ParseQuotas(const toml::table& t, TenantQuotas* q) {
  struct Field {
    const char* key;
    uint64_t TenantQuotas::*member;
  };
  static const Field kFields[] = {
      {"device_bytes", &TenantQuotas::device_bytes},
      {"pinned_bytes", &TenantQuotas::pinned_bytes},
      {"leases", &TenantQuotas::leases},
      {"staging_bytes", &TenantQuotas::staging_bytes},
      {"staging_slots", &TenantQuotas::staging_slots},
      {"contexts", &TenantQuotas::contexts},
      {"blocks_per_context", &TenantQuotas::blocks_per_context},
      {"host_bytes", &TenantQuotas::host_bytes},
      {"nvme_bytes", &TenantQuotas::nvme_bytes},
      {"retained_bytes", &TenantQuotas::retained_bytes},
      {"profiles", &TenantQuotas::profiles},
  };
  for (const auto& [key, node] : t) {
    const std::string k(key.str());
    const Field* f = nullptr;
    for (const Field& c : kFields) {
      if (k == c.key) f = &c;
    }
    if (f == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown quota quotas.", k));
    absl::StatusOr<uint64_t> v = QuotaValue(node, k);
    if (!v.ok()) return v.status();
    q->*(f->member) = *v;
  }
  return absl::OkStatus();
}

}  // namespace

TenantRegistry::TenantRegistry() {
  auto table = std::make_shared<Table>();
  auto t = std::make_shared<Tenant>();
  t->name = kDefaultTenant;
  t->role = Role::kAdmin;
  table->by_name[t->name] = t;
  table_ = std::move(table);
}

absl::StatusOr<std::shared_ptr<const TenantRegistry::Table>> TenantRegistry::Parse(
    const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("key 'auth.tenants_file': ", path, " does not exist"));
  }
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ":", e.source().begin.line, ": ", std::string(e.description())));
  }
  auto table = std::make_shared<Table>();
  const toml::array* list = root["tenants"].as_array();
  for (const auto& [key, node] : root) {
    if (key.str() != "tenants") {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": unknown key '", std::string(key.str()), "' (only [[tenants]])"));
    }
  }
  if (list != nullptr && list->size() > kMaxTenants) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", list->size(), " tenants exceed the limit of ", kMaxTenants));
  }
  for (size_t i = 0; list != nullptr && i < list->size(); ++i) {
    const toml::table* e = (*list)[i].as_table();
    if (e == nullptr) return Bad(path, i, "not a table");
    auto t = std::make_shared<Tenant>();
    std::vector<std::string> hashes, names;
    std::vector<uint32_t> uids;
    for (const auto& [key, node] : *e) {
      const std::string k(key.str());
      if (k == "name") {
        if (!node.is_string() || !IsTenantName(node.as_string()->get())) {
          return Bad(path, i, "name must be 1..64 bytes of [A-Za-z0-9._-]");
        }
        t->name = node.as_string()->get();
      } else if (k == "role") {
        const std::string role = node.is_string() ? node.as_string()->get() : "";
        if (role != "data" && role != "admin") return Bad(path, i, "role must be data or admin");
        t->role = role == "admin" ? Role::kAdmin : Role::kData;
      } else if (k == "token_sha256" || k == "cert_names") {
        const toml::array* a = node.as_array();
        if (a == nullptr) return Bad(path, i, k + " must be a list of strings");
        for (const auto& v : *a) {
          if (!v.is_string()) return Bad(path, i, k + " must be a list of strings");
          const std::string s = v.as_string()->get();
          if (k == "token_sha256" && !IsTokenHash(s)) {
            return Bad(path, i, "token_sha256 entries are 64 lowercase hex digits (SHA-256)");
          }
          if (k == "cert_names" && (s.empty() || s.size() > 256)) {
            return Bad(path, i, "cert_names entries are 1..256 bytes");
          }
          (k == "token_sha256" ? hashes : names).push_back(s);
        }
      } else if (k == "uids") {
        const toml::array* a = node.as_array();
        if (a == nullptr) return Bad(path, i, "uids must be a list of integers");
        for (const auto& v : *a) {
          const std::optional<int64_t> uid = v.value<int64_t>();
          if (!v.is_integer() || !uid || *uid < 0 || *uid >= 0xFFFFFFFFll) {
            return Bad(path, i, "uids entries are integers in [0, 4294967294]");
          }
          uids.push_back(static_cast<uint32_t>(*uid));
        }
      } else if (k == "quotas") {
        if (!node.is_table()) return Bad(path, i, "quotas must be a table");
        if (absl::Status st = ParseQuotas(*node.as_table(), &t->quotas); !st.ok()) {
          return Bad(path, i, std::string(st.message()));
        }
      } else {
        return Bad(path, i, absl::StrCat("unknown key '", k, "'"));
      }
    }
    if (t->name.empty()) return Bad(path, i, "name is required");
    if (hashes.empty() && names.empty() && uids.empty()) {
      return Bad(path, i,
                 "needs token_sha256, cert_names or uids (else it cannot authenticate)");
    }
    if (!table->by_name.emplace(t->name, t).second) {
      return Bad(path, i, absl::StrCat("tenant \"", t->name, "\" is listed twice"));
    }
    for (const std::string& h : hashes) {
      if (!table->by_token_hash.emplace(h, t).second) {
        return Bad(path, i, "a token hash is listed under two tenants");
      }
    }
    for (const std::string& n : names) {
      if (!table->by_cert_name.emplace(n, t).second) {
        return Bad(path, i, absl::StrCat("cert name \"", n, "\" is listed under two tenants"));
      }
    }
    for (uint32_t uid : uids) {
      if (!table->by_uid.emplace(uid, t).second) {
        return Bad(path, i, absl::StrCat("uid ", uid, " is listed under two tenants"));
      }
    }
  }
  return std::shared_ptr<const Table>(std::move(table));
}

absl::StatusOr<std::unique_ptr<TenantRegistry>> TenantRegistry::Load(const std::string& path) {
  absl::StatusOr<std::shared_ptr<const Table>> table = Parse(path);
  if (!table.ok()) return table.status();
  auto r = std::make_unique<TenantRegistry>();
  r->path_ = path;
  absl::MutexLock lock(&r->mu_);
  r->table_ = std::move(*table);
  return r;
}

absl::Status TenantRegistry::Reload() {
  if (!enabled()) return absl::OkStatus();
  absl::StatusOr<std::shared_ptr<const Table>> table = Parse(path_);
  if (!table.ok()) return table.status();
  absl::MutexLock lock(&mu_);
  table_ = std::move(*table);
  return absl::OkStatus();
}

TenantPtr TenantRegistry::ByToken(absl::string_view token) const {
  if (!enabled() || token.empty()) return nullptr;
  const std::string hash = HashToken(token);
  absl::MutexLock lock(&mu_);
  auto it = table_->by_token_hash.find(hash);
  return it == table_->by_token_hash.end() ? nullptr : it->second;
}

TenantPtr TenantRegistry::ByUid(uint32_t uid) const {
  if (!enabled()) return nullptr;
  absl::MutexLock lock(&mu_);
  auto it = table_->by_uid.find(uid);
  return it == table_->by_uid.end() ? nullptr : it->second;
}

TenantPtr TenantRegistry::ByCertName(absl::string_view common_name) const {
  if (!enabled()) return nullptr;
  absl::MutexLock lock(&mu_);
  auto it = table_->by_cert_name.find(common_name);
  return it == table_->by_cert_name.end() ? nullptr : it->second;
}

TenantPtr TenantRegistry::ByName(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = table_->by_name.find(name);
  return it == table_->by_name.end() ? nullptr : it->second;
}

std::vector<TenantPtr> TenantRegistry::All() const {
  absl::MutexLock lock(&mu_);
  std::vector<TenantPtr> out;
  for (const auto& [name, t] : table_->by_name) out.push_back(t);
  return out;
}

}  // namespace kvtier::daemon
