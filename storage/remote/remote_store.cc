#include "storage/remote/remote_store.h"

#include <chrono>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "storage/common/checksum.h"
#include "storage/common/client_text.h"
#include "storage/common/status_macros.h"
#include "storage/remote/remote_format.h"

namespace kvtier::remote {
namespace {

uint64_t NowMicros() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

std::string Describe(const BlockKey& key) {
  return absl::StrCat("block ", ClientHex(key.block_id), " (tenant \"", ClientText(key.tenant),
                      "\", profile ", key.profile_id, ")");
}

}  // namespace

absl::StatusOr<std::unique_ptr<RemoteStore>> RemoteStore::Create(std::unique_ptr<BlockStore> local,
                                                                 RemoteTierOptions options) {
  if (local == nullptr) return absl::InvalidArgumentError("remote tier: no local store");
  if (options.publish_threads < 1 || options.publish_threads > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tiers.remote.publish_threads: ", options.publish_threads, " is outside [1, 64]"));
  }
  if (options.publish && options.publish_queue_blocks == 0) {
    return absl::InvalidArgumentError(
        "tiers.remote.publish_queue_blocks: must be at least 1 when publishing");
  }
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<RedisCluster> cluster,
                          RedisCluster::Create(options.cluster));
  return std::unique_ptr<RemoteStore>(
      new RemoteStore(std::move(local), std::move(cluster), std::move(options)));
}

RemoteStore::RemoteStore(std::unique_ptr<BlockStore> local, std::unique_ptr<RedisCluster> cluster,
                         RemoteTierOptions options)
    : local_(std::move(local)), cluster_(std::move(cluster)), options_(std::move(options)) {
  if (options_.publish) {
    for (uint32_t i = 0; i < options_.publish_threads; ++i) {
      publishers_.emplace_back([this] { PublishLoop(); });
    }
  }
}

RemoteStore::~RemoteStore() {
  {
    absl::MutexLock lock(&queue_mu_);
    stopping_ = true;
    counters_.publish_dropped += queue_.size();
    finished_ += queue_.size();
    queue_.clear();
    queue_cv_.SignalAll();
  }
  for (std::thread& t : publishers_) t.join();
}

void RemoteStore::Warn(const std::string& message) const {
  if (options_.log_warning) options_.log_warning(message);
}

RemoteTierStats RemoteStore::remote_stats() const {
  RemoteTierStats s;
  s.hits = counters_.hits.load();
  s.misses = counters_.misses.load();
  s.unavailable = counters_.unavailable.load();
  s.miss_cache_hits = counters_.miss_cache_hits.load();
  s.corrupt = counters_.corrupt.load();
  s.published = counters_.published.load();
  s.publish_dropped = counters_.publish_dropped.load();
  s.publish_failed = counters_.publish_failed.load();
  s.publish_skipped = counters_.publish_skipped.load();
  s.deleted = counters_.deleted.load();
  s.bytes_read = counters_.bytes_read.load();
  s.bytes_written = counters_.bytes_written.load();
  {
    absl::MutexLock lock(const_cast<absl::Mutex*>(&queue_mu_));
    s.publish_queued = queue_.size();
  }
  s.cluster = cluster_->stats();
  s.masters = cluster_->Masters();
  return s;
}

absl::StatusOr<RemoteStore::ProfileInfo> RemoteStore::Profile(const BlockKey& key) {
  std::pair<std::string, uint64_t> scope(key.tenant, key.profile_id);
  {
    absl::MutexLock lock(&mu_);
    if (auto it = profiles_.find(scope); it != profiles_.end()) return it->second;
  }
  KVTIER_ASSIGN_OR_RETURN(ModelProfile profile, local_->GetProfile(key.tenant, key.profile_id));
  ProfileInfo info{ProfileFingerprint(profile), BlockSizeBytes(profile)};
  absl::MutexLock lock(&mu_);
  profiles_[std::move(scope)] = info;  // profiles never change shape under an id
  return info;
}

// ---- Misses ----------------------------------------------------------------

