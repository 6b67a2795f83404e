#include "storage/catalog/catalog.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rocksdb/cache.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/options.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"
#include "rocksdb/write_buffer_manager.h"
#include "storage/catalog/record_format.h"
#include "storage/catalog/rocksdb_status.h"
#include "storage/common/client_text.h"
#include "storage/common/random_id.h"
#include "storage/common/status_macros.h"

namespace kvtier {

namespace fmt = catalog_format;

namespace {

constexpr char kBlocksFamily[] = "blocks";
constexpr char kProfilesFamily[] = "profiles";
// Written by no version that serves today; an older catalog's is dropped
// at open (OpenDb).
constexpr char kRetiredContextsFamily[] = "contexts";
constexpr char kVersionsFamily[] = "versions";

absl::Status CheckOption(absl::string_view name, uint64_t value, uint64_t min, uint64_t max) {
  if (value < min || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("catalog option ", name, " must be in ", min, "..", max, ", got ", value));
  }
  return absl::OkStatus();
}

absl::Status ValidateOptions(const CatalogOptions& o) {
  constexpr uint64_t kMiB = 1 << 20;
  constexpr uint64_t kGiB = uint64_t{1} << 30;
  KVTIER_RETURN_IF_ERROR(CheckOption("block_cache_bytes", o.block_cache_bytes, kMiB, 64 * kGiB));
  KVTIER_RETURN_IF_ERROR(CheckOption("memtable_bytes", o.memtable_bytes, kMiB, 4 * kGiB));
  KVTIER_RETURN_IF_ERROR(CheckOption("max_memtables", o.max_memtables, 2, 8));
  KVTIER_RETURN_IF_ERROR(
      CheckOption("memtable_total_bytes", o.memtable_total_bytes, o.memtable_bytes, 64 * kGiB));
  KVTIER_RETURN_IF_ERROR(CheckOption("max_wal_bytes", o.max_wal_bytes, kMiB, 64 * kGiB));
  KVTIER_RETURN_IF_ERROR(CheckOption("max_open_files", o.max_open_files, 64, 65536));
  KVTIER_RETURN_IF_ERROR(CheckOption("background_jobs", o.background_jobs, 1, 16));
  KVTIER_RETURN_IF_ERROR(
      CheckOption("info_log_file_bytes", o.info_log_file_bytes, 64 * 1024, kGiB));
  KVTIER_RETURN_IF_ERROR(CheckOption("info_log_files_kept", o.info_log_files_kept, 1, 100));
  return absl::OkStatus();
}

// Every RocksDB knob that affects memory, files or durability is set here
// explicitly rather than inherited from defaults.
rocksdb::Options MakeDbOptions(const CatalogOptions& o) {
  rocksdb::Options db;
  db.create_if_missing = o.create_if_missing;
  db.create_missing_column_families = true;
  db.paranoid_checks = true;
  db.wal_recovery_mode = rocksdb::WALRecoveryMode::kPointInTimeRecovery;
  db.max_open_files = static_cast<int>(o.max_open_files);
  db.max_background_jobs = static_cast<int>(o.background_jobs);
  db.max_total_wal_size = o.max_wal_bytes;
  db.write_buffer_manager = std::make_shared<rocksdb::WriteBufferManager>(o.memtable_total_bytes);
  db.max_log_file_size = o.info_log_file_bytes;
  db.keep_log_file_num = o.info_log_files_kept;
  db.max_manifest_file_size = 64 << 20;
  if (o.rocksdb_env != nullptr) db.env = o.rocksdb_env;
  return db;
}

rocksdb::ColumnFamilyOptions MakeFamilyOptions(
    const CatalogOptions& o, const std::shared_ptr<rocksdb::TableFactory>& table) {
  rocksdb::ColumnFamilyOptions cf;
  cf.write_buffer_size = o.memtable_bytes;
  cf.max_write_buffer_number = static_cast<int>(o.max_memtables);
  cf.min_write_buffer_number_to_merge = 1;
  // Summaries are float vectors and barely compress; keep CPU for serving.
  cf.compression = rocksdb::kNoCompression;
  cf.bottommost_compression = rocksdb::kNoCompression;
  cf.table_factory = table;
  return cf;
}

std::shared_ptr<rocksdb::TableFactory> MakeTableFactory(const CatalogOptions& o) {
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = rocksdb::NewLRUCache(o.block_cache_bytes);
  // Index and filter blocks live in (and are bounded by) the block cache,
  // so memory does not grow with the number of blocks stored.
  table.cache_index_and_filter_blocks = true;
  table.cache_index_and_filter_blocks_with_high_priority = true;
  table.pin_l0_filter_and_index_blocks_in_cache = true;
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  table.checksum = rocksdb::kXXH3;
  table.block_size = 16 * 1024;
  return std::shared_ptr<rocksdb::TableFactory>(rocksdb::NewBlockBasedTableFactory(table));
}

}  // namespace

