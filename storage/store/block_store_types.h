// Value types of the BlockStore interface (block_store.h): tenant limits
// and usage, put outcomes, locations, handles, staging slots and files,
// and statistics. Plain structs; no thread safety of their own.
#ifndef KVTIER_STORAGE_STORE_BLOCK_STORE_TYPES_H_
#define KVTIER_STORAGE_STORE_BLOCK_STORE_TYPES_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

#include "storage/catalog/records.h"
#include "storage/common/owned_fd.h"
#include "storage/tier.h"

namespace kvtier {

// Per-tenant limits; 0 = none beyond the tiers' capacities.
struct TenantLimits {
  uint64_t device_bytes = 0;    // its arena's size (multi-tenant mode)
  uint64_t pinned_bytes = 0;    // device bytes its leases pin at once
  uint64_t leases = 0;          // leases it holds at once
  uint64_t staging_bytes = 0;   // its staging file's size (multi-tenant mode)
  uint64_t staging_slots = 0;   // staging slots reserved at once
  uint64_t host_bytes = 0;      // its blocks' bytes in the host tier
  uint64_t nvme_bytes = 0;      // its blocks' bytes on NVMe
  uint64_t retained_bytes = 0;  // bytes of its blocks marked retained
  uint64_t profiles = 0;        // profiles it registered
};

struct TenantUsage {
  uint64_t arena_bytes = 0;  // its arena's size (0 before first use)
  uint64_t device_bytes = 0;
  uint64_t pinned_bytes = 0;
  uint64_t staging_slots = 0;
  uint64_t host_bytes = 0;
  uint64_t nvme_bytes = 0;
  uint64_t retained_bytes = 0;
  uint64_t profiles = 0;
  uint64_t leases = 0;
};

struct PutOutcome {
  TierId tier = TierId::kHost;  // fastest tier holding it after the put
  bool durable = false;
  bool existed = false;   // identical bytes were already stored
  bool retained = false;  // kept until deleted (never evicted)
};

struct BlockLocation {
  bool present = false;
  TierId tier = TierId::kNvme;  // fastest copy
  bool durable = false;
  bool pinned = false;
  bool retained = false;
  uint64_t size_bytes = 0;
};

// A block that failed its checksum, as ForEachQuarantined reports it.
struct QuarantinedBlock {
  BlockKey key;
  TierId tier = TierId::kNvme;  // where the bad copy was found
  std::string location;         // e.g. "nvme-003.dat @ 1048576", "host slot @ 8192"
  std::string reason;           // what failed; "found before the last restart" after one
  int64_t found_micros = 0;     // wall clock; 0 when found before the last restart
};

// A device-arena reference handed to clients.
struct DeviceHandle {
  uint64_t arena_id = 0;
  uint64_t offset_bytes = 0;
  uint64_t size_bytes = 0;
  uint64_t generation = 0;
};

// The promotion budget of one AcquireHandles call (the Select path):
// blocks not in the device arena are promoted host -> arena only while the
// bytes promoted by the call stay within limit_bytes; every later one is
// answered PromotionDeferredError (not pinned) for the caller to promote
// off its thread. Blocks already in the arena never count.
struct PromotionBudget {
  uint64_t limit_bytes = UINT64_MAX;
  uint64_t promoted_bytes = 0;  // out: promoted by the call
  uint64_t deferred = 0;        // out: blocks answered PromotionDeferredError
};

// How BlockStore::Put, PutPieces and PutFromStaging store a block (in the
// manner of RocksDB's WriteOptions). The default: a non-durable put, no
// checksum to compare, not retained.
struct PutOptions {
  // Acknowledge only once the NVMe copy and its catalog record are synced.
  bool durable = false;
  // != 0: the payload's XXH3-64 must equal it, else DATA_LOSS and nothing
  // is stored.
  uint64_t expected_xxh3 = 0;
  // The block is never evicted (only deleted); it counts against the
  // tenant's retained_bytes quota. Putting identical bytes again with
  // retain marks a stored block retained; a put without retain never
  // clears the mark.
  bool retain = false;
};

// How BlockStore::AcquireHandles makes blocks resident and pins them; see
// there for each field's full contract. The default: disk I/O allowed, no
// wants marked, no promotion budget, no lease being replaced.
struct PinOptions {
  // No disk I/O on the caller's thread: an NVMe-only block is answered
  // UNAVAILABLE and device room is made without demoting to disk.
  bool memory_only = false;
  // First marks the keys wanted (BlockStore::MarkWanted) in the same hold
  // of the store's lock.
  bool mark_wanted = false;
  // Host -> arena promotions stop past budget->limit_bytes (not owned;
  // null: no limit). Its out fields are updated by the call.
  PromotionBudget* budget = nullptr;
  // A lease of the tenant the caller releases right after the call (0:
  // none); while it is held the new lease may be one over the limit.
  uint64_t replaces_lease = 0;
};

// UNAVAILABLE with a payload that IsPromotionDeferred recognises: a block
// in host memory past the call's promotion budget of limit_bytes (its
// position in the call's answers says which).
absl::Status PromotionDeferredError(uint64_t limit_bytes);
bool IsPromotionDeferred(const absl::Status& status);

// A block's bytes lent for sending (BlockStore::View). Destroy it before
// the store; not thread-safe (one owner).
class BlockView {
 public:
  virtual ~BlockView() = default;
  virtual absl::Span<const uint8_t> bytes() const = 0;
};

// A staging slot for the zero-copy put path.
struct StagingSlot {
  uint64_t slot_id = 0;
  uint64_t offset_bytes = 0;
  uint64_t size_bytes = 0;
  uint64_t generation = 0;
};

// A descriptor of a tenant's staging file, for handing to that tenant.
struct StagingFile {
  OwnedFd fd;  // read-write; the file is sealed (fixed size)
  uint64_t size_bytes = 0;
};

struct TierUsage {
  TierId tier = TierId::kHost;
  std::string backend;
  std::string location;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t pinned_bytes = 0;
  uint64_t blocks = 0;
  // Part of used_bytes held by evicted blocks until their catalog record
  // removal is synced (NVMe only; freed at the next catalog sync).
  uint64_t releasing_bytes = 0;
  // Memory of this tier queued to be pre-faulted (BlockStoreOptions::
  // prefault), and of that, pre-faulted so far and given up after an
  // error (prefault_error says which).
  uint64_t prefault_target_bytes = 0;
  uint64_t prefaulted_bytes = 0;
  uint64_t prefault_failed_bytes = 0;
  std::string prefault_error;
};

// Called with a block's host-tier bytes when the store is about to let its
// last in-memory copy go (demoted to NVMe only, or given up when NVMe has
// no room): the remote tier's write-back publishes from here. Runs under
// the store's lock: it must not block or call the store; the bytes are
// valid only during the call.
using ReleaseListener = std::function<void(const BlockKey&, absl::Span<const uint8_t> bytes)>;

// A key summary computed while a put copies a block into its host slot
// (BlockStoreOptions::begin_summary). The put calls Advance after each
// chunk it copied and hashed, with the slot's bytes written so far (a
// growing prefix, same address each call), and Finish once with the whole
// payload; the result must equal BlockStoreOptions::summarize of the same
// bytes. One thread drives a stream; it is dropped after Finish.
class SummaryStream {
 public:
  virtual ~SummaryStream() = default;
  virtual void Advance(absl::Span<const uint8_t> written) = 0;
  virtual absl::StatusOr<std::string> Finish(absl::Span<const uint8_t> payload) = 0;
};

struct BlockStoreStats {
  TierUsage tiers[kNumTiers];
  uint64_t blocks = 0;
  uint64_t profiles = 0;
  uint64_t active_leases = 0;
  uint64_t quarantined_blocks = 0;
  // Checksum mismatches found, by the tier of the bad copy (TierId order).
  uint64_t checksum_failures[kNumTiers] = {0, 0, 0};
  uint64_t evicted_blocks = 0;  // blocks given up by the cache (not deletes)
  // Reads (Get, AcquireHandles) by the fastest tier that held the block
  // when it was asked for (TierId order); a read of a block not stored is a
  // miss.
  uint64_t reads_from[kNumTiers] = {0, 0, 0};
  uint64_t read_misses = 0;
  // Copies made into a tier from a slower one: device (host -> arena, for
  // handles) and host (NVMe -> host, for reads, handles and prefetch).
  uint64_t promotions[kNumTiers] = {0, 0, 0};
  // Last copies moved from the host tier to NVMe to make room.
  uint64_t demotions = 0;
  uint64_t retained_bytes = 0;  // all tenants
  uint64_t staging_slots = 0;
  // In-memory metadata per block (entry + index overhead), bytes.
  uint64_t metadata_bytes_per_block = 0;
  // Puts acknowledged before their summary (defer_summaries), all time, and
  // how many still wait for it now.
  uint64_t summaries_deferred = 0;
  uint64_t summaries_pending = 0;
  // Host-tier bytes lent to views now (BlockStore::View), and views, all
  // time, that were private copies because lending would have passed
  // max_view_bytes.
  uint64_t view_bytes = 0;
  uint64_t views_copied_over_cap = 0;
};

}  // namespace kvtier

#endif  // KVTIER_STORAGE_STORE_BLOCK_STORE_TYPES_H_
