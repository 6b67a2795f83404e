// VersionStore: the durable record of compacted contexts, in a RocksDB of
// its own (<data_dir>/compaction), beside the block catalog.
//
// Per (tenant, profile, context_key) it keeps every version as a
// v1::ContextVersion (version 0 = the original blocks, n = compacted), and
// per compacted block its v1::CompactedSlots. Keys:
//   'v' tenant_len(u16 BE) tenant profile_id(u64 BE) context_key version(u32 BE)
//   's' tenant_len(u16 BE) tenant profile_id(u64 BE) block_id
// RocksDB checks its block checksums on every read; every write is synced
// (records are written after the blocks they describe were stored durably).
// The ids of compacted blocks are also held in memory (IsCompacted) so
// reads of ordinary blocks never touch this database.
//
// Memory: a 8 MiB block cache, 4 MiB memtables, plus one hash-set entry per
// compacted block.
//
// Thread safety: safe for concurrent use; the caller serialises changes to
// one context (Compactor holds a lock per context key).
#ifndef KVTIER_DAEMON_COMPACTION_VERSION_STORE_H_
#define KVTIER_DAEMON_COMPACTION_VERSION_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kvtier/v1/kvtier.pb.h"

namespace rocksdb {
class DB;
}

namespace kvtier::daemon {

class VersionStore {
 public:
  // Opens or creates the database in dir; errors name the directory.
  static absl::StatusOr<std::unique_ptr<VersionStore>> Open(const std::string& dir);
  ~VersionStore();

  // Writes the versions (and the slots of their compacted blocks) in one
  // synced batch, replacing records with the same keys.
  struct SlotRecord {
    std::string block_id;
    v1::CompactedSlots slots;
  };
  absl::Status Put(const std::string& tenant, uint64_t profile_id,
                   const std::vector<v1::ContextVersion>& versions,
                   const std::vector<SlotRecord>& slots);
  // Every version of one context, by version; empty when none.
  absl::StatusOr<std::vector<v1::ContextVersion>> Versions(const std::string& tenant,
                                                           uint64_t profile_id,
                                                           const std::string& context_key);
  // Every version of every context of (tenant, profile), by key then version.
  absl::StatusOr<std::vector<v1::ContextVersion>> AllVersions(const std::string& tenant,
                                                              uint64_t profile_id);
  // Replaces a version's record with `record` (its dropped form) and
  // removes the slot records of block_ids, in one synced batch. Records are
  // never removed, so version numbers are never reused.
  absl::Status MarkDropped(const std::string& tenant, uint64_t profile_id,
                           const v1::ContextVersion& record,
                           const std::vector<std::string>& block_ids);
  // The slots of a compacted block; NOT_FOUND for any other block.
  absl::StatusOr<v1::CompactedSlots> Slots(const std::string& tenant, uint64_t profile_id,
                                           const std::string& block_id);
  bool IsCompacted(const std::string& tenant, uint64_t profile_id, const std::string& block_id);

 private:
  explicit VersionStore(std::unique_ptr<rocksdb::DB> db);
  absl::StatusOr<std::vector<v1::ContextVersion>> Scan(const std::string& prefix);

  std::unique_ptr<rocksdb::DB> db_;
  absl::Mutex mu_;
  absl::flat_hash_set<std::string> compacted_ ABSL_GUARDED_BY(mu_);  // slot keys
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_COMPACTION_VERSION_STORE_H_
