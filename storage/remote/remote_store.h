// RemoteStore: a BlockStore with a shared fourth tier on a Redis Cluster
// behind the local tiers (device, host, NVMe). Several daemons configured
// with the same cluster share blocks by content hash: a block put on one is
// found and served by the others.
//
// What it adds to the local store's contract (block_store.h):
//  * Publish, by policy (publish off: the daemon only reads).
//    - Write-through (the default): every new block a put stores is queued
//      and written to the cluster by a publisher thread: its bytes are read
//      back from the local store (checksum-verified) and SET under
//      RemoteKey() with the header of remote_format.h.
//    - Write-back: a block is published when its last in-memory copy is
//      about to go (demoted to NVMe only, or given up when NVMe is full;
//      BlockStore::SetReleaseListener): its host bytes are copied into the
//      write-back buffer (at most writeback_buffer_bytes; beyond that the
//      block is dropped, counted) and SET from there. Blocks that stay in
//      memory are never sent, so hot blocks cost the cluster nothing, but
//      other daemons find a block only after it went cold here.
//    Both are asynchronous and best effort: the put (or the eviction) goes
//    on first; a full queue drops the key and a failed SET is not retried
//    (both counted). The remote copy is what is left of a block once the
//    local placement policy evicts it from the last local tier.
//  * Publish vs Delete: Delete drops the key's queued publishes and waits
//    for one in flight to finish before it deletes the remote copy, so a
//    block deleted here is never re-created in the cluster by a publish of
//    an earlier put (a put racing the Delete itself may land either side).
//  * Promotion. A read of a block no local tier holds (Get, AcquireHandles,
//    Prefetch, GetSummaries) looks it up in the cluster, checks the value's
//    header (remote_format.h) and stores it locally as a non-durable put
//    whose expected checksum is the header's: the payload is hashed while it
//    is copied into the host tier and a mismatch stores nothing. Get then
//    reports the tier as TierId::kRemote.
//  * Never blocking the local tiers: the cluster is contacted on a caller's
//    thread only for reads that would otherwise be NOT_FOUND, within the
//    client's timeouts (an unreachable node fails fast during its backoff).
//    AcquireHandles with memory_only (the Select path) never contacts it: a
//    block no local tier holds is answered UNAVAILABLE ("looking in the
//    remote tier") unless the cluster recently did not have it, and
//    Prefetch (the prefetcher's thread) brings it in.
//  * Misses: an unreachable cluster, a missing key or a bad value read as
//    the local store's NOT_FOUND, never as wrong bytes. A key the cluster did
//    not have (or could not be asked for) is not asked again for
//    miss_cache_ms.
//  * Quarantine: a value failing a check is deleted from the cluster,
//    logged, counted and listed by ForEachQuarantined with tier kRemote (the
//    last quarantine_log_entries of them); the read is a NOT_FOUND whose
//    message starts with "DATA_LOSS".
//  * Delete removes the block locally and from the cluster (OK when either
//    had it). When the cluster cannot be reached its copy stays, so a later
//    read may bring the block back; the error says so.
//
// Thread safety: as BlockStore. Publisher threads run from Create until the
// destructor, which finishes the publishes in progress and drops the keys
// still queued (counted).
#ifndef KVTIER_STORAGE_REMOTE_REMOTE_STORE_H_
#define KVTIER_STORAGE_REMOTE_REMOTE_STORE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "storage/common/locked_stats.h"
#include "storage/remote/redis/redis_cluster.h"
#include "storage/store/block_store.h"

