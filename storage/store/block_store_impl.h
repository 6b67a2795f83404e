// BlockStoreImpl: the implementation behind BlockStore (see block_store.h
// for the contract).
//
// Invariants (under mu_):
//  1. Every entry in entries_ that is not `writing` and not quarantined has
//     at least one copy.
//  2. A copy in tier T is in the placement policy's order for T.
//  3. Each MemorySpace's device allocator, host_ and nvme_ space is used
//     exactly by the copies of entries, staging reservations and operations
//     in flight; an entry's device copy lives in its tenant's space (the
//     shared one in single-tenant mode).
//  4. An entry with pins > 0 has a device copy that is never evicted.
//  5. An entry with busy > 0 is never freed; its copies that are being read
//     are not evicted (no copy of a busy entry is evicted).
//  6. entry.durable implies entry.nvme and a synced catalog record.
//  7. A retained entry is never evicted and its NVMe copy never dropped
//     (its host copy may be, once it is on NVMe).
//  8. An entry with pins > 0 is never freed (leases hold pointers to the
//     entries they pin): Delete refuses it, eviction skips it.
#ifndef KVTIER_STORAGE_STORE_BLOCK_STORE_IMPL_H_
#define KVTIER_STORAGE_STORE_BLOCK_STORE_IMPL_H_

#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "storage/catalog/catalog.h"
#include "storage/common/extent_allocator.h"
#include "storage/host/host_tier.h"
#include "storage/host/prefaulter.h"
#include "storage/nvme/nvme_tier.h"
#include "storage/store/block_store.h"
#include "storage/store/entry.h"
#include "storage/store/lease_table.h"
#include "storage/store/placement.h"
#include "storage/store/store_records.h"

namespace kvtier {

class BlockStoreImpl final : public BlockStore {
 public:
  explicit BlockStoreImpl(const BlockStoreOptions& options);
  ~BlockStoreImpl() override;

  absl::Status Init();

  void SetTenantLimits(const std::string& tenant, const TenantLimits& limits) override;
  TenantUsage UsageOf(const std::string& tenant) override;
  absl::StatusOr<RegisteredProfile> RegisterProfile(const ModelProfile& profile,
                                                    const std::string& tenant) override;
  absl::StatusOr<ModelProfile> GetProfile(const std::string& tenant, uint64_t profile_id) override;
  // Defaults as BlockStore's.
  absl::StatusOr<PutOutcome> Put(const BlockKey& key, absl::Span<const uint8_t> data,
                                 const PutOptions& options = {}) override;
  absl::StatusOr<PutOutcome> PutPieces(const BlockKey& key,
                                       absl::Span<const absl::Span<const uint8_t>> pieces,
                                       const PutOptions& options = {}) override;
  absl::StatusOr<std::vector<StagingSlot>> ReserveStaging(const std::string& tenant,
                                                          uint64_t profile_id, uint32_t count,
                                                          uint64_t ttl_ms) override;
  absl::StatusOr<PutOutcome> PutFromStaging(const BlockKey& key, const StagingSlot& slot,
                                            const PutOptions& options = {}) override;
  absl::Status Get(const BlockKey& key, std::string* out, TierId* from) override;
  absl::StatusOr<std::unique_ptr<BlockView>> View(const BlockKey& key, TierId* from) override;
  class HostView;  // block_store_views.cc
  absl::StatusOr<uint64_t> AcquireHandles(const std::string& tenant,
                                          const std::vector<BlockKey>& keys, uint64_t ttl_ms,
                                          std::vector<absl::StatusOr<DeviceHandle>>* handles,
                                          const PinOptions& options = {}) override;
  BlockLocation Lookup(const BlockKey& key) override;
  void MarkWanted(absl::Span<const BlockKey> keys) override;
  void SetReleaseListener(ReleaseListener listener) override;
  std::vector<std::string> GetSummaries(const std::vector<BlockKey>& keys,
                                        std::vector<BlockKey>* missing) override;
  size_t Prefetch(const std::vector<BlockKey>& keys) override;
  absl::Status Delete(const BlockKey& key) override;
  absl::StatusOr<uint32_t> Release(const std::string& tenant, uint64_t lease_id) override;
  size_t ReapExpired() override;
  BlockStoreStats Stats() override;
  void ForEachBlock(uint64_t profile_id,
                    const std::function<void(const BlockKey&, const BlockLocation&)>& fn) override;
  void ForEachQuarantined(uint64_t profile_id,
                          const std::function<void(const QuarantinedBlock&)>& fn) override;
  absl::Status Verify(
      uint64_t profile_id,
      const std::function<void(uint64_t, uint64_t, const BlockKey*)>& progress) override;
  std::vector<ModelProfile> ListProfiles() override;
  absl::Status Evict(const BlockKey& key, TierId tier) override;
  absl::Status Drain(const std::function<void(uint64_t, uint64_t)>& progress) override;
  absl::StatusOr<gpu::ArenaInfo> Arena(const std::string& tenant) override;
  absl::StatusOr<StagingFile> OpenStagingFile(const std::string& tenant) override;
  bool per_tenant_memory() const override { return multi_tenant_; }
  Catalog* catalog() override { return catalog_.get(); }

