// Catalog: the durable metadata store (RocksDB). It keeps, per tenant +
// profile, each block's size, checksum, NVMe location, flags, timestamps
// and v_b summary; every tenant's model profiles; and the compactor's
// context versions and compacted-block slots. (Open contexts are not
// stored: a restart forgets them, docs/ARCHITECTURE.md; a "contexts"
// family left by an older catalog is dropped at Open.) Byte layouts:
// record_format.h.
//
// Profiles belong to one tenant each (ModelProfile::owner): names are per
// tenant, and a tenant reads only its own profiles by id. Ids are random
// (RandomId) and unique across tenants, except those a format-1 catalog
// gave out: the migration at Open made each of those a profile, under the
// same id, of every tenant that used it (catalog.cc, MigrateFromFormat1).
//
// The catalog stores facts; it does not decide them. The block store keeps
// its rules: a put of different bytes under an existing id is refused by
// the store (PutBlock overwrites), block sizes match the profile, and
// records are trusted after a restart only if durable.
//
// Durability: PutBlock of a durable record, and any batch that holds one,
// is written with sync=true (the tier's data was synced before). DeleteBlock
// syncs by default: a block's NVMe extent may be reused only after its
// deletion is durable, or a crash would resurrect a record pointing at
// someone else's bytes. Other writes go to the WAL without fsync.
//
// Write errors: the write that failed reports its error. Then the catalog
// asks RocksDB to resume (DB::Resume) and flushes every memtable, so a
// recoverable error (e.g. a background flush that ran out of space) stops
// writes only until the fault is gone. Writes wait while that runs; if it
// fails, the next write tries again first. RocksDB (paranoid_checks)
// refuses to resume after a failed WAL write or sync, whose WAL may be
// inconsistent: then every write fails until the catalog is opened again
// (the daemon restarted), which replays the WAL up to the damage.
//
// Memory: bounded by options, not by the number of blocks. Data, index and
// filter blocks share one LRU block cache (block_cache_bytes); memtables of
// all column families together stay under memtable_total_bytes. Roughly
// block_cache_bytes + memtable_total_bytes + a few MiB of fixed overhead.
//
// Thread safety: a Catalog is safe for concurrent use from any number of
// threads without external synchronization. Iteration sees a consistent
// snapshot taken when it starts.
#ifndef KVTIER_STORAGE_CATALOG_CATALOG_H_
#define KVTIER_STORAGE_CATALOG_CATALOG_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "storage/catalog/records.h"

namespace rocksdb {
class ColumnFamilyHandle;
class DB;
class Env;
class WriteBatch;
struct WriteOptions;
}  // namespace rocksdb

namespace kvtier {

struct CatalogOptions {
  bool create_if_missing = true;
  uint64_t block_cache_bytes = 32 << 20;     // data + index + filter blocks
  uint64_t memtable_bytes = 8 << 20;         // one memtable of one family
  uint32_t max_memtables = 2;                // per family, 2..8
  uint64_t memtable_total_bytes = 48 << 20;  // all families together
  uint64_t max_wal_bytes = 64 << 20;         // then memtables are flushed
  uint32_t max_open_files = 512;             // SST file handles, 64..65536
  uint32_t background_jobs = 2;              // flushes + compactions, 1..16
  uint64_t info_log_file_bytes = 4 << 20;    // RocksDB's LOG, rolled at this
  uint32_t info_log_files_kept = 4;
  // Filesystem for tests that inject faults; must outlive the catalog.
  // nullptr: rocksdb::Env::Default().
  rocksdb::Env* rocksdb_env = nullptr;
};

// Limits of one CatalogBatch; exceeding them is INVALID_ARGUMENT.
inline constexpr size_t kMaxBatchOps = 65536;
inline constexpr size_t kMaxBatchBytes = 64 << 20;

// Several writes applied atomically by Catalog::Write. Each call validates
// and encodes its input at once (INVALID_ARGUMENT naming the field; the
// batch is unchanged on error). Not thread-safe; build it on one thread.
class CatalogBatch {
 public:
  absl::Status PutBlock(const BlockKey& key, const BlockRecord& record);
  absl::Status DeleteBlock(const BlockKey& key);
  // Compaction versions (family "versions"). Each makes Write sync: the
  // compactor writes them after the blocks they describe are durable.
  absl::Status PutContextVersion(absl::string_view tenant, uint64_t profile_id,
                                 const ContextVersionRecord& record);
  absl::Status PutCompactedSlots(const BlockKey& key, const CompactedSlotsRecord& record);
  absl::Status DeleteCompactedSlots(const BlockKey& key);