struct Catalog::Handles {
  // All open families, including ones a newer version may have added.
  std::vector<rocksdb::ColumnFamilyHandle*> all;
  rocksdb::ColumnFamilyHandle* meta = nullptr;
  rocksdb::ColumnFamilyHandle* blocks = nullptr;
  rocksdb::ColumnFamilyHandle* profiles = nullptr;
  rocksdb::ColumnFamilyHandle* versions = nullptr;
};

// ---- CatalogBatch -----------------------------------------------------------

absl::Status CatalogBatch::Add(Family family, bool is_delete, std::string key, std::string value) {
  const size_t bytes = key.size() + value.size();
  if (ops_.size() >= kMaxBatchOps || bytes > kMaxBatchBytes - bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("catalog batch is full (", kMaxBatchOps,
                                                   " writes or ", kMaxBatchBytes, " bytes)"));
  }
  bytes_ += bytes;
  ops_.push_back(Op{family, is_delete, std::move(key), std::move(value)});
  return absl::OkStatus();
}

absl::Status CatalogBatch::PutBlock(const BlockKey& key, const BlockRecord& record) {
  KVTIER_RETURN_IF_ERROR(ValidateBlockKey(key));
  KVTIER_RETURN_IF_ERROR(ValidateBlockRecord(record));
  KVTIER_RETURN_IF_ERROR(
      Add(Family::kBlocks, false, fmt::EncodeBlockKey(key), fmt::EncodeBlockRecord(record)));
  if (record.durable) sync_ = true;
  return absl::OkStatus();
}

absl::Status CatalogBatch::DeleteBlock(const BlockKey& key) {
  KVTIER_RETURN_IF_ERROR(ValidateBlockKey(key));
  return Add(Family::kBlocks, true, fmt::EncodeBlockKey(key), "");
}

absl::Status CatalogBatch::PutContextVersion(absl::string_view tenant, uint64_t profile_id,
                                             const ContextVersionRecord& record) {
  KVTIER_RETURN_IF_ERROR(ValidateBlockKey(BlockKey{std::string(tenant), profile_id, "v"}));
  KVTIER_RETURN_IF_ERROR(ValidateContextVersionRecord(record));
  KVTIER_RETURN_IF_ERROR(
      Add(Family::kVersions, false,
          fmt::EncodeContextVersionKey(fmt::ContextVersionKey{std::string(tenant), profile_id,
                                                              record.context_key, record.version}),
          fmt::EncodeContextVersionRecord(record)));
  sync_ = true;
  return absl::OkStatus();
}

absl::Status CatalogBatch::PutCompactedSlots(const BlockKey& key,
                                             const CompactedSlotsRecord& record) {
  KVTIER_RETURN_IF_ERROR(ValidateBlockKey(key));
  KVTIER_RETURN_IF_ERROR(ValidateCompactedSlotsRecord(record));
  KVTIER_RETURN_IF_ERROR(Add(Family::kVersions, false, fmt::EncodeCompactedSlotsKey(key),
                             fmt::EncodeCompactedSlotsRecord(record)));
  sync_ = true;
  return absl::OkStatus();
}

absl::Status CatalogBatch::DeleteCompactedSlots(const BlockKey& key) {
  KVTIER_RETURN_IF_ERROR(ValidateBlockKey(key));
  KVTIER_RETURN_IF_ERROR(Add(Family::kVersions, true, fmt::EncodeCompactedSlotsKey(key), ""));
  sync_ = true;
  return absl::OkStatus();
}

// ---- Catalog: open and close -------------------------------------------------