bool RemoteStore::RecentlyMissed(const BlockKey& key) {
  if (options_.miss_cache_ms == 0) return false;
  absl::MutexLock lock(&mu_);
  auto it = missed_until_micros_.find(key);
  if (it == missed_until_micros_.end()) return false;
  if (it->second > NowMicros()) return true;
  missed_until_micros_.erase(it);
  return false;
}

void RemoteStore::RememberMiss(const BlockKey& key) {
  if (options_.miss_cache_ms == 0) return;
  absl::MutexLock lock(&mu_);
  if (missed_until_micros_.size() >= options_.miss_cache_entries) missed_until_micros_.clear();
  missed_until_micros_[key] = NowMicros() + options_.miss_cache_ms * 1000;
}

void RemoteStore::ForgetMiss(const BlockKey& key) {
  absl::MutexLock lock(&mu_);
  missed_until_micros_.erase(key);
}

// ---- Promotion -------------------------------------------------------------

absl::Status RemoteStore::Fetch(const BlockKey& key) {
  if (RecentlyMissed(key)) {
    ++counters_.miss_cache_hits;
    return absl::NotFoundError("the remote tier recently did not have it");
  }
  KVTIER_ASSIGN_OR_RETURN(ProfileInfo profile, Profile(key));
  const std::string remote_key = RemoteKey(key, profile.fingerprint);
  absl::Status stored = absl::NotFoundError("the remote value was not read");
  absl::Status bad;
  absl::StatusOr<bool> found = cluster_->Get(remote_key, [&](std::string_view value) {
    absl::StatusOr<RemoteValue> v =
        DecodeRemoteValue(value, remote_key, profile.fingerprint, profile.block_bytes);
    if (!v.ok()) {
      bad = v.status();
      return;
    }
    // A checksum of 0 would switch the put's check off: check it here.
    if (v->payload_checksum == 0 && BlockChecksum(v->payload) != 0) {
      bad = absl::DataLossError("remote payload fails its checksum");
      return;
    }
    absl::StatusOr<PutOutcome> put =
        local_->Put(key, v->payload, {.expected_xxh3 = v->payload_checksum});
    if (put.ok()) {
      stored = absl::OkStatus();
      counters_.bytes_read += v->payload.size();
    } else if (put.status().code() == absl::StatusCode::kDataLoss) {
      bad = absl::DataLossError(
          absl::StrCat("remote payload fails its checksum (", put.status().message(), ")"));
    } else if (put.status().code() == absl::StatusCode::kAlreadyExists) {
      stored = absl::OkStatus();  // a local block under this id wins
    } else {
      stored = put.status();
    }
  });
  if (!found.ok()) {
    ++counters_.unavailable;
    RememberMiss(key);
    return absl::UnavailableError(absl::StrCat("remote tier: ", found.status().message()));
  }
  if (!*found) {
    ++counters_.misses;
    RememberMiss(key);
    return absl::NotFoundError("not in the remote tier");
  }
  if (!bad.ok()) {
    Quarantine(key, remote_key, bad);
    return absl::DataLossError(bad.message());
  }
  if (stored.ok()) ++counters_.hits;
  return stored;
}

void RemoteStore::Quarantine(const BlockKey& key, const std::string& remote_key,
                             const absl::Status& why) {
  ++counters_.corrupt;
  RememberMiss(key);
  absl::StatusOr<bool> deleted = cluster_->Del(remote_key);
  QuarantinedBlock q;
  q.key = key;
  q.tier = TierId::kRemote;
  q.location = absl::StrCat("redis key ", absl::CEscape(remote_key));
  q.reason = std::string(why.message());
  q.found_micros = absl::ToUnixMicros(absl::Now());
  {
    absl::MutexLock lock(&mu_);
    quarantined_.push_back(q);
    while (quarantined_.size() > options_.quarantine_log_entries) quarantined_.pop_front();
  }
  Warn(absl::StrCat("remote tier: quarantined ", Describe(key), " at ", q.location, ": ", q.reason,
                    deleted.ok()
                        ? "; the value was deleted from the cluster"
                        : absl::StrCat("; deleting it failed: ", deleted.status().message())));
}