namespace kvtier::remote {

enum class PublishPolicy {
  kWriteThrough,  // every new block, as it is put
  kWriteBack,     // a block when its last in-memory copy is about to go
};

struct RemoteTierOptions {
  RedisClusterOptions cluster;
  bool publish = true;  // publish blocks to the cluster (by policy)
  PublishPolicy policy = PublishPolicy::kWriteThrough;
  // Write-back: bytes of evicted blocks held until published; 0 .. 64 GiB.
  uint64_t writeback_buffer_bytes = uint64_t{256} << 20;
  uint32_t publish_threads = 2;          // 1..64
  uint32_t publish_queue_blocks = 4096;  // keys waiting to be published; more are dropped
  uint64_t ttl_ms = 0;                   // PX on every value; 0 = none (the cluster's
                                         // maxmemory-policy decides what goes)
  uint64_t miss_cache_ms = 2000;         // 0 = ask the cluster on every miss
  uint32_t miss_cache_entries = 65536;   // when full, the cache starts over
  uint32_t quarantine_log_entries = 1024;
  // Warnings nobody else sees (quarantines, failed deletes). Called without
  // the store's locks; must be thread-safe. Null: dropped.
  std::function<void(const std::string& message)> log_warning;
  // Test hook (fault injection): called by a publisher after it has the
  // block's bytes and before its SET, without locks. Null in production.
  std::function<void(const BlockKey& key)> before_publish_set;
};

struct RemoteTierStats {
  uint64_t hits = 0;                      // blocks promoted from the cluster
  uint64_t misses = 0;                    // lookups the cluster answered "no such key"
  uint64_t unavailable = 0;               // lookups that could not reach the cluster
  uint64_t miss_cache_hits = 0;           // lookups skipped: recently missed
  uint64_t corrupt = 0;                   // values that failed a check (quarantined)
  uint64_t published = 0;                 // blocks written to the cluster
  uint64_t publish_dropped = 0;           // keys dropped: queue full, or at shutdown
  uint64_t publish_failed = 0;            // SETs that failed (not retried)
  uint64_t publish_skipped = 0;           // gone locally before their turn
  uint64_t publish_queued = 0;            // waiting now
  uint64_t publish_cancelled = 0;         // queued publishes a Delete dropped
  uint64_t writeback_buffered_bytes = 0;  // write-back bytes queued or being sent
  uint64_t deleted = 0;                   // keys Delete removed from the cluster
  uint64_t bytes_read = 0;                // payload bytes promoted
  uint64_t bytes_written = 0;             // payload bytes published
  RedisClusterStats cluster;
  std::vector<std::string> masters;  // the client's slot map now
};

class RemoteStore final : public BlockStore {
 public:
  // Wraps `local` (owned). INVALID_ARGUMENT naming the option for bad
  // options (the cluster's own are checked by RedisCluster::Create). The
  // cluster need not be reachable.
  static absl::StatusOr<std::unique_ptr<RemoteStore>> Create(std::unique_ptr<BlockStore> local,
                                                             RemoteTierOptions options);
  ~RemoteStore() override;

  RemoteTierStats remote_stats() const;
  // Blocks until every key queued before the call was published, skipped,
  // failed or dropped.
  void WaitPublished();
  BlockStore* local() const { return local_.get(); }
  // Whether the cluster holds a value for key (EXISTS; the value is not
  // read or checked). False when the cluster cannot be asked or recently
  // did not have it.
  bool InRemote(const BlockKey& key);