absl::Status Catalog::OpenDb(const std::string& dir, const CatalogOptions& options,
                             std::unique_ptr<rocksdb::DB>* db, std::unique_ptr<Handles>* out) {
  const rocksdb::Options db_options = MakeDbOptions(options);
  const rocksdb::ColumnFamilyOptions family_options =
      MakeFamilyOptions(options, MakeTableFactory(options));

  // An existing DB must be opened with every family it has.
  std::vector<std::string> names;
  rocksdb::Status listed = rocksdb::DB::ListColumnFamilies(db_options, dir, &names);
  if (!listed.ok()) names.clear();  // no DB yet (Open reports real problems)
  for (const char* wanted : {rocksdb::kDefaultColumnFamilyName.c_str(), kBlocksFamily,
                             kProfilesFamily, kVersionsFamily}) {
    if (std::find(names.begin(), names.end(), wanted) == names.end()) names.push_back(wanted);
  }
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const std::string& name : names) descriptors.emplace_back(name, family_options);

  auto handles = std::make_unique<Handles>();
  rocksdb::DB* raw_db = nullptr;
  KVTIER_RETURN_IF_ERROR(RocksToStatus(
      rocksdb::DB::Open(rocksdb::DBOptions(db_options), dir, descriptors, &handles->all, &raw_db),
      absl::StrCat("open catalog ", dir)));
  db->reset(raw_db);
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == rocksdb::kDefaultColumnFamilyName) handles->meta = handles->all[i];
    if (names[i] == kBlocksFamily) handles->blocks = handles->all[i];
    if (names[i] == kProfilesFamily) handles->profiles = handles->all[i];
    if (names[i] == kVersionsFamily) handles->versions = handles->all[i];
  }
  // The retired contexts family goes (its records described nothing the
  // daemon reads).
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] != kRetiredContextsFamily) continue;
    rocksdb::ColumnFamilyHandle* retired = handles->all[i];
    KVTIER_RETURN_IF_ERROR(RocksToStatus(
        (*db)->DropColumnFamily(retired),
        absl::StrCat("drop the retired family '", kRetiredContextsFamily, "' of ", dir)));
    (*db)->DestroyColumnFamilyHandle(retired).PermitUncheckedError();
    handles->all.erase(handles->all.begin() + static_cast<std::ptrdiff_t>(i));
    break;
  }
  *out = std::move(handles);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Catalog>> Catalog::Open(const std::string& dir,
                                                       const CatalogOptions& options) {
  KVTIER_RETURN_IF_ERROR(ValidateOptions(options));
  std::unique_ptr<rocksdb::DB> db;
  std::unique_ptr<Handles> handles;
  KVTIER_RETURN_IF_ERROR(OpenDb(dir, options, &db, &handles));
  std::unique_ptr<Catalog> catalog(new Catalog(std::move(db), std::move(handles)));
  KVTIER_RETURN_IF_ERROR(catalog->CheckFormatVersion());
  return catalog;
}

Catalog::Catalog(std::unique_ptr<rocksdb::DB> db, std::unique_ptr<Handles> handles)
    : db_(std::move(db)), handles_(std::move(handles)) {}

Catalog::~Catalog() {
  absl::MutexLock lock(&db_mu_);
  for (rocksdb::ColumnFamilyHandle* h : handles_->all) {
    db_->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  }
  // Close flushes nothing it would not recover from the WAL; an error here
  // has no one to report to.
  db_->Close().PermitUncheckedError();
}

