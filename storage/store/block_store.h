// BlockStore: content-addressed KV blocks across the device arena, host
// DRAM and NVMe, with a RocksDB catalog, leases and a placement policy.
//
// Model:
//   * A block is (tenant, profile_id, block_id) -> exactly
//     BlockSizeBytes(profile) bytes, with an XXH3-64 checksum taken at put.
//   * A block has a copy in one or more tiers. Put lands in host DRAM (and
//     on NVMe when the put is durable or write_through is set). Get promotes
//     NVMe -> host; handle requests promote to the device arena.
//   * A cache with explicit capacities. Making room in a tier gives up the
//     copy the placement policy picks (least recently used by default);
//     a copy that is the block's last one is first demoted to the next
//     tier (device -> host -> NVMe). The NVMe tier is the last local tier:
//     when it is full (or a tenant reaches its nvme_bytes quota) the
//     victim block is evicted: gone from every tier (Stats counts it); a
//     durable block's NVMe copy never goes alone. Host copies of non-durable
//     blocks that cannot be demoted because NVMe has no room are evicted
//     the same way. Never evicted: copies pinned by a lease, copies being
//     read or written, and blocks their writer marked retained (a per-put
//     flag, counted against the tenant's retained_bytes quota; a retained
//     block may move between tiers but never leaves the cache until
//     deleted). A put is refused only when nothing can be evicted:
//     RESOURCE_EXHAUSTED naming the tier and why (pinned, retained, in
//     use, or a quota).
//   * Durability: a block is durable once its NVMe copy was fdatasync'ed
//     AND its catalog record was written with sync. A durable block
//     survives a crash until it is evicted or deleted (retain it to keep
//     it for good). Open() reconciles catalog and tier files. An eviction
//     or delete removes the catalog record (synced) before the NVMe
//     extent is freed, so a crash never leaves a record pointing at
//     reused space; when that catalog write fails the operation fails and
//     the block stays.
//   * Integrity: every copy is checksum-verified (XXH3-64 taken at put)
//     whenever it is read: on Get from any tier, on every NVMe read, and
//     when it crosses a tier (demotion to host or NVMe, promotion to the
//     device arena). A mismatch quarantines the block: every copy is
//     dropped (once no reader holds it), the verdict is persisted, the
//     options' log callback gets a warning naming tenant, profile, id,
//     tier and location, and the block then reads as NOT_FOUND whose
//     message starts with "DATA_LOSS", never as bytes. ForEachQuarantined
//     lists every quarantined block, whoever found it. A later put of the
//     correct bytes under the same id replaces it.
//   * A put of different bytes (different checksum) under an existing id is
//     ALREADY_EXISTS; the stored block stays.
//   * Tenants: every key carries its tenant, so tenants never see each
//     other's blocks (identical bytes of two tenants are two blocks). Leases
//     belong to the tenant that took them (random 64-bit ids; another
//     tenant's id reads as unknown). With per-tenant arenas (the
//     multi-tenant options below) each tenant's device copies and staging
//     slots live in memory of its own, which only that tenant is given.
//     Per-tenant limits (SetTenantLimits) cap pinned bytes, leases held,
//     staging slots, host and NVMe bytes and profiles; exceeding one is
//     RESOURCE_EXHAUSTED naming the quota.
//   * Profiles belong to the tenant that registered them: names are per
//     tenant (two tenants may register one name with different shapes),
//     ids are random 64-bit values, and a tenant's key naming a profile id
//     that is not its own is treated as naming no profile at all (the same
//     NOT_FOUND, so ids reveal nothing of other tenants' profiles).
//
// Errors: every failed step of an operation fails the operation (nothing
// is ignored); problems found outside any request (recovery at Open, a
// quarantine that could not be persisted) go to the options' log callback.
//
// Thread safety: all public methods may be called concurrently. Internally
// one mutex guards the metadata; payload I/O (memcpy, NVMe, device copies)
// runs outside it on entries held busy.
#ifndef KVTIER_STORAGE_STORE_BLOCK_STORE_H_
#define KVTIER_STORAGE_STORE_BLOCK_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gpu/device_ops.h"
#include "storage/catalog/records.h"
#include "storage/env/env.h"
#include "storage/store/block_store_types.h"
#include "storage/store/placement.h"
#include "storage/tier.h"

namespace rocksdb {
class Env;
}  // namespace rocksdb