bool RemoteStore::InRemote(const BlockKey& key) {
  if (RecentlyMissed(key)) {
    ++counters_.miss_cache_hits;
    return false;
  }
  absl::StatusOr<ProfileInfo> profile = Profile(key);
  if (!profile.ok()) return false;
  absl::StatusOr<bool> exists = cluster_->Exists(RemoteKey(key, profile->fingerprint));
  if (!exists.ok()) {
    ++counters_.unavailable;
    RememberMiss(key);
    return false;
  }
  if (!*exists) {
    ++counters_.misses;
    RememberMiss(key);
  }
  return *exists;
}

absl::StatusOr<std::unique_ptr<BlockView>> RemoteStore::View(const BlockKey& key, TierId* from) {
  absl::StatusOr<std::unique_ptr<BlockView>> local = local_->View(key, from);
  if (local.ok() || local.status().code() != absl::StatusCode::kNotFound) return local;
  return BlockStore::View(key, from);  // Get: fetches from the remote tier
}

absl::Status RemoteStore::Get(const BlockKey& key, std::string* out, TierId* from) {
  absl::Status local = local_->Get(key, out, from);
  if (local.code() != absl::StatusCode::kNotFound) return local;
  absl::Status fetched = Fetch(key);
  if (fetched.code() == absl::StatusCode::kDataLoss) {
    return absl::NotFoundError(absl::StrCat("DATA_LOSS: the remote copy of ", Describe(key),
                                            " failed its check (", fetched.message(),
                                            ") and was quarantined"));
  }
  if (fetched.code() == absl::StatusCode::kNotFound ||
      fetched.code() == absl::StatusCode::kUnavailable) {
    return local;
  }
  KVTIER_RETURN_IF_ERROR(fetched);
  KVTIER_RETURN_IF_ERROR(local_->Get(key, out, from));
  if (from != nullptr) *from = TierId::kRemote;
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> RemoteStore::AcquireHandles(
    const std::string& tenant, const std::vector<BlockKey>& keys, uint64_t ttl_ms,
    std::vector<absl::StatusOr<DeviceHandle>>* handles, const PinOptions& pin) {
  if (!pin.memory_only) {
    for (const BlockKey& key : keys) {
      if (key.tenant == tenant && !local_->Lookup(key).present) Fetch(key).IgnoreError();
    }
  }
  absl::StatusOr<uint64_t> lease = local_->AcquireHandles(tenant, keys, ttl_ms, handles, pin);
  if (!lease.ok() || !pin.memory_only) return lease;
  for (size_t i = 0; i < keys.size() && i < handles->size(); ++i) {
    absl::StatusOr<DeviceHandle>& h = (*handles)[i];
    if (h.ok() || h.status().code() != absl::StatusCode::kNotFound) continue;
    if (keys[i].tenant != tenant || RecentlyMissed(keys[i])) continue;
    h = absl::UnavailableError(
        absl::StrCat(Describe(keys[i]), " is in no local tier; looking in the remote tier"));
  }
  return lease;
}

std::vector<std::string> RemoteStore::GetSummaries(const std::vector<BlockKey>& keys,
                                                   std::vector<BlockKey>* missing) {
  std::vector<BlockKey> absent;
  std::vector<std::string> out = local_->GetSummaries(keys, &absent);
  if (absent.empty()) return out;
  bool any = false;
  for (const BlockKey& key : absent) any |= Fetch(key).ok();
  if (!any) {
    if (missing != nullptr) missing->insert(missing->end(), absent.begin(), absent.end());
    return out;
  }
  return local_->GetSummaries(keys, missing);
}

size_t RemoteStore::Prefetch(const std::vector<BlockKey>& keys) {
  size_t promoted = local_->Prefetch(keys);
  for (const BlockKey& key : keys) {
    if (!local_->Lookup(key).present && Fetch(key).ok()) ++promoted;
  }
  return promoted;
}

absl::Status RemoteStore::Delete(const BlockKey& key) {
  absl::Status local = local_->Delete(key);
  if (!local.ok() && local.code() != absl::StatusCode::kNotFound) return local;
  RememberMiss(key);
  absl::StatusOr<ProfileInfo> profile = Profile(key);
  if (!profile.ok()) return local;
  absl::StatusOr<bool> deleted = cluster_->Del(RemoteKey(key, profile->fingerprint));
  if (!deleted.ok()) {
    const std::string why =
        absl::StrCat("remote tier: could not delete ", Describe(key), " from the cluster (",
                     deleted.status().message(), "); a later read may bring it back");
    Warn(why);
    return local.ok() ? absl::UnavailableError(absl::StrCat("deleted locally, but ", why))
                      : absl::UnavailableError(why);
  }
  if (*deleted) ++counters_.deleted;
  if (local.ok() || *deleted) return absl::OkStatus();
  return local;
}

void RemoteStore::ForEachQuarantined(uint64_t profile_id,
                                     const std::function<void(const QuarantinedBlock&)>& fn) {
  local_->ForEachQuarantined(profile_id, fn);
  std::deque<QuarantinedBlock> remote;
  {
    absl::MutexLock lock(&mu_);
    remote = quarantined_;
  }
  for (const QuarantinedBlock& q : remote) {
    if (profile_id == 0 || q.key.profile_id == profile_id) fn(q);
  }
}

// ---- Publishing ------------------------------------------------------------

absl::StatusOr<PutOutcome> RemoteStore::Put(const BlockKey& key, absl::Span<const uint8_t> data,
                                            const PutOptions& options) {
  absl::StatusOr<PutOutcome> put = local_->Put(key, data, options);
  if (put.ok() && !put->existed) Enqueue(key);
  return put;
}

absl::StatusOr<PutOutcome> RemoteStore::PutPieces(
    const BlockKey& key, absl::Span<const absl::Span<const uint8_t>> pieces,
    const PutOptions& options) {
  absl::StatusOr<PutOutcome> put = local_->PutPieces(key, pieces, options);
  if (put.ok() && !put->existed) Enqueue(key);
  return put;
}

absl::StatusOr<PutOutcome> RemoteStore::PutFromStaging(const BlockKey& key, const StagingSlot& slot,
                                                       const PutOptions& options) {
  absl::StatusOr<PutOutcome> put = local_->PutFromStaging(key, slot, options);
  if (put.ok() && !put->existed) Enqueue(key);
  return put;
}

void RemoteStore::Enqueue(const BlockKey& key) {
  ForgetMiss(key);
  if (!options_.publish) return;
  absl::MutexLock lock(&queue_mu_);
  if (stopping_ || queue_.size() >= options_.publish_queue_blocks) {
    ++counters_.publish_dropped;
    return;
  }
  queue_.push_back(key);
  ++enqueued_;
  queue_cv_.Signal();
}

void RemoteStore::WaitPublished() {
  absl::MutexLock lock(&queue_mu_);
  const uint64_t target = enqueued_;
  auto done = [this, target]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) { return finished_ >= target; };
  queue_mu_.Await(absl::Condition(&done));
}