absl::Status Catalog::CheckFormatVersion() {
  auto stored = GetRaw(&Handles::meta, fmt::kFormatVersionKey, "format version");
  if (absl::IsNotFound(stored.status())) {
    rocksdb::WriteOptions sync;
    sync.sync = true;
    return Commit(
        sync,
        [](const Handles& handles, rocksdb::WriteBatch* wb) {
          return RocksToStatus(wb->Put(handles.meta, fmt::kFormatVersionKey,
                                       fmt::EncodeU32(fmt::kCatalogFormatVersion)),
                               "build format version batch");
        },
        "write catalog format version");
  }
  if (!stored.ok()) return stored.status();
  KVTIER_ASSIGN_OR_RETURN(uint32_t version, fmt::DecodeU32(*stored, "format version"));
  if (version == 1) return MigrateFromFormat1();
  if (version != fmt::kCatalogFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("catalog format version ", version, " is not ", fmt::kCatalogFormatVersion));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Catalog::GetRaw(Family family, const std::string& key,
                                            absl::string_view what) const {
  std::string value;
  rocksdb::Status s;
  {
    absl::ReaderMutexLock lock(&db_mu_);
    s = db_->Get(rocksdb::ReadOptions(), handles_.get()->*family, key, &value);
  }
  if (s.IsNotFound()) return absl::NotFoundError(absl::StrCat(what, " not found"));
  KVTIER_RETURN_IF_ERROR(RocksToStatus(s, absl::StrCat("read ", what)));
  return value;
}

// ---- Blocks ------------------------------------------------------------------

absl::Status Catalog::PutBlock(const BlockKey& key, const BlockRecord& record) {
  CatalogBatch batch;
  KVTIER_RETURN_IF_ERROR(batch.PutBlock(key, record));
  return Write(batch);
}

absl::StatusOr<BlockRecord> Catalog::GetBlock(const BlockKey& key) const {
  KVTIER_RETURN_IF_ERROR(ValidateBlockKey(key));
  KVTIER_ASSIGN_OR_RETURN(std::string value,
                          GetRaw(&Handles::blocks, fmt::EncodeBlockKey(key), "block"));
  return fmt::DecodeBlockRecord(value);
}

absl::Status Catalog::DeleteBlock(const BlockKey& key, bool sync) {
  CatalogBatch batch;
  KVTIER_RETURN_IF_ERROR(batch.DeleteBlock(key));
  if (sync) batch.RequireSync();
  return Write(batch);
}

absl::Status Catalog::Write(const CatalogBatch& batch) {
  if (batch.ops_.empty()) return absl::OkStatus();
  rocksdb::WriteOptions write_options;
  write_options.sync = batch.sync_;
  return Commit(
      write_options,
      [&](const Handles& handles, rocksdb::WriteBatch* wb) {
        for (const CatalogBatch::Op& op : batch.ops_) {
          rocksdb::ColumnFamilyHandle* family =
              op.family == CatalogBatch::Family::kBlocks ? handles.blocks : handles.versions;
          rocksdb::Status s =
              op.is_delete ? wb->Delete(family, op.key) : wb->Put(family, op.key, op.value);
          KVTIER_RETURN_IF_ERROR(RocksToStatus(s, "build catalog batch"));
        }
        return absl::OkStatus();
      },
      "write catalog batch");
}

absl::Status Catalog::Commit(const rocksdb::WriteOptions& options, const BatchBuilder& build,
                             absl::string_view what) {
  if (needs_recovery_.load(std::memory_order_acquire)) Recover();
  absl::Status st;
  // A synced write syncs the WAL, and with it every write that returned
  // before it started.
  const uint64_t before = writes_done();
  {
    absl::ReaderMutexLock lock(&db_mu_);
    rocksdb::WriteBatch wb;
    KVTIER_RETURN_IF_ERROR(build(*handles_, &wb));
    st = RocksToStatus(db_->Write(options, &wb), what);
  }
  if (!st.ok()) {
    Recover();
    return st;
  }
  if (options.sync) MarkSynced(before);
  writes_done_.fetch_add(1, std::memory_order_acq_rel);
  return st;
}

absl::Status Catalog::SyncWal() {
  const uint64_t before = writes_done();
  absl::Status st;
  {
    absl::ReaderMutexLock lock(&db_mu_);
    st = RocksToStatus(db_->SyncWAL(), "syncing the catalog WAL");
  }
  if (st.ok()) MarkSynced(before);
  return st;
}

void Catalog::MarkSynced(uint64_t through) {
  uint64_t seen = synced_through_.load(std::memory_order_acquire);
  while (seen < through &&
         !synced_through_.compare_exchange_weak(seen, through, std::memory_order_acq_rel)) {
  }
}

void Catalog::Recover() {
  absl::MutexLock lock(&db_mu_);
  ++recoveries_attempted_;
  rocksdb::Status s;
  {
    // Resume clears a recoverable background error, e.g. of a flush (OK
    // when there was none); the flush that follows retires the WAL the
    // failure may have left with a damaged tail. RocksDB refuses to resume
    // after a failed WAL write or sync (fatal to the DB instance: its WAL
    // may be inconsistent); then writes fail until the next Open.
    s = db_->Resume();
    if (s.ok()) {
      rocksdb::FlushOptions flush;
      flush.wait = true;
      flush.allow_write_stall = true;
      s = db_->Flush(flush, handles_->all);
    }
  }
  if (s.ok()) ++recoveries_succeeded_;
  // Failed: the next write tries again first.
  needs_recovery_.store(!s.ok(), std::memory_order_release);
}

uint64_t Catalog::recoveries_attempted() const {
  absl::ReaderMutexLock lock(&db_mu_);
  return recoveries_attempted_;
}

uint64_t Catalog::recoveries_succeeded() const {
  absl::ReaderMutexLock lock(&db_mu_);
  return recoveries_succeeded_;
}

absl::StatusOr<CatalogScanStats> Catalog::Scan(const std::string& lower, const std::string& upper,
                                               const BlockVisitor& visitor) const {
  rocksdb::ReadOptions read_options;
  read_options.fill_cache = false;  // a full scan must not evict the hot set
  read_options.verify_checksums = true;
  rocksdb::Slice upper_slice(upper);
  if (!upper.empty()) read_options.iterate_upper_bound = &upper_slice;
  absl::ReaderMutexLock lock(&db_mu_);  // the visitor must not write (see header)
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read_options, handles_->blocks));
  CatalogScanStats stats;
  for (it->Seek(lower); it->Valid(); it->Next()) {
    const rocksdb::Slice k = it->key();
    absl::StatusOr<BlockKey> key = fmt::DecodeBlockKey(absl::string_view(k.data(), k.size()));
    if (!key.ok()) {
      ++stats.corrupt_keys;
      continue;
    }
    const rocksdb::Slice v = it->value();
    absl::StatusOr<BlockRecord> record =
        fmt::DecodeBlockRecord(absl::string_view(v.data(), v.size()));
    ++stats.records;
    if (!record.ok()) ++stats.corrupt_records;
    if (!visitor(*key, record)) break;
  }
  KVTIER_RETURN_IF_ERROR(RocksToStatus(it->status(), "scan catalog blocks"));
  return stats;
}