namespace kvtier {

struct BlockStoreOptions {
  std::string data_dir;  // catalog in <data_dir>/catalog
  Env* env = nullptr;    // all file and clock access; not owned
  // The catalog's RocksDB environment (tests route it through a
  // fault-injecting file system); nullptr: rocksdb::Env::Default(). Not
  // owned; must outlive the store.
  rocksdb::Env* catalog_env = nullptr;

  // Device tier: the arena behind device_ops (not owned). capacity is
  // min(device_capacity_bytes, arena size).
  gpu::DeviceOps* device_ops = nullptr;
  uint64_t device_capacity_bytes = 0;

  // Host tier: a shared-memory file of host_capacity_bytes; staging slots
  // for zero-copy puts come from a sealed memfd (gpu/cpu/shm_file.h) of
  // staging_capacity_bytes named staging_name, which clients reach only
  // through StagingFile's descriptors.
  std::string host_shm_path;
  uint64_t host_capacity_bytes = 0;
  std::string staging_name;
  uint64_t staging_capacity_bytes = 0;

  // NVMe tier.
  std::string nvme_dir;
  uint32_t nvme_file_count = 0;
  uint64_t nvme_file_size_bytes = 0;
  bool nvme_direct_io = true;
  uint32_t nvme_io_threads = 1;
  uint32_t nvme_queue_depth = 64;
  bool write_through = false;

  // Leases.
  uint64_t default_lease_ttl_ms = 30000;
  uint64_t max_lease_ttl_ms = 600000;

  // Computes a block's key summary (opaque bytes, <= kMaxSummaryBytes) when
  // it is put; kept in memory and in the catalog record, returned by
  // GetSummaries. Called outside the store's lock, concurrently. Null: no
  // summaries. An error fails the put.
  std::function<absl::StatusOr<std::string>(const ModelProfile& profile,
                                            absl::Span<const uint8_t> payload)>
      summarize;
  // Optional, with summarize: the same summary taken while a put copies a
  // new block into its slot, chunk by chunk (SummaryStream).
  std::function<std::unique_ptr<SummaryStream>(const ModelProfile&)> begin_summary;
  // Non-durable puts of new blocks (without write_through) are
  // acknowledged before their summary exists: a background thread
  // computes it from the host copy, which stays in place until then (the
  // block is busy: not evicted, demoted or deleted meanwhile). GetSummaries
  // of such a block computes it at once, or waits for the thread when it is
  // already on it, so a block never joins a context without its summary.
  // At most max_deferred_summaries blocks, holding at most a quarter of
  // host_capacity_bytes, wait; beyond that, and for durable puts, the put
  // computes it itself, as without the option. A deferred summary that
  // fails leaves the block without one (logged) instead of failing the
  // acknowledged put.
  bool defer_summaries = false;
  // Pre-fault the host tier, the staging area and CPU device arenas (each
  // tenant arena when it is created) on a background thread
  // (storage/host/prefaulter.h); progress in Stats() per tier.
  bool prefault = false;
  size_t max_deferred_summaries = 256;

  // Most host-tier bytes lent to views (View) at once: a lent copy stays
  // in place, busy, until its view is destroyed, so this bounds what
  // in-flight sends can keep from eviction. A view past it is a private
  // copy. 0: a quarter of host_capacity_bytes.
  uint64_t max_view_bytes = 0;

  // Receives warnings the store cannot return to a caller (quarantines,
  // recovery at Open dropping records or files, a quarantine verdict that
  // could not be persisted). Called under the store's lock: must be quick
  // and must not call back into the store. Null: dropped.
  std::function<void(const std::string& message)> log_warning;

  // Creates the placement policy (storage/store/placement.h); null: LRU.
  std::function<std::unique_ptr<PlacementPolicy>()> make_placement;

