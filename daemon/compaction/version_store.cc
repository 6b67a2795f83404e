#include "daemon/compaction/version_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

#include <rocksdb/db.h>

#include "absl/strings/str_cat.h"
#include "kvtier/v1/kvtier.pb.h"
#include "storage/catalog/catalog.h"
#include "storage/catalog/rocksdb_status.h"
#include "storage/common/client_text.h"
#include "storage/common/status_macros.h"

namespace kvtier::daemon {
namespace {

// The key of compacted_: one string per (tenant, profile_id, block_id).
std::string CompactedKey(const std::string& tenant, uint64_t profile_id,
                         const std::string& block_id) {
  return absl::StrCat(tenant.size(), ":", tenant, profile_id, ":", block_id);
}

// The older store's values were API messages.
ContextVersionRecord RecordOf(const v1::ContextVersion& v) {
  ContextVersionRecord r;
  r.version = v.version();
  r.context_key = v.context_key();
  r.block_ids.assign(v.block_ids().begin(), v.block_ids().end());
  r.tokens = v.tokens();
  r.retention = v.retention();
  r.importance = static_cast<uint8_t>(v.importance());
  r.merge = static_cast<uint8_t>(v.merge());
  r.bias = static_cast<uint8_t>(v.bias());
  r.created_unix_ms = v.created_unix_ms();
  r.dropped = v.dropped();
  return r;
}

CompactedSlotsRecord RecordOf(const v1::CompactedSlots& s) {
  CompactedSlotsRecord r;
  r.version = s.version();
  r.positions.assign(s.positions().begin(), s.positions().end());
  r.logit_bias.assign(s.logit_bias().begin(), s.logit_bias().end());
  r.merged.assign(s.merged().begin(), s.merged().end());
  return r;
}

// ---- The older separate store -------------------------------------------
// Keys: 'v' tenant_len(u16 BE) tenant profile_id(u64 BE) context_key
// version(u32 BE) -> v1::ContextVersion; 's' tenant_len(u16 BE) tenant
// profile_id(u64 BE) block_id -> v1::CompactedSlots.

struct LegacyScope {
  std::string tenant;
  uint64_t profile_id = 0;
  std::string rest;  // context_key + version, or block_id
};

bool ParseLegacyKey(absl::string_view key, LegacyScope* out) {
  if (key.size() < 3) return false;
  const size_t tenant_len = (static_cast<uint8_t>(key[1]) << 8) | static_cast<uint8_t>(key[2]);
  if (key.size() < 3 + tenant_len + 8) return false;
  out->tenant = std::string(key.substr(3, tenant_len));
  out->profile_id = 0;
  for (size_t i = 0; i < 8; ++i) {
    out->profile_id = (out->profile_id << 8) | static_cast<uint8_t>(key[3 + tenant_len + i]);
  }
  out->rest = std::string(key.substr(3 + tenant_len + 8));
  return true;
}

// Adds one record of the old store to batch; DATA_LOSS naming the key.
absl::Status AddLegacyRecord(absl::string_view key, absl::string_view value, CatalogBatch* batch) {
  auto loss = [&](absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat("compaction versions: record ", ClientHex(key, 64), ": ", why));
  };
  LegacyScope scope;
  if (key.empty() || (key[0] != 'v' && key[0] != 's') || !ParseLegacyKey(key, &scope)) {
    return loss("unknown key");
  }
  if (key[0] == 'v') {
    v1::ContextVersion v;
    if (!v.ParseFromArray(value.data(), static_cast<int>(value.size()))) {
      return loss("a version record does not parse");
    }
    absl::Status st = batch->PutContextVersion(scope.tenant, scope.profile_id, RecordOf(v));
    return st.ok() ? st : loss(st.message());
  }
  v1::CompactedSlots s;
  if (!s.ParseFromArray(value.data(), static_cast<int>(value.size()))) {
    return loss("a slot record does not parse");
  }
  absl::Status st =
      batch->PutCompactedSlots(BlockKey{scope.tenant, scope.profile_id, scope.rest}, RecordOf(s));
  return st.ok() ? st : loss(st.message());
}

absl::Status RemoveDir(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("remove ", dir.string(), ": ", ec.message()));
  return absl::OkStatus();
}