absl::StatusOr<CatalogScanStats> Catalog::ForEachBlock(const BlockVisitor& visitor) const {
  return Scan("", "", visitor);
}

absl::StatusOr<CatalogScanStats> Catalog::ForEachBlockOf(absl::string_view tenant,
                                                         uint64_t profile_id,
                                                         const BlockVisitor& visitor) const {
  if (tenant.size() > kMaxTenantBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenant has more than ", kMaxTenantBytes, " bytes"));
  }
  const std::string prefix = fmt::BlockKeyPrefix(tenant, profile_id);
  return Scan(prefix, fmt::PrefixSuccessor(prefix), visitor);
}

// ---- Profiles ----------------------------------------------------------------

namespace {

absl::Status CheckScope(absl::string_view tenant) {
  if (tenant.size() > kMaxTenantBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenant has ", tenant.size(), " bytes; at most ", kMaxTenantBytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Catalog::ForEachEntry(
    Family family, absl::string_view prefix,
    const std::function<void(absl::string_view key, absl::string_view value)>& fn) const {
  const std::string lower(prefix);
  const std::string upper = fmt::PrefixSuccessor(prefix);
  rocksdb::ReadOptions read_options;
  read_options.fill_cache = false;
  rocksdb::Slice upper_slice(upper);
  if (!upper.empty()) read_options.iterate_upper_bound = &upper_slice;
  absl::ReaderMutexLock lock(&db_mu_);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read_options, handles_.get()->*family));
  for (it->Seek(lower); it->Valid(); it->Next()) {
    fn(absl::string_view(it->key().data(), it->key().size()),
       absl::string_view(it->value().data(), it->value().size()));
  }
  return RocksToStatus(it->status(), "scan catalog");
}

absl::StatusOr<bool> Catalog::ProfileIdTaken(uint64_t profile_id) const {
  bool taken = false;
  KVTIER_RETURN_IF_ERROR(ForEachEntry(&Handles::profiles, fmt::ProfileIdPrefix(profile_id),
                                      [&](absl::string_view, absl::string_view) { taken = true; }));
  return taken;
}