  // Multi-tenant mode (set both; device_ops may then be null): each
  // tenant's device copies live in an arena of its own, created on the
  // tenant's first use by make_tenant_arena(tenant, size_bytes) with
  // size_bytes = its limits.device_bytes or else tenant_arena_bytes; all
  // arenas together stay within device_capacity_bytes (creating one beyond
  // that is RESOURCE_EXHAUSTED). Its staging slots come from a sealed memfd
  // of its own named tenant_staging_name(tenant), of limits.staging_bytes
  // or else tenant_staging_bytes.
  std::function<absl::StatusOr<std::unique_ptr<gpu::DeviceOps>>(const std::string& tenant,
                                                                uint64_t size_bytes)>
      make_tenant_arena;
  uint64_t tenant_arena_bytes = 0;
  std::function<std::string(const std::string& tenant)> tenant_staging_name;
  uint64_t tenant_staging_bytes = 0;
};

class Catalog;  // catalog.h

class BlockStore {
 public:
  // Opens (creating) the catalog and the tiers and reconciles them: every
  // durable catalog record whose NVMe extent is valid becomes an NVMe-only
  // block; records without a valid extent are removed; files in nvme_dir
  // that are not tier files are deleted. INVALID_ARGUMENT naming the
  // option for bad options.
  static absl::StatusOr<std::unique_ptr<BlockStore>> Open(const BlockStoreOptions& options);

  virtual ~BlockStore() = default;

  // ---- Tenants ---------------------------------------------------------
  // Replaces the limits of `tenant` (they apply to new work; what is held
  // already is not revoked).
  virtual void SetTenantLimits(const std::string& tenant, const TenantLimits& limits) = 0;
  virtual TenantUsage UsageOf(const std::string& tenant) = 0;

  // ---- Profiles --------------------------------------------------------
  // Registers profile as `tenant`'s (its owner). The tenant's identical
  // definition -> same id (created = false); the tenant's same
  // name+revision with another shape -> ALREADY_EXISTS (other tenants'
  // profiles play no part); bad field -> INVALID_ARGUMENT. A new profile
  // counts against `tenant`'s profiles quota (RESOURCE_EXHAUSTED naming it).
  virtual absl::StatusOr<RegisteredProfile> RegisterProfile(const ModelProfile& profile,
                                                            const std::string& tenant) = 0;
  // `tenant`'s profile. NOT_FOUND "profile_id: N is not registered" for
  // any id that is not one of the tenant's, another tenant's included.
  virtual absl::StatusOr<ModelProfile> GetProfile(const std::string& tenant,
                                                  uint64_t profile_id) = 0;

