// VersionStore: the durable record of compacted contexts, kept in the block
// catalog's "versions" column family (storage/catalog/record_format.h has
// the byte layout: versioned, checksummed values).
//
// Per (tenant, profile, context_key) it keeps every version (version 0 =
// the original blocks, n = compacted), and per compacted block its slot
// data, as the catalog's records (ContextVersionRecord, CompactedSlotsRecord,
// storage/catalog/records.h): the compactor's domain types. Protobuf
// messages appear only at the RPC edge (daemon/convert.h) and in the
// migration of the older store below. Every write is
// synced (records are written after the blocks they describe were stored
// durably). The ids of compacted blocks are also held in memory
// (IsCompacted) so reads of ordinary blocks never touch the catalog.
//
// Older daemons kept these records in a RocksDB of their own
// (<data_dir>/compaction, values: serialized v1 messages). Open moves its
// records into the catalog (synced) and then removes it: renamed to
// <dir>.removing, which is deleted, so a crash at any point leaves either
// the old directory (migrated again: the same records) or nothing to do.
//
// Memory: one hash-set entry per compacted block.
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
#include "storage/catalog/records.h"

namespace kvtier {
class Catalog;
}

namespace kvtier::daemon {

class VersionStore {
 public:
  // Keeps its records in catalog, which must outlive the store. When
  // legacy_dir holds an older daemon's separate store, migrates it first
  // (see above); errors name the directory and, for a record that does not
  // parse (DATA_LOSS), its key.
  static absl::StatusOr<std::unique_ptr<VersionStore>> Open(Catalog* catalog,
                                                            const std::string& legacy_dir);

  // Writes the versions (and the slots of their compacted blocks) in one
  // synced batch, replacing records with the same keys.
  struct SlotRecord {
    std::string block_id;
    CompactedSlotsRecord slots;
  };
  absl::Status Put(const std::string& tenant, uint64_t profile_id,
                   const std::vector<ContextVersionRecord>& versions,
                   const std::vector<SlotRecord>& slots);
  // Every version of one context, by version; empty when none. DATA_LOSS
  // naming the key of a record that does not decode.
  absl::StatusOr<std::vector<ContextVersionRecord>> Versions(const std::string& tenant,
                                                             uint64_t profile_id,
                                                             const std::string& context_key);
  // Every version of every context of (tenant, profile), by key then version.
  absl::StatusOr<std::vector<ContextVersionRecord>> AllVersions(const std::string& tenant,
                                                                uint64_t profile_id);
  // Replaces a version's record with `record` (its dropped form) and
  // removes the slot records of block_ids, in one synced batch. Records are
  // never removed, so version numbers are never reused.
  absl::Status MarkDropped(const std::string& tenant, uint64_t profile_id,
                           const ContextVersionRecord& record,
                           const std::vector<std::string>& block_ids);
  // The slots of a compacted block; NOT_FOUND for any other block.
  absl::StatusOr<CompactedSlotsRecord> Slots(const std::string& tenant, uint64_t profile_id,
                                             const std::string& block_id);
  bool IsCompacted(const std::string& tenant, uint64_t profile_id, const std::string& block_id);

 private:
  explicit VersionStore(Catalog* catalog) : catalog_(catalog) {}

  Catalog* const catalog_;
  absl::Mutex mu_;
  // (tenant, profile_id, block_id) of every compacted block, as one string.
  absl::flat_hash_set<std::string> compacted_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_COMPACTION_VERSION_STORE_H_