absl::StatusOr<RegisteredProfile> Catalog::RegisterProfile(const ModelProfile& profile) {
  KVTIER_RETURN_IF_ERROR(ValidateProfile(profile));
  const std::string& tenant = profile.owner;
  absl::MutexLock lock(&profile_mu_);
  absl::StatusOr<ModelProfile> existing = FindProfile(tenant, profile.name, profile.revision);
  if (existing.ok()) {
    if (!SameDefinition(*existing, profile)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "profile \"", ClientText(profile.name), "\" revision \"", ClientText(profile.revision),
          "\" is registered with a different shape (id ", existing->profile_id, ")"));
    }
    return RegisteredProfile{*std::move(existing), false};
  }
  if (!absl::IsNotFound(existing.status())) return existing.status();

  // Random ids: one tenant's ids say nothing of another's (how many
  // profiles exist, when they were registered).
  uint64_t id = 0;
  while (true) {
    id = RandomId();
    KVTIER_ASSIGN_OR_RETURN(bool taken, ProfileIdTaken(id));
    if (!taken) break;
  }
  RegisteredProfile registered{profile, true};
  registered.profile.profile_id = id;
  rocksdb::WriteOptions sync;
  sync.sync = true;
  KVTIER_RETURN_IF_ERROR(Commit(
      sync,
      [&](const Handles& handles, rocksdb::WriteBatch* wb) {
        rocksdb::Status s = wb->Put(handles.profiles, fmt::EncodeProfileKey(tenant, id),
                                    fmt::EncodeProfileRecord(registered.profile));
        if (s.ok()) {
          s = wb->Put(handles.profiles,
                      fmt::EncodeProfileNameKey(tenant, profile.name, profile.revision),
                      fmt::EncodeU64(id));
        }
        return RocksToStatus(s, "build profile batch");
      },
      "write profile"));
  return registered;
}

absl::StatusOr<ModelProfile> Catalog::GetProfile(absl::string_view tenant,
                                                 uint64_t profile_id) const {
  KVTIER_RETURN_IF_ERROR(CheckScope(tenant));
  KVTIER_ASSIGN_OR_RETURN(std::string value,
                          GetRaw(&Handles::profiles, fmt::EncodeProfileKey(tenant, profile_id),
                                 absl::StrCat("profile ", profile_id)));
  KVTIER_ASSIGN_OR_RETURN(ModelProfile profile, fmt::DecodeProfileRecord(value));
  if (profile.profile_id != profile_id || profile.owner != tenant) {
    return absl::DataLossError(absl::StrCat("corrupt catalog profile ", profile_id,
                                            ": record names id ", profile.profile_id,
                                            " of another tenant"));
  }
  return profile;
}

absl::StatusOr<ModelProfile> Catalog::FindProfile(absl::string_view tenant, absl::string_view name,
                                                  absl::string_view revision) const {
  KVTIER_RETURN_IF_ERROR(CheckScope(tenant));
  if (name.size() > kMaxProfileNameBytes || revision.size() > kMaxProfileRevisionBytes) {
    return absl::InvalidArgumentError("profile name or revision too long");
  }
  KVTIER_ASSIGN_OR_RETURN(
      std::string value,
      GetRaw(&Handles::profiles, fmt::EncodeProfileNameKey(tenant, name, revision),
             absl::StrCat("profile \"", ClientText(name), "\" revision \"", ClientText(revision),
                          "\"")));
  KVTIER_ASSIGN_OR_RETURN(uint64_t id, fmt::DecodeU64(value, "profile name index"));
  KVTIER_ASSIGN_OR_RETURN(ModelProfile profile, GetProfile(tenant, id));
  if (profile.name != name || profile.revision != revision) {
    return absl::DataLossError(absl::StrCat("corrupt catalog profile name index for \"",
                                            ClientText(name), "\": points at profile ", id));
  }
  return profile;
}

absl::StatusOr<std::vector<ModelProfile>> Catalog::ListProfiles() const {
  std::vector<ModelProfile> profiles;
  absl::Status decoded;
  KVTIER_RETURN_IF_ERROR(
      ForEachEntry(&Handles::profiles, std::string(1, fmt::kProfileKeyTag),
                   [&](absl::string_view key, absl::string_view value) {
                     if (!decoded.ok()) return;
                     absl::StatusOr<ModelProfile> p = fmt::DecodeProfileRecord(value);
                     if (p.ok() && fmt::EncodeProfileKey(p->owner, p->profile_id) != key) {
                       p = absl::DataLossError("corrupt catalog profile: key and record disagree");
                     }
                     if (!p.ok()) {
                       decoded = p.status();
                       return;
                     }
                     profiles.push_back(*std::move(p));
                   }));
  KVTIER_RETURN_IF_ERROR(decoded);
  return profiles;
}