void RemoteStore::PublishLoop() {
  for (;;) {
    BlockKey key;
    {
      absl::MutexLock lock(&queue_mu_);
      while (queue_.empty() && !stopping_) queue_cv_.Wait(&queue_mu_);
      if (queue_.empty()) return;
      key = std::move(queue_.front());
      queue_.pop_front();
    }
    Publish(key);
    absl::MutexLock lock(&queue_mu_);
    ++finished_;
  }
}

void RemoteStore::Publish(const BlockKey& key) {
  absl::StatusOr<ProfileInfo> profile = Profile(key);
  std::string data;
  TierId from = TierId::kHost;
  if (!profile.ok() || !local_->Get(key, &data, &from).ok()) {
    ++counters_.publish_skipped;  // deleted, evicted or quarantined meanwhile
    return;
  }
  const std::string remote_key = RemoteKey(key, profile->fingerprint);
  const auto payload =
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(data.data()), data.size());
  const auto header =
      EncodeRemoteHeader(remote_key, profile->fingerprint, data.size(), BlockChecksum(payload));
  const absl::Span<const uint8_t> pieces[] = {absl::MakeConstSpan(header), payload};
  if (absl::Status st = cluster_->Set(remote_key, pieces, options_.ttl_ms); !st.ok()) {
    ++counters_.publish_failed;
    return;
  }
  ++counters_.published;
  counters_.bytes_written += data.size();
}

}  // namespace kvtier::remote
