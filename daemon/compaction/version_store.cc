#include "daemon/compaction/version_store.h"

#include <rocksdb/db.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include "absl/strings/str_cat.h"
#include "storage/catalog/rocksdb_status.h"

namespace kvtier::daemon {
namespace {

void AppendBe(std::string* out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string Prefix(char kind, const std::string& tenant, uint64_t profile_id) {
  std::string k(1, kind);
  AppendBe(&k, tenant.size(), 2);
  k += tenant;
  AppendBe(&k, profile_id, 8);
  return k;
}

std::string VersionKey(const std::string& tenant, uint64_t profile_id,
                       const std::string& context_key, uint32_t version) {
  std::string k = Prefix('v', tenant, profile_id);
  k += context_key;
  AppendBe(&k, version, 4);
  return k;
}

std::string SlotKey(const std::string& tenant, uint64_t profile_id, const std::string& block_id) {
  return Prefix('s', tenant, profile_id) + block_id;
}

rocksdb::WriteOptions Synced() {
  rocksdb::WriteOptions w;
  w.sync = true;
  return w;
}

}  // namespace

VersionStore::VersionStore(std::unique_ptr<rocksdb::DB> db) : db_(std::move(db)) {}
VersionStore::~VersionStore() = default;

absl::StatusOr<std::unique_ptr<VersionStore>> VersionStore::Open(const std::string& dir) {
  rocksdb::Options options;
  options.create_if_missing = true;
  options.paranoid_checks = true;
  options.wal_recovery_mode = rocksdb::WALRecoveryMode::kPointInTimeRecovery;
  options.max_open_files = 64;
  options.max_background_jobs = 1;
  options.write_buffer_size = 4 << 20;
  options.max_write_buffer_number = 2;
  options.keep_log_file_num = 2;
  options.max_log_file_size = 1 << 20;
  options.compression = rocksdb::kNoCompression;
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = rocksdb::NewLRUCache(8 << 20);
  options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  rocksdb::DB* raw = nullptr;
  rocksdb::Status st = rocksdb::DB::Open(options, dir, &raw);
  if (!st.ok()) return RocksToStatus(st, absl::StrCat("compaction versions in ", dir));
  auto store = std::unique_ptr<VersionStore>(new VersionStore(std::unique_ptr<rocksdb::DB>(raw)));
  // Load the ids of compacted blocks.
  std::unique_ptr<rocksdb::Iterator> it(store->db_->NewIterator(rocksdb::ReadOptions()));
  absl::MutexLock lock(&store->mu_);
  for (it->Seek("s"); it->Valid() && it->key().starts_with("s"); it->Next()) {
    store->compacted_.insert(it->key().ToString());
  }
  if (!it->status().ok()) return RocksToStatus(it->status(), "compaction versions: scan");
  return store;
}

absl::Status VersionStore::Put(const std::string& tenant, uint64_t profile_id,
                               const std::vector<v1::ContextVersion>& versions,
                               const std::vector<SlotRecord>& slots) {
  rocksdb::WriteBatch batch;
  std::vector<std::string> slot_keys;
  for (const v1::ContextVersion& v : versions) {
    batch.Put(VersionKey(tenant, profile_id, v.context_key(), v.version()), v.SerializeAsString());
  }
  for (const SlotRecord& s : slots) {
    slot_keys.push_back(SlotKey(tenant, profile_id, s.block_id));
    batch.Put(slot_keys.back(), s.slots.SerializeAsString());
  }
  rocksdb::Status st = db_->Write(Synced(), &batch);
  if (!st.ok()) return RocksToStatus(st, "compaction versions: write");
  absl::MutexLock lock(&mu_);
  for (std::string& k : slot_keys) compacted_.insert(std::move(k));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::ContextVersion>> VersionStore::Scan(const std::string& prefix) {
  std::vector<v1::ContextVersion> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    v1::ContextVersion v;
    if (!v.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return absl::DataLossError("compaction versions: a version record does not parse");
    }
    out.push_back(std::move(v));
  }
  if (!it->status().ok()) return RocksToStatus(it->status(), "compaction versions: scan");
  return out;
}

absl::StatusOr<std::vector<v1::ContextVersion>> VersionStore::Versions(
    const std::string& tenant, uint64_t profile_id, const std::string& context_key) {
  return Scan(Prefix('v', tenant, profile_id) + context_key);
}

absl::StatusOr<std::vector<v1::ContextVersion>> VersionStore::AllVersions(
    const std::string& tenant, uint64_t profile_id) {
  return Scan(Prefix('v', tenant, profile_id));
}

absl::Status VersionStore::MarkDropped(const std::string& tenant, uint64_t profile_id,
                                       const v1::ContextVersion& record,
                                       const std::vector<std::string>& block_ids) {
  rocksdb::WriteBatch batch;
  batch.Put(VersionKey(tenant, profile_id, record.context_key(), record.version()),
            record.SerializeAsString());
  std::vector<std::string> slot_keys;
  for (const std::string& id : block_ids) {
    slot_keys.push_back(SlotKey(tenant, profile_id, id));
    batch.Delete(slot_keys.back());
  }
  rocksdb::Status st = db_->Write(Synced(), &batch);
  if (!st.ok()) return RocksToStatus(st, "compaction versions: drop");
  absl::MutexLock lock(&mu_);
  for (const std::string& k : slot_keys) compacted_.erase(k);
  return absl::OkStatus();
}

bool VersionStore::IsCompacted(const std::string& tenant, uint64_t profile_id,
                               const std::string& block_id) {
  absl::MutexLock lock(&mu_);
  if (compacted_.empty()) return false;  // no key built when nothing was compacted
  return compacted_.contains(SlotKey(tenant, profile_id, block_id));
}

absl::StatusOr<v1::CompactedSlots> VersionStore::Slots(const std::string& tenant,
                                                       uint64_t profile_id,
                                                       const std::string& block_id) {
  if (!IsCompacted(tenant, profile_id, block_id)) {
    return absl::NotFoundError("not a compacted block");
  }
  std::string value;
  rocksdb::Status st =
      db_->Get(rocksdb::ReadOptions(), SlotKey(tenant, profile_id, block_id), &value);
  if (st.IsNotFound()) return absl::NotFoundError("not a compacted block");
  if (!st.ok()) return RocksToStatus(st, "compaction versions: read slots");
  v1::CompactedSlots slots;
  if (!slots.ParseFromString(value)) {
    return absl::DataLossError("compaction versions: a slot record does not parse");
  }
  return slots;
}

}  // namespace kvtier::daemon