// ---- Compaction versions -----------------------------------------------------

namespace {

std::string DescribeVersionKey(absl::string_view key) {
  absl::StatusOr<fmt::ContextVersionKey> k = fmt::DecodeContextVersionKey(key);
  if (!k.ok()) return absl::StrCat("key ", ClientHex(key));
  return absl::StrCat("tenant ", ClientText(k->tenant), " profile ", k->profile_id, " context_key ",
                      ClientHex(k->context_key), " version ", k->version);
}

std::string DescribeBlock(const BlockKey& key) {
  return absl::StrCat("tenant ", ClientText(key.tenant), " profile ", key.profile_id, " block ",
                      ClientHex(key.block_id));
}

}  // namespace

absl::StatusOr<std::vector<ContextVersionRecord>> Catalog::ContextVersions(
    absl::string_view tenant, uint64_t profile_id, absl::string_view context_key) const {
  const std::string prefix = context_key.empty()
                                 ? fmt::ContextVersionPrefix(tenant, profile_id)
                                 : fmt::ContextVersionPrefix(tenant, profile_id, context_key);
  std::vector<ContextVersionRecord> out;
  absl::Status bad;
  KVTIER_RETURN_IF_ERROR(
      ForEachEntry(&Handles::versions, prefix, [&](absl::string_view key, absl::string_view value) {
        if (!bad.ok()) return;
        absl::StatusOr<ContextVersionRecord> v = fmt::DecodeContextVersionRecord(value);
        if (!v.ok()) {
          bad = absl::DataLossError(
              absl::StrCat(v.status().message(), " (", DescribeVersionKey(key), ")"));
          return;
        }
        out.push_back(std::move(*v));
      }));
  KVTIER_RETURN_IF_ERROR(bad);
  return out;
}

absl::StatusOr<CompactedSlotsRecord> Catalog::GetCompactedSlots(const BlockKey& key) const {
  KVTIER_RETURN_IF_ERROR(ValidateBlockKey(key));
  KVTIER_ASSIGN_OR_RETURN(
      std::string value,
      GetRaw(&Handles::versions, fmt::EncodeCompactedSlotsKey(key), "compacted slots"));
  absl::StatusOr<CompactedSlotsRecord> slots = fmt::DecodeCompactedSlotsRecord(value);
  if (!slots.ok()) {
    return absl::DataLossError(
        absl::StrCat(slots.status().message(), " (", DescribeBlock(key), ")"));
  }
  return slots;
}

absl::Status Catalog::ForEachCompactedBlock(const std::function<void(const BlockKey&)>& fn) const {
  absl::Status bad;
  KVTIER_RETURN_IF_ERROR(
      ForEachEntry(&Handles::versions, std::string(1, fmt::kCompactedSlotsKeyTag),
                   [&](absl::string_view key, absl::string_view) {
                     if (!bad.ok()) return;
                     absl::StatusOr<BlockKey> k = fmt::DecodeCompactedSlotsKey(key);
                     if (!k.ok()) {
                       bad = absl::DataLossError(
                           absl::StrCat(k.status().message(), " (key ", ClientHex(key), ")"));
                       return;
                     }
                     fn(*k);
                   }));
  return bad;
}

// ---- Maintenance -------------------------------------------------------------

absl::Status Catalog::Flush() {
  rocksdb::FlushOptions flush;
  flush.wait = true;
  absl::ReaderMutexLock lock(&db_mu_);
  std::vector<rocksdb::ColumnFamilyHandle*> families = handles_->all;
  return RocksToStatus(db_->Flush(flush, families), "flush catalog");
}

absl::StatusOr<CatalogMemoryUsage> Catalog::MemoryUsage() const {
  CatalogMemoryUsage usage;
  uint64_t value = 0;
  absl::ReaderMutexLock lock(&db_mu_);
  for (rocksdb::ColumnFamilyHandle* h : handles_->all) {
    if (db_->GetIntProperty(h, rocksdb::DB::Properties::kCurSizeAllMemTables, &value)) {
      usage.memtable_bytes += value;
    }
    if (db_->GetIntProperty(h, rocksdb::DB::Properties::kEstimateTableReadersMem, &value)) {
      usage.table_readers_bytes += value;
    }
  }
  // One cache shared by every family: read it once.
  if (db_->GetIntProperty(handles_->blocks, rocksdb::DB::Properties::kBlockCacheUsage, &value)) {
    usage.block_cache_bytes = value;
  }
  if (db_->GetIntProperty(handles_->blocks, rocksdb::DB::Properties::kEstimateNumKeys, &value)) {
    usage.estimated_blocks = value;
  }
  return usage;
}