  // Make Write fsync the WAL even if no durable record is in the batch
  // (e.g. for deletes whose NVMe extents are about to be reused).
  void RequireSync() { sync_ = true; }
  // True when Write will sync: RequireSync() was called or a durable
  // block record was put.
  bool sync() const { return sync_; }
  size_t size() const { return ops_.size(); }

 private:
  friend class Catalog;
  enum class Family : uint8_t { kBlocks, kVersions };
  struct Op {
    Family family;
    bool is_delete;
    std::string key;
    std::string value;
  };
  absl::Status Add(Family family, bool is_delete, std::string key, std::string value);

  std::vector<Op> ops_;
  size_t bytes_ = 0;
  bool sync_ = false;
};

// What a scan visited.
struct CatalogScanStats {
  uint64_t records = 0;          // entries passed to the visitor
  uint64_t corrupt_records = 0;  // of those, with a DATA_LOSS record
  uint64_t corrupt_keys = 0;     // entries skipped: their key did not decode
};

// Approximate RocksDB memory, from its properties.
struct CatalogMemoryUsage {
  uint64_t memtable_bytes = 0;
  uint64_t block_cache_bytes = 0;  // in use, incl. index and filter blocks
  uint64_t table_readers_bytes = 0;
  uint64_t estimated_blocks = 0;  // RocksDB's key estimate for "blocks"
};

class Catalog {
 public:
  // Opens (or, with create_if_missing, creates) the catalog in dir. A
  // catalog of format 1 is migrated to the current format first (one
  // synced write: a crash leaves it in one format or the other).
  // FAILED_PRECONDITION if dir holds a catalog of another format version;
  // INVALID_ARGUMENT naming the option for bad options; RocksDB errors
  // converted by RocksToStatus (e.g. the LOCK of a running daemon).
  static absl::StatusOr<std::unique_ptr<Catalog>> Open(const std::string& dir,
                                                       const CatalogOptions& options);

  Catalog(const Catalog&) = delete;
  Catalog& operator=(const Catalog&) = delete;
  ~Catalog();

  // ---- Blocks -----------------------------------------------------------
  // Creates or overwrites the record. Synced iff record.durable.
  absl::Status PutBlock(const BlockKey& key, const BlockRecord& record);
  // NOT_FOUND if absent; DATA_LOSS if the stored record does not decode.
  absl::StatusOr<BlockRecord> GetBlock(const BlockKey& key) const;
  // Deleting an absent block succeeds. Unsynced (sync = false), the
  // removal is in the WAL when this returns (it survives a process crash)
  // but a power loss may undo it until a later synced write or SyncWal.
  absl::Status DeleteBlock(const BlockKey& key, bool sync = true);
  // Applies every write of batch atomically (all or none).
  absl::Status Write(const CatalogBatch& batch);

  // Called once per entry in key order; return false to stop early. A
  // record that does not decode is passed as its DATA_LOSS status so the
  // caller can quarantine or delete it by key. Do not call Write from the
  // visitor of a long scan; collect and write afterwards.
  using BlockVisitor =
      std::function<bool(const BlockKey& key, const absl::StatusOr<BlockRecord>& record)>;
  // Every block of every tenant and profile (restart reconciliation, ls,
  // verify). Does not fill the block cache.
  absl::StatusOr<CatalogScanStats> ForEachBlock(const BlockVisitor& visitor) const;
  // The blocks of one (tenant, profile_id).
  absl::StatusOr<CatalogScanStats> ForEachBlockOf(absl::string_view tenant, uint64_t profile_id,
                                                  const BlockVisitor& visitor) const;

  // ---- Profiles ---------------------------------------------------------
  // Registers profile for the tenant profile.owner (profile_id ignored).
  // The tenant's profile of the same name + revision with the same
  // definition: that one, created = false; with another shape:
  // ALREADY_EXISTS. Other tenants' profiles play no part. Otherwise a new
  // random id, never 0 and held by no tenant's profile, is assigned and
  // synced. Ids are stable across restarts.
  absl::StatusOr<RegisteredProfile> RegisterProfile(const ModelProfile& profile);
  // The tenant's profile; NOT_FOUND when the tenant has none under that id
  // (whether or not another tenant has).
  absl::StatusOr<ModelProfile> GetProfile(absl::string_view tenant, uint64_t profile_id) const;
  absl::StatusOr<ModelProfile> FindProfile(absl::string_view tenant, absl::string_view name,
                                           absl::string_view revision) const;
  // Every tenant's profiles, by id then tenant.
  absl::StatusOr<std::vector<ModelProfile>> ListProfiles() const;

