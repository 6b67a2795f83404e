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
  if (options.writeback_buffer_bytes > (uint64_t{64} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tiers.remote.writeback_buffer_bytes: ", options.writeback_buffer_bytes,
                     " is over the limit of 64GiB"));
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
    if (options_.policy == PublishPolicy::kWriteBack) {
      local_->SetReleaseListener(
          [this](const BlockKey& key, absl::Span<const uint8_t> bytes) { OnRelease(key, bytes); });
    }
  }
}

RemoteStore::~RemoteStore() {
  local_->SetReleaseListener(nullptr);
  {
    absl::MutexLock lock(&queue_mu_);
    stopping_ = true;
    stats_.Add(&RemoteTierStats::publish_dropped, queue_.size());
    finished_ += queue_.size();
    queue_.clear();
    buffered_bytes_ = 0;
    queue_cv_.SignalAll();
  }
  for (std::thread& t : publishers_) t.join();
}

void RemoteStore::Warn(const std::string& message) const {
  if (options_.log_warning) options_.log_warning(message);
}

RemoteTierStats RemoteStore::remote_stats() const {
  RemoteTierStats s = stats_.Get();  // the counters
  {
    absl::MutexLock lock(const_cast<absl::Mutex*>(&queue_mu_));
    s.publish_queued = queue_.size();
    s.writeback_buffered_bytes = buffered_bytes_;
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

RemoteStore::MissKind RemoteStore::RecentMiss(const BlockKey& key) {
  if (options_.miss_cache_ms == 0) return MissKind::kNone;
  absl::MutexLock lock(&mu_);
  auto it = missed_.find(key);
  if (it == missed_.end()) return MissKind::kNone;
  if (it->second.until_micros <= NowMicros()) {
    missed_.erase(it);
    return MissKind::kNone;
  }
  return it->second.corrupt ? MissKind::kCorrupt : MissKind::kAbsent;
}

void RemoteStore::RememberMiss(const BlockKey& key, bool corrupt) {
  if (options_.miss_cache_ms == 0) return;
  absl::MutexLock lock(&mu_);
  if (missed_.size() >= options_.miss_cache_entries) missed_.clear();
  missed_[key] = Miss{NowMicros() + options_.miss_cache_ms * 1000, corrupt};
}

void RemoteStore::ForgetMiss(const BlockKey& key) {
  absl::MutexLock lock(&mu_);
  missed_.erase(key);
}

// ---- Promotion -------------------------------------------------------------

absl::Status RemoteStore::Fetch(const BlockKey& key) {
  std::vector<absl::Status> fetched = FetchMany(absl::MakeConstSpan(&key, 1));
  return fetched[0];
}

std::vector<absl::Status> RemoteStore::FetchMany(absl::Span<const BlockKey> keys) {
  std::vector<absl::Status> out(keys.size(), absl::OkStatus());
  // What is asked for: keys not recently missed, with their profile.
  std::vector<size_t> asked;
  std::vector<std::string> remote_keys;
  std::vector<ProfileInfo> profiles;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (const MissKind missed = RecentMiss(keys[i]); missed != MissKind::kNone) {
      stats_.Add(&RemoteTierStats::miss_cache_hits);
      out[i] =
          missed == MissKind::kCorrupt
              ? absl::DataLossError("its remote copy failed a check and was quarantined recently")
              : absl::NotFoundError("the remote tier recently did not have it");
      continue;
    }
    absl::StatusOr<ProfileInfo> profile = Profile(keys[i]);
    if (!profile.ok()) {
      out[i] = profile.status();
      continue;
    }
    asked.push_back(i);
    remote_keys.push_back(RemoteKey(keys[i], profile->fingerprint));
    profiles.push_back(*profile);
  }
  if (asked.empty()) return out;

  // Each value is checked and copied into the local store (checksum fused
  // into the copy) while the reply is still in the connection's buffer.
  std::vector<absl::Status> stored(asked.size(),
                                   absl::NotFoundError("the remote value was not read"));
  std::vector<absl::Status> bad(asked.size(), absl::OkStatus());
  std::vector<absl::StatusOr<bool>> found =
      cluster_->GetMany(remote_keys, [&](size_t j, std::string_view value) {
        const BlockKey& key = keys[asked[j]];
        absl::StatusOr<RemoteValue> v = DecodeRemoteValue(
            value, remote_keys[j], profiles[j].fingerprint, profiles[j].block_bytes);
        if (!v.ok()) {
          bad[j] = v.status();
          return;
        }
        // A checksum of 0 would switch the put's check off: check it here.
        if (v->payload_checksum == 0 && BlockChecksum(v->payload) != 0) {
          bad[j] = absl::DataLossError("remote payload fails its checksum");
          return;
        }
        absl::StatusOr<PutOutcome> put =
            local_->Put(key, v->payload, {.expected_xxh3 = v->payload_checksum});
        if (put.ok()) {
          stored[j] = absl::OkStatus();
          stats_.Add(&RemoteTierStats::bytes_read, v->payload.size());
        } else if (put.status().code() == absl::StatusCode::kDataLoss) {
          bad[j] = absl::DataLossError(
              absl::StrCat("remote payload fails its checksum (", put.status().message(), ")"));
        } else if (put.status().code() == absl::StatusCode::kAlreadyExists) {
          stored[j] = absl::OkStatus();  // a local block under this id wins
        } else {
          stored[j] = put.status();
        }
      });
  for (size_t j = 0; j < asked.size(); ++j) {
    const BlockKey& key = keys[asked[j]];
    absl::Status& result = out[asked[j]];
    if (!found[j].ok()) {
      stats_.Add(&RemoteTierStats::unavailable);
      RememberMiss(key, /*corrupt=*/false);
      result = absl::UnavailableError(absl::StrCat("remote tier: ", found[j].status().message()));
    } else if (!*found[j]) {
      stats_.Add(&RemoteTierStats::misses);
      RememberMiss(key, /*corrupt=*/false);
      result = absl::NotFoundError("not in the remote tier");
    } else if (!bad[j].ok()) {
      Quarantine(key, remote_keys[j], bad[j]);
      result = absl::DataLossError(bad[j].message());
    } else {
      if (stored[j].ok()) stats_.Add(&RemoteTierStats::hits);
      result = stored[j];
    }
  }
  return out;
}

void RemoteStore::Quarantine(const BlockKey& key, const std::string& remote_key,
                             const absl::Status& why) {
  stats_.Add(&RemoteTierStats::corrupt);
  RememberMiss(key, /*corrupt=*/true);
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
  if (RecentMiss(key) != MissKind::kNone) {
    stats_.Add(&RemoteTierStats::miss_cache_hits);
    return false;
  }
  absl::StatusOr<ProfileInfo> profile = Profile(key);
  if (!profile.ok()) return false;
  absl::StatusOr<bool> exists = cluster_->Exists(RemoteKey(key, profile->fingerprint));
  if (!exists.ok()) {
    stats_.Add(&RemoteTierStats::unavailable);
    RememberMiss(key, /*corrupt=*/false);
    return false;
  }
  if (!*exists) {
    stats_.Add(&RemoteTierStats::misses);
    RememberMiss(key, /*corrupt=*/false);
  }
  return *exists;
}

absl::Status RemoteStore::MissStatus(const BlockKey& key, const absl::Status& local,
                                     const absl::Status& fetched) const {
  if (fetched.code() == absl::StatusCode::kDataLoss) {
    return absl::NotFoundError(absl::StrCat("DATA_LOSS: the remote copy of ", Describe(key),
                                            " failed its check (", fetched.message(),
                                            ") and was quarantined"));
  }
  if (fetched.code() == absl::StatusCode::kNotFound ||
      fetched.code() == absl::StatusCode::kUnavailable) {
    return local;
  }
  return fetched;
}

absl::StatusOr<std::unique_ptr<BlockView>> RemoteStore::View(const BlockKey& key, TierId* from) {
  std::vector<TierId> tiers;
  std::vector<absl::StatusOr<std::unique_ptr<BlockView>>> views =
      ViewMany(absl::MakeConstSpan(&key, 1), &tiers);
  if (from != nullptr) *from = tiers[0];
  return std::move(views[0]);
}

std::vector<absl::StatusOr<std::unique_ptr<BlockView>>> RemoteStore::ViewMany(
    absl::Span<const BlockKey> keys, std::vector<TierId>* from) {
  std::vector<absl::StatusOr<std::unique_ptr<BlockView>>> views = local_->ViewMany(keys, from);
  std::vector<BlockKey> missing;
  std::vector<size_t> where;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (views[i].status().code() != absl::StatusCode::kNotFound) continue;
    missing.push_back(keys[i]);
    where.push_back(i);
  }
  if (missing.empty()) return views;
  const std::vector<absl::Status> fetched = FetchMany(missing);
  for (size_t j = 0; j < missing.size(); ++j) {
    const size_t i = where[j];
    if (!fetched[j].ok()) {
      views[i] = MissStatus(keys[i], views[i].status(), fetched[j]);
      continue;
    }
    views[i] = local_->View(keys[i], &(*from)[i]);
    if (views[i].ok()) (*from)[i] = TierId::kRemote;
  }
  return views;
}