  // ---- BlockStore --------------------------------------------------------
  void SetTenantLimits(const std::string& tenant, const TenantLimits& limits) override {
    local_->SetTenantLimits(tenant, limits);
  }
  TenantUsage UsageOf(const std::string& tenant) override { return local_->UsageOf(tenant); }
  absl::StatusOr<RegisteredProfile> RegisterProfile(const ModelProfile& profile,
                                                    const std::string& tenant) override {
    return local_->RegisterProfile(profile, tenant);
  }
  absl::StatusOr<ModelProfile> GetProfile(const std::string& tenant, uint64_t profile_id) override {
    return local_->GetProfile(tenant, profile_id);
  }
  absl::StatusOr<PutOutcome> PutPieces(const BlockKey& key,
                                       absl::Span<const absl::Span<const uint8_t>> pieces,
                                       const PutOptions& options = {}) override;
  absl::StatusOr<PutOutcome> Put(const BlockKey& key, absl::Span<const uint8_t> data,
                                 const PutOptions& options = {}) override;
  absl::StatusOr<std::vector<StagingSlot>> ReserveStaging(const std::string& tenant,
                                                          uint64_t profile_id, uint32_t count,
                                                          uint64_t ttl_ms) override {
    return local_->ReserveStaging(tenant, profile_id, count, ttl_ms);
  }
  absl::StatusOr<PutOutcome> PutFromStaging(const BlockKey& key, const StagingSlot& slot,
                                            const PutOptions& options = {}) override;
  absl::Status Get(const BlockKey& key, std::string* out, TierId* from) override;
  // The local store's view; a block no local tier holds is fetched (Get).
  absl::StatusOr<std::unique_ptr<BlockView>> View(const BlockKey& key, TierId* from) override;
  // The local views; the blocks no local tier holds are fetched together
  // (RedisCluster::GetMany) and then lent from their new host slots.
  std::vector<absl::StatusOr<std::unique_ptr<BlockView>>> ViewMany(
      absl::Span<const BlockKey> keys, std::vector<TierId>* from) override;
  absl::StatusOr<uint64_t> AcquireHandles(const std::string& tenant,
                                          const std::vector<BlockKey>& keys, uint64_t ttl_ms,
                                          std::vector<absl::StatusOr<DeviceHandle>>* handles,
                                          const PinOptions& options = {}) override;
  BlockLocation Lookup(const BlockKey& key) override { return local_->Lookup(key); }
  // Local placement only: the remote tier keeps no order.
  void MarkWanted(absl::Span<const BlockKey> keys) override { local_->MarkWanted(keys); }
  std::vector<std::string> GetSummaries(const std::vector<BlockKey>& keys,
                                        std::vector<BlockKey>* missing) override;
  size_t Prefetch(const std::vector<BlockKey>& keys) override;
  absl::Status Delete(const BlockKey& key) override;
  absl::StatusOr<uint32_t> Release(const std::string& tenant, uint64_t lease_id) override {
    return local_->Release(tenant, lease_id);
  }
  size_t ReapExpired() override { return local_->ReapExpired(); }
  BlockStoreStats Stats() override { return local_->Stats(); }
  void ForEachBlock(uint64_t profile_id,
                    const std::function<void(const BlockKey&, const BlockLocation&)>& fn) override {
    local_->ForEachBlock(profile_id, fn);
  }
  void ForEachQuarantined(uint64_t profile_id,
                          const std::function<void(const QuarantinedBlock&)>& fn) override;
  absl::Status Verify(
      uint64_t profile_id,
      const std::function<void(uint64_t, uint64_t, const BlockKey*)>& progress) override {
    return local_->Verify(profile_id, progress);
  }
  std::vector<ModelProfile> ListProfiles() override { return local_->ListProfiles(); }
  // Local tiers only: the remote copy stays (Delete removes it).
  absl::Status Evict(const BlockKey& key, TierId tier) override { return local_->Evict(key, tier); }
  absl::Status Drain(const std::function<void(uint64_t, uint64_t)>& progress) override {
    return local_->Drain(progress);
  }
  absl::StatusOr<gpu::ArenaInfo> Arena(const std::string& tenant) override {
    return local_->Arena(tenant);
  }
  absl::StatusOr<StagingFile> OpenStagingFile(const std::string& tenant) override {
    return local_->OpenStagingFile(tenant);
  }
  bool per_tenant_memory() const override { return local_->per_tenant_memory(); }
  Catalog* catalog() override { return local_->catalog(); }

 private:
  struct ProfileInfo {
    uint64_t fingerprint = 0;
    uint64_t block_bytes = 0;
  };

  RemoteStore(std::unique_ptr<BlockStore> local, std::unique_ptr<RedisCluster> cluster,
              RemoteTierOptions options);