 private:
  using FilledCopy = store_internal::FilledCopy;
  using MemorySpace = store_internal::MemorySpace;
  using TenantState = store_internal::TenantState;
  using StagingReservation = store_internal::StagingReservation;
  using PersistWrite = store_internal::PersistWrite;
  using PendingFree = store_internal::PendingFree;

  // Init's steps. OpenTiers opens the catalog, the host tier, the shared
  // staging file (single-tenant) and the NVMe tier; *file_existed[i] says
  // whether NVMe file i was there before (a recreated file holds no block).
  absl::Status OpenTiers(std::vector<bool>* file_existed);
  // Loads the profiles and turns every durable catalog record with a valid
  // extent into an NVMe-only block; deletes the other records and removes
  // orphan NVMe files.
  absl::Status RecoverLocked(const std::vector<bool>& file_existed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One catalog record of RecoverLocked: an entry, or key appended to *stale.
  void RecoverBlockLocked(const BlockKey& key, const absl::StatusOr<BlockRecord>& record,
                          const std::vector<bool>& file_existed, int64_t now,
                          std::vector<BlockKey>* stale) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Put of bytes only the daemon can change; `known_checksum`, when set, is
  // BlockChecksum(data) already taken (skips a second pass over the block).
  absl::StatusOr<PutOutcome> PutPrivate(const BlockKey& key, absl::Span<const uint8_t> data,
                                        std::optional<uint64_t> known_checksum,
                                        const PutOptions& options);
  // Put of a block not stored yet (no entry under key, payload checked):
  // src (the payload's pieces, size_bytes in all) is copied and hashed in
  // one pass into its host-tier slot and the summary is taken from that
  // copy, so src may change meanwhile (a staging slot) without the stored
  // checksum, summary and bytes disagreeing.
  absl::StatusOr<PutOutcome> PutNewLocked(const BlockKey& key,
                                          absl::Span<const absl::Span<const uint8_t>> src,
                                          uint64_t size_bytes, const PutOptions& options)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Creates the entry of a block not stored yet and its host-tier copy
  // (making room as a put does), then calls fill, without mu_, with the
  // slot to write the payload into; fill returns the payload's checksum and
  // summary, or an error that fails the put (nothing is kept). Persists it
  // when put.durable (or write-through); put.expected_xxh3 is fill's to
  // check. mu_ is released while fill runs.
  absl::StatusOr<PutOutcome> InsertNewLocked(
      const BlockKey& key, uint64_t size_bytes, const PutOptions& put,
      absl::FunctionRef<absl::StatusOr<FilledCopy>(absl::Span<uint8_t>)> fill)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The tenant's profile under profile_id, or nullptr (none, or another
  // tenant's). Valid until mu_ is next released (a registration may move
  // it; profiles are never removed): copy it to keep it.
  const ModelProfile* ProfileOfLocked(absl::string_view tenant, uint64_t profile_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when the tenant may take one more lease (limits.leases; see
  // AcquireHandles), ending expired leases first when it is at its limit.
  absl::Status CheckLeaseQuotaLocked(const std::string& tenant, uint64_t replaces_lease)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // AcquireHandles' steps (block_store_leases.cc). FindWantedLocked looks
  // each key up once for pin.mark_wanted: appends its entry to *found
  // (nullptr when absent, being written or quarantined) and tells the
  // policy it is wanted at `now` (when the policy uses wants).
  void FindWantedLocked(const std::vector<BlockKey>& keys, uint64_t now, std::vector<Entry*>* found)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why e, key's entry, cannot be pinned in the tenant's lease: it is
  // quarantined, pinning it would pass the tenant's pinned_bytes quota, it
  // is on NVMe only under pin.memory_only, or its promotion would pass
  // pin.budget (then *deferred, made at the call's first deferral, is
  // returned and budget->deferred counted). OK when it can be pinned.
  absl::Status CheckPinnableLocked(const std::string& tenant, const BlockKey& key, const Entry& e,
                                   const PinOptions& pin, absl::Status* deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives e, busy and with no device copy, one in space: its host copy
  // (made first when it has none) is verified and copied to a device slot
  // made as pin.memory_only allows. A damaged host copy is quarantined and
  // its error returned. Counts the promotion (and pin.budget's
  // promoted_bytes). OK without copying when e was promoted meanwhile.
  // Releases mu_ during I/O.
  absl::Status PromoteLocked(Entry* e, MemorySpace* space, const std::string& tenant,
                             const PinOptions& pin) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckPayload(const BlockKey& key, uint64_t size_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finds the entry for key, waiting while a put of it is in progress.
  // nullptr when absent.
  Entry* FindReadyLocked(const BlockKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until the entry of key is neither busy nor being written and
  // returns it, or nullptr once there is none (freed meanwhile).
  Entry* WaitIdleLocked(const BlockKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The tenant's memory space, creating its arena (and, with `staging`,
  // its staging file) in multi-tenant mode.
  absl::StatusOr<MemorySpace*> SpaceLocked(const std::string& tenant, bool staging)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The space of an entry that has a device copy (it exists).
  MemorySpace* SpaceOfLocked(const Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  TenantState& TenantLocked(const std::string& tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED naming the quota when `add` more bytes of the
  // tenant's `what` would pass its limit `limit` (0 = none).
  static absl::Status CheckQuota(const std::string& tenant, const char* what, uint64_t used,
                                 uint64_t add, uint64_t limit);

  // Brings the tenant's host bytes (with the copies in flight) to at most
  // its host_bytes limit minus size_bytes by demoting its own
  // least-recently-used host copies (to NVMe when a copy is the last one);
  // RESOURCE_EXHAUSTED naming the quota when that is not possible. On OK,
  // size_bytes are reserved as in flight until the caller, holding mu_
  // from then until the copy is counted or dropped, calls
  // ReleaseHostInFlightLocked. May release mu_. memory_only: only host
  // copies that have another copy are given up (nothing goes to NVMe).
  absl::Status MakeTenantHostRoomLocked(const std::string& tenant, uint64_t size_bytes,
                                        bool memory_only = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives back size_bytes that MakeTenantHostRoomLocked reserved in flight.
  void ReleaseHostInFlightLocked(const std::string& tenant, uint64_t size_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A host-tier slot of size_bytes, giving up host copies
  // (FreeOneHostCopyLocked) until one fits; RESOURCE_EXHAUSTED naming why
  // when every block in the tier is in use. May release mu_ while demoting
  // a victim. memory_only: as for MakeTenantHostRoomLocked.
  absl::StatusOr<HostSlot> MakeRoomHostLocked(uint64_t size_bytes, bool memory_only = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands e's host bytes to release_listener_ (if any) before its last
  // in-memory copy goes.
  void NotifyReleaseLocked(const Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives up one host copy among those `accept` allows (never one in
  // *stuck): drops it when the block has another copy, else demotes the
  // block to NVMe, else (NVMe has no room) evicts the block unless it is
  // retained or pinned. A victim that could not go is added to *stuck and
  // *why says why. Returns false when no candidate is left. May release
  // mu_.
  bool FreeOneHostCopyLocked(const std::function<bool(const Entry&)>& accept,
                             absl::flat_hash_set<BlockKey>* stuck, absl::Status* why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts one block from NVMe (the placement policy's victim among NVMe
  // copies that are not retained, pinned, in use or `self`, of `tenant`
  // when not null): its catalog record is removed first, unsynced (no
  // disk wait under mu_), then its memory copies are freed and its NVMe
  // extent is parked in pending_frees_ until that removal is synced
  // (ReleaseSettledLocked), so that no record a power loss could bring
  // back ever names reused space. A durable block's NVMe copy never goes
  // alone. RESOURCE_EXHAUSTED naming why when there is none; the
  // catalog's error when the record could not be removed.
  absl::Status EvictOneNvmeLocked(const std::string* tenant, const Entry* self)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the parked extents whose record removal the catalog has synced.
  void ReleaseSettledLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Syncs the catalog WAL (mu_ released meanwhile) and frees what that
  // settled. The catalog's error when the sync failed.
  absl::Status SettlePendingFreesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A slot of size_bytes in `space`'s device arena for `tenant`, giving up
  // device copies until one fits; RESOURCE_EXHAUSTED naming why when none
  // can go, or a demotion's error. May release mu_ while demoting a victim.
  // memory_only: no disk I/O. A victim's copy is dropped when the block has
  // another copy; a last copy moves to host memory when room there can be
  // made without demoting anything to NVMe (once that fails, only copies
  // with another copy are victims).
  absl::StatusOr<DeviceSlot> MakeRoomDeviceLocked(MemorySpace* space, const std::string& tenant,
                                                  uint64_t size_bytes, bool memory_only = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes e to NVMe, syncs, records it durably. Releases mu_ during I/O.
  absl::Status PersistLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PersistLocked's steps. ReserveNvmeLocked reserves e->size_bytes of
  // e's tenant's nvme_bytes quota as in flight (TenantState::nvme_in_flight;
  // the caller gives it back), evicting the tenant's own NVMe blocks (never
  // e) while the quota has no room; the quota's error, with why no block
  // could be evicted, when it cannot.
  absl::Status ReserveNvmeLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads w's memory copy and, when it matches the record's checksum,
  // writes it to NVMe (WriteNvmeMakingRoom), syncs and writes its durable
  // record (the entry's extent in it). When a step after the NVMe write
  // fails, the record is removed (when its write failed) and the extent
  // freed, or left allocated until restart when the removal fails
  // (w->freed says why). A copy that does not match leaves w->status OK
  // and w->intact false (the caller quarantines it).
  void WritePersistCopy(const Entry* self, PersistWrite* w) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes data to NVMe; while the tier is full, takes mu_ to free room
  // (settling pending frees, else evicting a victim other than self) and
  // tries again. The write's error, with the eviction's when room could
  // not be made.
  absl::StatusOr<NvmeLocation> WriteNvmeMakingRoom(absl::Span<const uint8_t> data,
                                                   const Entry* self) ABSL_LOCKS_EXCLUDED(mu_);
  // Deferred summaries (block_store_summaries.cc). SummaryLoop is the
  // summary thread. EnsureSummaryLocked gives e its summary now: a queued
  // one is computed by the caller, one being computed is waited for (mu_
  // is released meanwhile either way; e is kept busy).
  void SummaryLoop();
  void StopSummaryThread();
  void SetSummaryLocked(Entry* e, std::string summary) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EnsureSummaryLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Computes a queued summary with mu_ released (e kept busy).
  void ComputeSummaryLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives e a host copy (from device or NVMe). Releases mu_ during I/O.
  // memory_only: host room as MakeRoomHostLocked(memory_only) makes it.
  absl::Status EnsureHostCopyLocked(Entry* e, bool memory_only = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void AddCopyLocked(Entry* e, TierId tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops e's copy in tier; free_extent = false leaves an NVMe extent
  // allocated (the caller parks it in pending_frees_).
  void DropCopyLocked(Entry* e, TierId tier, bool free_extent = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the catalog record (when e has one), then frees every copy and
  // erases the entry. On a catalog error nothing changes and it is
  // returned.
  absl::Status EraseLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Erases an entry that has no catalog record (a put that failed).
  void ForgetLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks e quarantined (persisted; a failure to persist is logged), logs
  // a warning and frees its copies that no one is using.
  void QuarantineLocked(Entry* e, TierId tier, std::string location, const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The DATA_LOSS-flavoured NOT_FOUND a quarantined block reads as.
  static absl::Status QuarantinedError(const BlockKey& key, absl::string_view detail);
  // Quarantine if `data` does not match e's checksum; returns that error.
  absl::Status CheckCopyLocked(Entry* e, TierId tier, std::string location,
                               absl::Span<const uint8_t> data) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogLocked(const std::string& message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetRetainedLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps a released lease's entry list for the next lease: at most
  // kMaxSpareLists lists of at most kMaxSparePerList entries (4 MiB at
  // most).
  void RecycleListLocked(std::vector<Entry*> list) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops one pin of a lease's entry (no lookup: invariant 8).
  void UnpinLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  BlockLocation LocationLocked(const Entry& e) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  BlockRecord RecordLocked(const Entry& e) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReapLocked(size_t* reaped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after Init.
  const BlockStoreOptions options_;
  Env* const env_;
  std::unique_ptr<Catalog> catalog_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<NvmeTier> nvme_;
  uint64_t device_capacity_bytes_ = 0;
  bool multi_tenant_ = false;
  bool policy_uses_wants_ = false;  // policy_->uses_wants()
  MemorySpace shared_;              // single-tenant mode

  mutable absl::Mutex mu_;
  absl::CondVar idle_cv_;  // signalled when an entry stops being busy/writing
  // Deferred summaries: keys waiting for the summary thread.
  std::deque<BlockKey> summary_queue_ ABSL_GUARDED_BY(mu_);
  bool summary_stop_ ABSL_GUARDED_BY(mu_) = false;
  size_t deferred_summaries_ ABSL_GUARDED_BY(mu_) = 0;  // entries not kNone
  uint64_t summaries_deferred_total_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t deferred_summary_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // their sizes
  // Views (block_store_views.cc): host bytes lent now, and views copied
  // because lending would have passed options_.max_view_bytes.
  uint64_t view_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t views_copied_over_cap_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread summary_thread_;
  // Set by Init when options_.prefault; constant after. Reset first in the
  // destructor: it must stop touching regions before they are unmapped.
  std::unique_ptr<Prefaulter> prefaulter_;
  ReleaseListener release_listener_ ABSL_GUARDED_BY(mu_);
  static constexpr size_t kMaxSpareLists = 64;
  static constexpr size_t kMaxSparePerList = 8192;
  std::vector<std::vector<Entry*>> spare_lists_ ABSL_GUARDED_BY(mu_);
  uint64_t forgotten_ ABSL_GUARDED_BY(mu_) = 0;  // entries freed so far (ForgetLocked)
  absl::flat_hash_map<BlockKey, std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  // Profiles by id: one per tenant that has a profile under the id (more
  // than one only for ids a format-1 catalog shared; see catalog.h).
  absl::flat_hash_map<uint64_t, std::vector<ModelProfile>> profiles_ ABSL_GUARDED_BY(mu_);
  size_t profile_count_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, std::unique_ptr<MemorySpace>> spaces_ ABSL_GUARDED_BY(mu_);
  uint64_t arena_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // multi-tenant arenas together
  // node map: TenantState references stay valid while mu_ is released.
  absl::node_hash_map<std::string, TenantState> tenants_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<PlacementPolicy> policy_ ABSL_GUARDED_BY(mu_);
  LeaseTable leases_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, StagingReservation> staging_slots_ ABSL_GUARDED_BY(mu_);
  uint64_t next_device_generation_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t blocks_in_tier_[kNumTiers] ABSL_GUARDED_BY(mu_) = {0, 0, 0};
  uint64_t pinned_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t quarantined_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t checksum_failures_[kNumTiers] ABSL_GUARDED_BY(mu_) = {0, 0, 0};
  uint64_t evicted_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reads_from_[kNumTiers] ABSL_GUARDED_BY(mu_) = {0, 0, 0};
  uint64_t read_misses_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t promotions_[kNumTiers] ABSL_GUARDED_BY(mu_) = {0, 0, 0};
  uint64_t demotions_ ABSL_GUARDED_BY(mu_) = 0;
  // Counts a read of e (nullptr: not stored) by its fastest tier.
  void CountReadLocked(const Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t retained_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t summary_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // capacity of every summary
  std::deque<PendingFree> pending_frees_ ABSL_GUARDED_BY(mu_);
  uint64_t pending_free_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier

#endif  // KVTIER_STORAGE_STORE_BLOCK_STORE_IMPL_H_
