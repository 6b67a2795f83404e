#include "daemon/auth/tenants.h"

#include <filesystem>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "proto/auth/tenants_file.h"
#include "proto/auth/token.h"

namespace kvtier::daemon {
namespace {

// The file's quotas (checked by auth::ParseTenants) as TenantQuotas.
TenantQuotas QuotasOf(const std::vector<auth::Quota>& quotas) {
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
  static_assert(std::size(kFields) == std::size(auth::kQuotaKeys));
  TenantQuotas q;
  for (const auth::Quota& quota : quotas) {
    for (const Field& f : kFields) {
      if (quota.key == f.key) q.*(f.member) = auth::QuotaValue(quota);
    }
  }
  return q;
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
  // The format and its checks (names, roles, hashes, duplicates, quotas)
  // are shared with kvtierctl.
  absl::StatusOr<std::vector<auth::TenantEntry>> entries = auth::ReadTenantsFile(path);
  if (!entries.ok()) return entries.status();
  auto table = std::make_shared<Table>();
  for (const auth::TenantEntry& e : *entries) {
    auto t = std::make_shared<Tenant>();
    t->name = e.name;
    t->role = e.role == "admin" ? Role::kAdmin : Role::kData;
    t->quotas = QuotasOf(e.quotas);
    table->by_name.emplace(t->name, t);
    for (const std::string& h : e.token_sha256) table->by_token_hash.emplace(h, t);
    for (const std::string& n : e.cert_names) table->by_cert_name.emplace(n, t);
    for (uint32_t uid : e.uids) table->by_uid.emplace(uid, t);
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
  const std::string hash = auth::HashToken(token);
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