absl::Status RemoteStore::Get(const BlockKey& key, std::string* out, TierId* from) {
  absl::Status local = local_->Get(key, out, from);
  if (local.code() != absl::StatusCode::kNotFound) return local;
  absl::Status fetched = Fetch(key);
  if (!fetched.ok()) return MissStatus(key, local, fetched);
  KVTIER_RETURN_IF_ERROR(local_->Get(key, out, from));
  if (from != nullptr) *from = TierId::kRemote;
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> RemoteStore::AcquireHandles(
    const std::string& tenant, const std::vector<BlockKey>& keys, uint64_t ttl_ms,
    std::vector<absl::StatusOr<DeviceHandle>>* handles, const PinOptions& pin) {
  if (!pin.memory_only) {
    std::vector<BlockKey> absent;
    for (const BlockKey& key : keys) {
      if (key.tenant == tenant && !local_->Lookup(key).present) absent.push_back(key);
    }
    if (!absent.empty()) FetchMany(absent);  // each key's outcome shows in its handle
  }
  absl::StatusOr<uint64_t> lease = local_->AcquireHandles(tenant, keys, ttl_ms, handles, pin);
  if (!lease.ok() || !pin.memory_only) return lease;
  for (size_t i = 0; i < keys.size() && i < handles->size(); ++i) {
    absl::StatusOr<DeviceHandle>& h = (*handles)[i];
    if (h.ok() || h.status().code() != absl::StatusCode::kNotFound) continue;
    if (keys[i].tenant != tenant || RecentMiss(keys[i]) != MissKind::kNone) continue;
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
  for (const absl::Status& st : FetchMany(absent)) any |= st.ok();
  if (!any) {
    if (missing != nullptr) missing->insert(missing->end(), absent.begin(), absent.end());
    return out;
  }
  return local_->GetSummaries(keys, missing);
}

size_t RemoteStore::Prefetch(const std::vector<BlockKey>& keys) {
  size_t promoted = local_->Prefetch(keys);
  std::vector<BlockKey> absent;
  for (const BlockKey& key : keys) {
    if (!local_->Lookup(key).present) absent.push_back(key);
  }
  if (absent.empty()) return promoted;
  for (const absl::Status& st : FetchMany(absent)) promoted += st.ok() ? 1 : 0;
  return promoted;
}

absl::Status RemoteStore::Delete(const BlockKey& key) {
  {
    // No publish of this key may SET after the DEL below: drop the queued
    // ones and wait for one in flight to finish its SET.
    absl::MutexLock lock(&queue_mu_);
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (it->key != key) {
        ++it;
        continue;
      }
      buffered_bytes_ -= it->bytes.size();
      it = queue_.erase(it);
      stats_.Add(&RemoteTierStats::publish_cancelled);
      ++finished_;
    }
    auto idle = [this, &key]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) { return !in_flight_.contains(key); };
    queue_mu_.Await(absl::Condition(&idle));
  }
  absl::Status local = local_->Delete(key);
  if (!local.ok() && local.code() != absl::StatusCode::kNotFound) return local;
  RememberMiss(key, /*corrupt=*/false);
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
  if (*deleted) stats_.Add(&RemoteTierStats::deleted);
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
  if (!options_.publish || options_.policy != PublishPolicy::kWriteThrough) return;
  absl::MutexLock lock(&queue_mu_);
  if (stopping_ || queue_.size() >= options_.publish_queue_blocks) {
    stats_.Add(&RemoteTierStats::publish_dropped);
    return;
  }
  queue_.push_back(PublishJob{key, {}});
  ++enqueued_;
  queue_cv_.Signal();
}