  // ---- Blocks ----------------------------------------------------------
  // data must be exactly the profile's block size (INVALID_ARGUMENT naming
  // "data"; a profile that is not key.tenant's is NOT_FOUND naming
  // "profile_id"); a put past the tenant's host_bytes (or, durable,
  // nvme_bytes) quota is RESOURCE_EXHAUSTED naming it. options
  // (block_store_types.h): durable: acknowledge only once the NVMe copy
  // and its catalog record are synced. expected_xxh3 != 0: the payload's
  // XXH3-64 must equal it, else DATA_LOSS and nothing is stored. retain:
  // the block is never evicted (only deleted); it counts against the
  // tenant's retained_bytes quota (RESOURCE_EXHAUSTED naming it). Putting
  // identical bytes again with retain marks a stored block retained; a
  // put without retain never clears the mark.
  virtual absl::StatusOr<PutOutcome> Put(const BlockKey& key, absl::Span<const uint8_t> data,
                                         const PutOptions& options = {}) = 0;
  // Put of a payload held in pieces (the buffers a gRPC message arrived in):
  // the same as Put of their concatenation, which is never built; a new
  // block is copied from the pieces into its host-tier slot and hashed in
  // one pass. The pieces must not change during the call.
  virtual absl::StatusOr<PutOutcome> PutPieces(const BlockKey& key,
                                               absl::Span<const absl::Span<const uint8_t>> pieces,
                                               const PutOptions& options = {}) = 0;
  // Reserves count staging slots of the profile's block size in the
  // tenant's staging area, returned to the pool after ttl_ms (0 = default)
  // unless used by PutFromStaging; past the tenant's staging_slots quota
  // RESOURCE_EXHAUSTED naming it; NOT_FOUND naming "profile_id" for a
  // profile that is not the tenant's.
  virtual absl::StatusOr<std::vector<StagingSlot>> ReserveStaging(const std::string& tenant,
                                                                  uint64_t profile_id,
                                                                  uint32_t count,
                                                                  uint64_t ttl_ms) = 0;
  // Stores the bytes a client wrote into a staging slot: they are first
  // copied into daemon-private memory, and only that copy is checksummed,
  // summarised and stored, so a client rewriting the slot meanwhile cannot
  // make the store hold bytes that differ from their checksum; the slot is
  // consumed.
  virtual absl::StatusOr<PutOutcome> PutFromStaging(const BlockKey& key, const StagingSlot& slot,
                                                    const PutOptions& options = {}) = 0;
  // The bytes of a block (promoting an NVMe-only block to the host tier
  // when there is room). NOT_FOUND when missing or quarantined.
  virtual absl::Status Get(const BlockKey& key, std::string* out, TierId* from) = 0;
  // The bytes of a block without copying them where the store can: a view
  // of its host-tier copy, verified in place and kept there (the block is
  // busy: not moved, evicted or deleted) until the view is destroyed.
  // A block not in host memory is read as Get reads it, into a copy the
  // view owns, and so is one that would take the host bytes lent to views
  // past BlockStoreOptions.max_view_bytes. Same errors as Get. The default
  // is Get into a copy.
  virtual absl::StatusOr<std::unique_ptr<BlockView>> View(const BlockKey& key, TierId* from);
  // View of several blocks: (*from)[i] and the result's [i] are key i's,
  // as View reports them. A store that fetches blocks from elsewhere (the
  // remote tier) fetches the missing ones together. The default calls
  // View per key.
  virtual std::vector<absl::StatusOr<std::unique_ptr<BlockView>>> ViewMany(
      absl::Span<const BlockKey> keys, std::vector<TierId>* from);
  // Makes every block resident in the tenant's device arena and pins them
  // under a new lease of `tenant` lasting ttl_ms (0 = default; above max ->
  // INVALID_ARGUMENT). Every key must be the tenant's. Per-block outcome in
  // *handles (same order); blocks that failed are not pinned (a block that
  // would take the tenant past its pinned_bytes quota is
  // RESOURCE_EXHAUSTED naming it). Returns the lease id (0 when nothing
  // was pinned).
  //
  // options (PinOptions, block_store_types.h):
  //
  // memory_only: no disk I/O on the caller's thread. A block whose only
  // copy is on NVMe is not read but answered UNAVAILABLE ("on NVMe only";
  // the caller may Prefetch it and ask again), and device room is made
  // without disk I/O: copies that have another copy are dropped, a last
  // copy moves to host memory when room there can be made by dropping
  // copies that have another copy (nothing is demoted to disk).
  //
  // mark_wanted: first does what MarkWanted(keys) does, in the same hold of
  // the store's lock and with the same lookups (one hash lookup per key in
  // all, instead of one for MarkWanted and one here).
  //
  // budget (may be null: no limit): host -> arena promotions stop once
  // they would pass budget->limit_bytes; the blocks left are answered
  // PromotionDeferredError and not pinned (block_store_types.h).
  //
  // replaces_lease: see Leases below.
  //
  // Leases: when the tenant already holds its limits.leases leases (after
  // expired ones are ended), the call fails with RESOURCE_EXHAUSTED naming
  // the quota "leases" and pins nothing. replaces_lease: a lease of the
  // tenant that the caller releases right after this call (a context's
  // previous selection); while it is held, the new lease may be one over
  // the limit, so a context's next Select is never refused for it.
  virtual absl::StatusOr<uint64_t> AcquireHandles(
      const std::string& tenant, const std::vector<BlockKey>& keys, uint64_t ttl_ms,
      std::vector<absl::StatusOr<DeviceHandle>>* handles, const PinOptions& options = {}) = 0;
  virtual BlockLocation Lookup(const BlockKey& key) = 0;
  // Tells the placement policy that a selection (the daemon's Select)
  // wants these blocks now, before it asks for their handles: stored
  // blocks in any tier, NVMe-only ones included, get PlacementPolicy::Want
  // (the stability policy demotes first what no Select wanted lately).
  // Keys not stored, being written or quarantined are skipped; nothing is
  // read, moved or pinned. Cost: nothing when the policy ignores wants
  // (PlacementPolicy::uses_wants; LRU, KeyDiff); else one acquisition of
  // the store's mutex, held for one hash lookup and an O(1) policy update
  // per key: no I/O, no waiting on busy entries, no allocation.
  virtual void MarkWanted(absl::Span<const BlockKey> keys) = 0;
  // Installs the one ReleaseListener (block_store_types.h; null removes
  // it). The default ignores it (a store without tiers to leave).
  virtual void SetReleaseListener(ReleaseListener listener) {}
  // The summaries of keys, in order. Keys that are not stored (or are
  // quarantined) are appended to *missing and get an empty string.
  virtual std::vector<std::string> GetSummaries(const std::vector<BlockKey>& keys,
                                                std::vector<BlockKey>* missing) = 0;
  // Best effort: brings NVMe-only blocks into the host tier (no pin) so a
  // later AcquireHandles is fast. Returns how many were promoted.
  virtual size_t Prefetch(const std::vector<BlockKey>& keys) = 0;
  // FAILED_PRECONDITION when pinned; NOT_FOUND when absent. A quarantined
  // block can be deleted. The catalog record's synced removal runs without
  // the store's lock; meanwhile the block is hidden (Lookup: absent; Get,
  // Put and pins of it wait). When removing its catalog record fails, that
  // error is returned and the block stays (no longer durable).
  virtual absl::Status Delete(const BlockKey& key) = 0;