// ---- Format 1 -> 2: profiles per tenant ---------------------------------------
//
// Format 1 kept one namespace of profiles for every tenant: a name +
// revision had one definition, ids were 1, 2, 3, ..., and any tenant could
// store blocks under any id. Format 2 gives each profile to one tenant.
// Block keys already carry (tenant, profile_id) and stay as they are: each
// format-1 profile becomes, under the same id, a profile of every tenant
// that used it: the tenant that registered it (its owner), and every
// tenant with blocks under its id. A profile without
// an owner (written before tenants existed) and unused goes to the tenant
// "". Everything is written in one synced batch with the new format
// version, so a crash leaves the catalog wholly in one format.

absl::Status Catalog::MigrateFromFormat1() {
  std::vector<ModelProfile> legacy;
  std::vector<std::string> legacy_keys;
  absl::Status decoded;
  KVTIER_RETURN_IF_ERROR(
      ForEachEntry(&Handles::profiles, std::string(1, fmt::kLegacyProfileIdKeyTag),
                   [&](absl::string_view key, absl::string_view value) {
                     legacy_keys.emplace_back(key);
                     absl::StatusOr<ModelProfile> p = fmt::DecodeProfileRecord(value);
                     if (!p.ok()) {
                       decoded.Update(p.status());
                       return;
                     }
                     legacy.push_back(*std::move(p));
                   }));
  if (!decoded.ok()) {
    return absl::Status(decoded.code(),
                        absl::StrCat("migrating the catalog to format 2: ", decoded.message()));
  }
  KVTIER_RETURN_IF_ERROR(ForEachEntry(
      &Handles::profiles, std::string(1, fmt::kLegacyProfileNameKeyTag),
      [&](absl::string_view key, absl::string_view) { legacy_keys.emplace_back(key); }));

  // Who used each profile: the tenants of block keys under its id.
  std::map<uint64_t, std::set<std::string>> users;
  for (const ModelProfile& p : legacy) {
    users[p.profile_id];
    if (!p.owner.empty()) users[p.profile_id].insert(p.owner);
  }
  KVTIER_RETURN_IF_ERROR(
      ForEachEntry(&Handles::blocks, "", [&](absl::string_view key, absl::string_view) {
        absl::StatusOr<BlockKey> k = fmt::DecodeBlockKey(key);
        if (!k.ok()) return;  // dropped by the store's reconciliation at open
        auto it = users.find(k->profile_id);
        if (it != users.end()) it->second.insert(std::move(k->tenant));
      }));

  rocksdb::WriteOptions sync;
  sync.sync = true;
  return Commit(
      sync,
      [&](const Handles& handles, rocksdb::WriteBatch* wb) {
        rocksdb::Status s;
        for (const ModelProfile& p : legacy) {
          std::set<std::string> tenants = users[p.profile_id];
          if (tenants.empty()) tenants.insert(p.owner);
          for (const std::string& tenant : tenants) {
            if (tenant.size() > kMaxTenantBytes) continue;  // no key could name it
            ModelProfile theirs = p;
            theirs.owner = tenant;
            if (s.ok()) {
              s = wb->Put(handles.profiles, fmt::EncodeProfileKey(tenant, p.profile_id),
                          fmt::EncodeProfileRecord(theirs));
            }
            if (s.ok()) {
              s = wb->Put(handles.profiles, fmt::EncodeProfileNameKey(tenant, p.name, p.revision),
                          fmt::EncodeU64(p.profile_id));
            }
          }
        }
        for (const std::string& key : legacy_keys) {
          if (s.ok()) s = wb->Delete(handles.profiles, key);
        }
        if (s.ok()) s = wb->Delete(handles.meta, fmt::kLegacyNextProfileIdKey);
        if (s.ok()) {
          s = wb->Put(handles.meta, fmt::kFormatVersionKey,
                      fmt::EncodeU32(fmt::kCatalogFormatVersion));
        }
        return RocksToStatus(s, "build the catalog's format 2 migration");
      },
      "migrate the catalog to format 2");
}

}  // namespace kvtier