void RemoteStore::OnRelease(const BlockKey& key, absl::Span<const uint8_t> bytes) {
  absl::MutexLock lock(&queue_mu_);
  if (stopping_ || queue_.size() >= options_.publish_queue_blocks ||
      buffered_bytes_ + bytes.size() > options_.writeback_buffer_bytes) {
    stats_.Add(&RemoteTierStats::publish_dropped);
    return;
  }
  queue_.push_back(
      PublishJob{key, std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size())});
  buffered_bytes_ += bytes.size();
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
    PublishJob job;
    {
      absl::MutexLock lock(&queue_mu_);
      while (queue_.empty() && !stopping_) queue_cv_.Wait(&queue_mu_);
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      ++in_flight_[job.key];  // a Delete of this key now waits for it
    }
    Publish(job);
    absl::MutexLock lock(&queue_mu_);
    buffered_bytes_ -= job.bytes.size();  // held until sent
    if (auto it = in_flight_.find(job.key); --it->second == 0) in_flight_.erase(it);
    ++finished_;
  }
}

void RemoteStore::Publish(const PublishJob& job) {
  const BlockKey& key = job.key;
  absl::StatusOr<ProfileInfo> profile = Profile(key);
  std::string local;
  const std::string* data = &job.bytes;
  if (job.bytes.empty()) {
    TierId from = TierId::kHost;
    if (!profile.ok() || !local_->Get(key, &local, &from).ok()) {
      stats_.Add(&RemoteTierStats::publish_skipped);  // deleted, evicted or quarantined meanwhile
      return;
    }
    data = &local;
  } else if (!profile.ok()) {
    stats_.Add(&RemoteTierStats::publish_skipped);
    return;
  }
  if (options_.before_publish_set) options_.before_publish_set(key);
  const std::string remote_key = RemoteKey(key, profile->fingerprint);
  const auto payload =
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(data->data()), data->size());
  const auto header =
      EncodeRemoteHeader(remote_key, profile->fingerprint, data->size(), BlockChecksum(payload));
  const absl::Span<const uint8_t> pieces[] = {absl::MakeConstSpan(header), payload};
  if (absl::Status st = cluster_->Set(remote_key, pieces, options_.ttl_ms); !st.ok()) {
    stats_.Add(&RemoteTierStats::publish_failed);
    return;
  }
  stats_.Change([&](RemoteTierStats& s) {
    ++s.published;
    s.bytes_written += data->size();
  });
}

}  // namespace kvtier::remote