  // The shape of key's profile (the key's tenant's), cached.
  absl::StatusOr<ProfileInfo> Profile(const BlockKey& key);
  // Brings key from the cluster into the local store. OK: stored locally
  // (or it already was); NOT_FOUND: the cluster does not have it, or was
  // recently found not to; UNAVAILABLE: the cluster could not be asked;
  // DATA_LOSS: its value failed a check and was quarantined; otherwise the
  // local put's error (e.g. RESOURCE_EXHAUSTED).
  absl::Status Fetch(const BlockKey& key);
  // Fetch of several keys: one pipelined round per cluster master.
  std::vector<absl::Status> FetchMany(absl::Span<const BlockKey> keys);
  // What a read of key says when no local tier has it and the fetch
  // failed: the local NOT_FOUND, or DATA_LOSS turned into NOT_FOUND
  // "DATA_LOSS: ...", or the fetch's error (RESOURCE_EXHAUSTED ...).
  absl::Status MissStatus(const BlockKey& key, const absl::Status& local,
                          const absl::Status& fetched) const;
  void Quarantine(const BlockKey& key, const std::string& remote_key, const absl::Status& why);
  // Why the key is not asked for now, within miss_cache_ms: kAbsent (the
  // cluster did not have it or could not be asked) or kCorrupt (its value
  // was quarantined). One hash lookup, no allocation: the Select path
  // (AcquireHandles with memory_only) asks it per block not held locally.
  enum class MissKind { kNone, kAbsent, kCorrupt };
  MissKind RecentMiss(const BlockKey& key);
  void RememberMiss(const BlockKey& key, bool corrupt);
  void ForgetMiss(const BlockKey& key);
  struct PublishJob {
    BlockKey key;
    std::string bytes;  // write-back: the block's bytes; empty: read them locally
  };
  void Enqueue(const BlockKey& key);
  // Write-back: the store's release listener (under the local store's
  // lock: copies and queues, never blocks).
  void OnRelease(const BlockKey& key, absl::Span<const uint8_t> bytes);
  void PublishLoop();
  void Publish(const PublishJob& job);
  void Warn(const std::string& message) const;

  // Constant after construction.
  const std::unique_ptr<BlockStore> local_;
  const std::unique_ptr<RedisCluster> cluster_;
  const RemoteTierOptions options_;

  mutable absl::Mutex mu_;
  // By (tenant, profile_id).
  absl::flat_hash_map<std::pair<std::string, uint64_t>, ProfileInfo> profiles_ ABSL_GUARDED_BY(mu_);
  struct Miss {
    uint64_t until_micros = 0;
    bool corrupt = false;  // quarantined, not just absent
  };
  absl::flat_hash_map<BlockKey, Miss> missed_ ABSL_GUARDED_BY(mu_);
  std::deque<QuarantinedBlock> quarantined_ ABSL_GUARDED_BY(mu_);

  absl::Mutex queue_mu_;
  absl::CondVar queue_cv_;
  std::deque<PublishJob> queue_ ABSL_GUARDED_BY(queue_mu_);
  // Write-back bytes queued or being sent (bounded by writeback_buffer_bytes).
  uint64_t buffered_bytes_ ABSL_GUARDED_BY(queue_mu_) = 0;
  // Keys a publisher holds now (from taking the job to the end of its SET),
  // with how many publishers hold each.
  absl::flat_hash_map<BlockKey, int> in_flight_ ABSL_GUARDED_BY(queue_mu_);
  uint64_t enqueued_ ABSL_GUARDED_BY(queue_mu_) = 0;  // keys ever accepted
  uint64_t finished_ ABSL_GUARDED_BY(queue_mu_) = 0;  // of those, done in any way
  bool stopping_ ABSL_GUARDED_BY(queue_mu_) = false;
  std::vector<std::thread> publishers_;

  // The counters of RemoteTierStats; remote_stats() fills the rest.
  LockedStats<RemoteTierStats> stats_;
};

}  // namespace kvtier::remote

#endif  // KVTIER_STORAGE_REMOTE_REMOTE_STORE_H_