  // ---- Compaction versions ----------------------------------------------
  // Written with CatalogBatch::PutContextVersion / PutCompactedSlots /
  // DeleteCompactedSlots. Reads see a consistent snapshot.
  //
  // The versions of (tenant, profile_id), by context_key then version;
  // with a non-empty context_key, only that context's. DATA_LOSS naming
  // the record's key (tenant, profile, context_key, version) when one does
  // not decode.
  absl::StatusOr<std::vector<ContextVersionRecord>> ContextVersions(
      absl::string_view tenant, uint64_t profile_id, absl::string_view context_key) const;
  // NOT_FOUND if absent; DATA_LOSS naming the block when it does not decode.
  absl::StatusOr<CompactedSlotsRecord> GetCompactedSlots(const BlockKey& key) const;
  // Calls fn with the key of every block that has slots, in key order.
  // DATA_LOSS for a key that does not decode.
  absl::Status ForEachCompactedBlock(const std::function<void(const BlockKey&)>& fn) const;

  // ---- Write ordering ---------------------------------------------------
  // Successful writes so far (monotonic). Read after a write returned, it
  // is a ticket for that write: the write is synced once
  // synced_through() >= the ticket.
  uint64_t writes_done() const { return writes_done_.load(std::memory_order_acquire); }
  // Every write counted in writes_done() up to this value is on disk (a
  // synced write, or SyncWal, completed after it).
  uint64_t synced_through() const { return synced_through_.load(std::memory_order_acquire); }
  // Syncs the WAL: every write that returned before the call is synced
  // afterwards. Errors converted by RocksToStatus.
  absl::Status SyncWal();

  // ---- Maintenance ------------------------------------------------------
  // Writes all memtables to SST files and waits.
  absl::Status Flush();
  absl::StatusOr<CatalogMemoryUsage> MemoryUsage() const;
  // Recoveries after write errors: attempted, and succeeded.
  uint64_t recoveries_attempted() const;
  uint64_t recoveries_succeeded() const;

 private:
  struct Handles;
  using Family = rocksdb::ColumnFamilyHandle* Handles::*;
  // Fills a batch from the handles (called under db_mu_).
  using BatchBuilder = std::function<absl::Status(const Handles&, rocksdb::WriteBatch*)>;

  Catalog(std::unique_ptr<rocksdb::DB> db, std::unique_ptr<Handles> handles);
  static absl::Status OpenDb(const std::string& dir, const CatalogOptions& options,
                             std::unique_ptr<rocksdb::DB>* db, std::unique_ptr<Handles>* handles);
  absl::Status CheckFormatVersion();
  // Rewrites a format-1 catalog's profiles as format 2 and records the
  // new format version, in one synced batch.
  absl::Status MigrateFromFormat1();
  // Calls fn(key, value) for every entry of family whose key starts with
  // prefix, in key order, under a shared db_mu_ (fn must not write).
  absl::Status ForEachEntry(
      Family family, absl::string_view prefix,
      const std::function<void(absl::string_view key, absl::string_view value)>& fn) const;
  absl::StatusOr<CatalogScanStats> Scan(const std::string& lower, const std::string& upper,
                                        const BlockVisitor& visitor) const;
  absl::StatusOr<std::string> GetRaw(Family family, const std::string& key,
                                     absl::string_view what) const;
  // Every write goes through here: under db_mu_ (shared), and on an error,
  // Recover.
  absl::Status Commit(const rocksdb::WriteOptions& options, const BatchBuilder& build,
                      absl::string_view what);
  // DB::Resume and a flush of every family, under db_mu_ (exclusive): no
  // write lands in a WAL after a damaged record.
  void Recover();

  // Shared by every read and write; exclusive while Recover runs. RocksDB
  // itself is thread-safe.
  mutable absl::Mutex db_mu_;
  std::unique_ptr<rocksdb::DB> db_ ABSL_GUARDED_BY(db_mu_);
  std::unique_ptr<Handles> handles_ ABSL_GUARDED_BY(db_mu_);
  uint64_t recoveries_attempted_ ABSL_GUARDED_BY(db_mu_) = 0;
  uint64_t recoveries_succeeded_ ABSL_GUARDED_BY(db_mu_) = 0;
  std::atomic<bool> needs_recovery_{false};  // the last Recover failed
  std::atomic<uint64_t> writes_done_{0};
  std::atomic<uint64_t> synced_through_{0};
  // Raises synced_through_ to at least `through`.
  void MarkSynced(uint64_t through);

  // Serialises RegisterProfile (read name, allocate id, write).
  absl::Mutex profile_mu_;
  // True when some tenant's profile has profile_id.
  absl::StatusOr<bool> ProfileIdTaken(uint64_t profile_id) const;
};

}  // namespace kvtier

#endif  // KVTIER_STORAGE_CATALOG_CATALOG_H_