  // ---- Leases ----------------------------------------------------------
  // Unpins everything the tenant's lease holds; returns how many blocks.
  // NOT_FOUND for an unknown or already expired lease, or another
  // tenant's.
  virtual absl::StatusOr<uint32_t> Release(const std::string& tenant, uint64_t lease_id) = 0;
  // Ends every lease (and staging reservation) past its deadline on the
  // Env's monotonic clock. Returns how many leases ended.
  virtual size_t ReapExpired() = 0;

  // ---- Administration --------------------------------------------------
  virtual BlockStoreStats Stats() = 0;
  // Calls fn for every block (tenant/profile filter: empty tenant and 0
  // profile = all) with its location; under no lock across calls.
  virtual void ForEachBlock(
      uint64_t profile_id,
      const std::function<void(const BlockKey&, const BlockLocation&)>& fn) = 0;
  // Calls fn for every quarantined block (profile filter: 0 = all), whoever
  // found it; under no lock across calls.
  virtual void ForEachQuarantined(uint64_t profile_id,
                                  const std::function<void(const QuarantinedBlock&)>& fn) = 0;
  // Re-reads and checksums every copy of every block (device, host and
  // NVMe); progress(done, total, corrupt key or nullptr) after each block.
  // Corrupt blocks are quarantined.
  virtual absl::Status Verify(uint64_t profile_id,
                              const std::function<void(uint64_t done, uint64_t total,
                                                       const BlockKey* corrupt)>& progress) = 0;
  // Every tenant's profiles (owner set), by id then owner.
  virtual std::vector<ModelProfile> ListProfiles() = 0;
  // Gives up the block's copy in `tier` as the cache would, then counts an
  // eviction when the block left the store:
  //   device: a last copy is first copied to the host tier; pinned copies
  //           stay (FAILED_PRECONDITION naming the lease);
  //   host:   a last copy is first written to NVMe (durable);
  //   nvme:   the block leaves the store from whatever tiers hold it (its
  //           catalog record is removed as Delete does); retained or
  //           pinned blocks stay (FAILED_PRECONDITION).
  // NOT_FOUND when the block is not stored, or for device and host when it
  // has no copy there; INVALID_ARGUMENT for kRemote or a key that fails
  // ValidateBlockKey (naming the field).
  virtual absl::Status Evict(const BlockKey& key, TierId tier) = 0;
  // Writes every non-durable block to NVMe (durable) and drops device and
  // host copies that are not pinned.
  virtual absl::Status Drain(
      const std::function<void(uint64_t done, uint64_t total)>& progress) = 0;

  // The tenant's device arena (created on first use in multi-tenant mode;
  // RESOURCE_EXHAUSTED when the device tier has no room for it).
  virtual absl::StatusOr<gpu::ArenaInfo> Arena(const std::string& tenant) = 0;
  // A new read-write descriptor of the file the tenant's staging slots
  // live in (a sealed memfd: its holder can write slots but can neither
  // shrink nor grow it), for handing to that tenant, and the file's size.
  virtual absl::StatusOr<StagingFile> OpenStagingFile(const std::string& tenant) = 0;
  // True when tenants have arenas and staging files of their own.
  virtual bool per_tenant_memory() const = 0;

  // The catalog this store keeps its records in, for the daemon's other
  // durable records (compaction versions); owned by the store, valid while
  // it lives. nullptr for a store without one.
  virtual Catalog* catalog() { return nullptr; }
};

}  // namespace kvtier

#endif  // KVTIER_STORAGE_STORE_BLOCK_STORE_H_