// Moves every record of the old store in dir into the catalog, then
// removes dir (rename first: a half-deleted store is never opened again).
absl::Status MigrateLegacyStore(const std::string& dir, Catalog* catalog) {
  const std::string removing = dir + ".removing";
  KVTIER_RETURN_IF_ERROR(RemoveDir(removing));  // a removal a crash cut short
  std::error_code ec;
  // No database there (never one, or one RocksDB never finished creating):
  // nothing to migrate, and nothing of ours to delete.
  if (!std::filesystem::exists(std::filesystem::path(dir) / "CURRENT", ec)) {
    return absl::OkStatus();
  }
  rocksdb::Options options;
  options.paranoid_checks = true;
  rocksdb::DB* raw = nullptr;
  KVTIER_RETURN_IF_ERROR(RocksToStatus(rocksdb::DB::OpenForReadOnly(options, dir, &raw),
                                       absl::StrCat("compaction versions in ", dir)));
  std::unique_ptr<rocksdb::DB> db(raw);
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
  CatalogBatch batch;
  // Several batches are fine: until dir is removed, a crash means the
  // whole store is migrated again, writing the same records.
  constexpr size_t kOpsPerBatch = 4096;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    absl::Status st =
        AddLegacyRecord(absl::string_view(it->key().data(), it->key().size()),
                        absl::string_view(it->value().data(), it->value().size()), &batch);
    if (!st.ok()) {
      return absl::Status(st.code(), absl::StrCat(dir, ": ", st.message(),
                                                  " (move the directory away to start without "
                                                  "its versions)"));
    }
    if (batch.size() >= kOpsPerBatch) {
      KVTIER_RETURN_IF_ERROR(catalog->Write(batch));
      batch = CatalogBatch();
    }
  }
  KVTIER_RETURN_IF_ERROR(RocksToStatus(it->status(), absl::StrCat("compaction versions in ", dir)));
  KVTIER_RETURN_IF_ERROR(catalog->Write(batch));
  it.reset();
  db.reset();
  std::filesystem::rename(dir, removing, ec);
  if (ec) return absl::InternalError(absl::StrCat("rename ", dir, ": ", ec.message()));
  // The rename is durable before the records' old home disappears.
  const std::string parent = std::filesystem::path(dir).parent_path().string();
  const int fd = open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
  return RemoveDir(removing);
}

}  // namespace

absl::StatusOr<std::unique_ptr<VersionStore>> VersionStore::Open(Catalog* catalog,
                                                                 const std::string& legacy_dir) {
  if (catalog == nullptr) return absl::InvalidArgumentError("compaction versions: no catalog");
  KVTIER_RETURN_IF_ERROR(MigrateLegacyStore(legacy_dir, catalog));
  absl::flat_hash_set<std::string> compacted;
  KVTIER_RETURN_IF_ERROR(catalog->ForEachCompactedBlock([&](const BlockKey& key) {
    compacted.insert(CompactedKey(key.tenant, key.profile_id, key.block_id));
  }));
  auto store = std::unique_ptr<VersionStore>(new VersionStore(catalog));
  absl::MutexLock lock(&store->mu_);
  store->compacted_ = std::move(compacted);
  return store;
}

absl::Status VersionStore::Put(const std::string& tenant, uint64_t profile_id,
                               const std::vector<ContextVersionRecord>& versions,
                               const std::vector<SlotRecord>& slots) {
  CatalogBatch batch;
  for (const ContextVersionRecord& v : versions) {
    KVTIER_RETURN_IF_ERROR(batch.PutContextVersion(tenant, profile_id, v));
  }
  for (const SlotRecord& s : slots) {
    KVTIER_RETURN_IF_ERROR(
        batch.PutCompactedSlots(BlockKey{tenant, profile_id, s.block_id}, s.slots));
  }
  KVTIER_RETURN_IF_ERROR(catalog_->Write(batch));
  absl::MutexLock lock(&mu_);
  for (const SlotRecord& s : slots) compacted_.insert(CompactedKey(tenant, profile_id, s.block_id));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ContextVersionRecord>> VersionStore::Versions(
    const std::string& tenant, uint64_t profile_id, const std::string& context_key) {
  // No version is stored under a longer key (a client's bytes).
  if (context_key.size() > kMaxContextKeyBytes) return std::vector<ContextVersionRecord>();
  return catalog_->ContextVersions(tenant, profile_id, context_key);
}

absl::StatusOr<std::vector<ContextVersionRecord>> VersionStore::AllVersions(
    const std::string& tenant, uint64_t profile_id) {
  return catalog_->ContextVersions(tenant, profile_id, "");
}

absl::Status VersionStore::MarkDropped(const std::string& tenant, uint64_t profile_id,
                                       const ContextVersionRecord& record,
                                       const std::vector<std::string>& block_ids) {
  CatalogBatch batch;
  KVTIER_RETURN_IF_ERROR(batch.PutContextVersion(tenant, profile_id, record));
  for (const std::string& id : block_ids) {
    KVTIER_RETURN_IF_ERROR(batch.DeleteCompactedSlots(BlockKey{tenant, profile_id, id}));
  }
  KVTIER_RETURN_IF_ERROR(catalog_->Write(batch));
  absl::MutexLock lock(&mu_);
  for (const std::string& id : block_ids) compacted_.erase(CompactedKey(tenant, profile_id, id));
  return absl::OkStatus();
}

bool VersionStore::IsCompacted(const std::string& tenant, uint64_t profile_id,
                               const std::string& block_id) {
  absl::MutexLock lock(&mu_);
  if (compacted_.empty()) return false;  // no key built when nothing was compacted
  return compacted_.contains(CompactedKey(tenant, profile_id, block_id));
}

absl::StatusOr<CompactedSlotsRecord> VersionStore::Slots(const std::string& tenant,
                                                         uint64_t profile_id,
                                                         const std::string& block_id) {
  if (!IsCompacted(tenant, profile_id, block_id)) {
    return absl::NotFoundError("not a compacted block");
  }
  absl::StatusOr<CompactedSlotsRecord> slots =
      catalog_->GetCompactedSlots(BlockKey{tenant, profile_id, block_id});
  if (absl::IsNotFound(slots.status())) return absl::NotFoundError("not a compacted block");
  return slots;
}

}  // namespace kvtier::daemon
