// BlockStoreImpl: storing blocks (Put, PutPieces, staging slots); see
// block_store_impl.h.
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "storage/common/mutex_unlock.h"
#include "storage/common/random_id.h"
#include "storage/common/status_macros.h"
#include "storage/store/block_store_impl.h"
#include "storage/store/store_internal.h"

namespace kvtier {
namespace {

constexpr uint32_t kMaxStagingSlotsPerCall = 4096;

using store_internal::Checksum;
using store_internal::Describe;
using store_internal::UnknownProfile;

}  // namespace

// ---- Blocks ----------------------------------------------------------------

absl::StatusOr<PutOutcome> BlockStoreImpl::Put(const BlockKey& key, absl::Span<const uint8_t> data,
                                               const PutOptions& put) {
  {
    absl::MutexLock lock(&mu_);
    KVTIER_RETURN_IF_ERROR(CheckPayload(key, data.size()));
    if (!entries_.contains(key)) {
      return PutNewLocked(key, absl::MakeConstSpan(&data, 1), data.size(), put);
    }
  }
  return PutPrivate(key, data, std::nullopt, put);
}

absl::StatusOr<PutOutcome> BlockStoreImpl::PutPieces(
    const BlockKey& key, absl::Span<const absl::Span<const uint8_t>> pieces,
    const PutOptions& put) {
  if (pieces.size() == 1) return Put(key, pieces[0], put);
  uint64_t size = 0;
  for (const absl::Span<const uint8_t>& p : pieces) size += p.size();
  {
    absl::MutexLock lock(&mu_);
    KVTIER_RETURN_IF_ERROR(CheckPayload(key, size));
    if (!entries_.contains(key)) {
      return PutNewLocked(key, pieces, size, put);
    }
  }
  // Stored already, or being put right now: compared on a contiguous
  // private copy, as a put of identical bytes is rare.
  std::string flat(size, '\0');
  uint8_t* dst = reinterpret_cast<uint8_t*>(flat.data());
  const uint64_t checksum = GatherWithChecksum(pieces, dst);
  return PutPrivate(key, absl::MakeConstSpan(dst, size), checksum, put);
}

absl::StatusOr<PutOutcome> BlockStoreImpl::PutNewLocked(
    const BlockKey& key, absl::Span<const absl::Span<const uint8_t>> src, uint64_t size_bytes,
    const PutOptions& put) {
  mu_.AssertHeld();
  // CheckPayload found it; profiles are never removed.
  const ModelProfile profile = *ProfileOfLocked(key.tenant, key.profile_id);
  // A non-durable put may leave its summary to the summary thread.
  // Deferred blocks stay in host memory until summarised, so they may
  // hold at most a quarter of it: the rest stays free to evict.
  const bool defer = options_.summarize && summary_thread_.joinable() && !put.durable &&
                     !options_.write_through &&
                     deferred_summaries_ < options_.max_deferred_summaries &&
                     deferred_summary_bytes_ + size_bytes <= options_.host_capacity_bytes / 4;
  return InsertNewLocked(
      key, size_bytes, put, [&](absl::Span<uint8_t> dst) -> absl::StatusOr<FilledCopy> {
        FilledCopy filled;
        // Summarised here: chunk by chunk as it is copied, while in cache.
        std::unique_ptr<SummaryStream> stream;
        if (!defer && options_.summarize && options_.begin_summary) {
          stream = options_.begin_summary(profile);
        }
        if (stream != nullptr) {
          filled.checksum = GatherWithChecksum(
              src, dst.data(), [&](size_t written) { stream->Advance(dst.first(written)); });
        } else {
          filled.checksum = GatherWithChecksum(src, dst.data());
        }
        if (put.expected_xxh3 != 0 && put.expected_xxh3 != filled.checksum) {
          return absl::DataLossError(absl::StrCat("xxh3: the payload of ", Describe(key),
                                                  " does not match the checksum the client sent"));
        }
        if (defer) {
          filled.summary_deferred = true;
        } else if (stream != nullptr) {
          KVTIER_ASSIGN_OR_RETURN(filled.summary, stream->Finish(dst));
        } else if (options_.summarize) {
          KVTIER_ASSIGN_OR_RETURN(filled.summary, options_.summarize(profile, dst));
        }
        return filled;
      });
}

absl::StatusOr<PutOutcome> BlockStoreImpl::PutPrivate(const BlockKey& key,
                                                      absl::Span<const uint8_t> data,
                                                      std::optional<uint64_t> known_checksum,
                                                      const PutOptions& put) {
  ModelProfile profile;
  {
    absl::MutexLock lock(&mu_);
    KVTIER_RETURN_IF_ERROR(CheckPayload(key, data.size()));
    profile = *ProfileOfLocked(key.tenant, key.profile_id);
  }
  const uint64_t checksum = known_checksum ? *known_checksum : Checksum(data);
  if (put.expected_xxh3 != 0 && put.expected_xxh3 != checksum) {
    return absl::DataLossError(absl::StrCat("xxh3: the payload of ", Describe(key),
                                            " does not match the checksum the client sent"));
  }
  // The summary is computed only when the block is to be stored: a put of
  // a stored block (the common repeat of a shared prefix) is compared by
  // checksum and needs none.
  std::string summary;
  bool summarised = !options_.summarize;
  absl::MutexLock lock(&mu_);
  PutOutcome outcome;
  for (;;) {
    while (Entry* e = FindReadyLocked(key)) {
      if (e->quarantined) {
        // The correct bytes restore a quarantined block (looked up again
        // after waiting: it may be gone or restored meanwhile).
        e = WaitIdleLocked(key);
        if (e != nullptr && e->quarantined) KVTIER_RETURN_IF_ERROR(EraseLocked(e));
        continue;
      } else if (e->checksum != checksum || e->size_bytes != data.size()) {
        return absl::AlreadyExistsError(absl::StrCat(
            Describe(key), ": different bytes are already stored under this block_id"));
      } else {
        if (put.retain && !e->retained && e->persisting) {
          // The persist in flight writes the record it read before this
          // mark: wait for it, then look again, so that the mark is
          // written with the block before it is acknowledged.
          ++e->busy;  // nothing frees a busy entry while we wait
          while (e->persisting) idle_cv_.Wait(&mu_);
          --e->busy;
          idle_cv_.SignalAll();
          continue;
        }
        outcome.existed = true;
        policy_->Touch(*e->Fastest(), e);
        if (put.retain && !e->retained) {
          const TenantState& t = TenantLocked(key.tenant);
          KVTIER_RETURN_IF_ERROR(CheckQuota(key.tenant, "retained_bytes", t.usage.retained_bytes,
                                            e->size_bytes, t.limits.retained_bytes));
          if (e->durable) {
            // The mark must survive a restart with the block.
            BlockRecord record = RecordLocked(*e);
            record.retained = true;
            KVTIER_RETURN_IF_ERROR(catalog_->PutBlock(key, record));
          }
          SetRetainedLocked(e);
        }
        if (put.durable && !e->durable) KVTIER_RETURN_IF_ERROR(PersistLocked(e));
        outcome.tier = *e->Fastest();
        outcome.durable = e->durable;
        outcome.retained = e->retained;
        return outcome;
      }
    }
    if (summarised) break;
    {
      // Not stored: summarised outside the lock, then looked up again (it
      // may have been stored meanwhile).
      MutexUnlock unlocked(&mu_);
      KVTIER_ASSIGN_OR_RETURN(summary, options_.summarize(profile, data));
      if (summary.size() > kMaxSummaryBytes) {
        return absl::InternalError(
            absl::StrCat("summary of ", summary.size(), " bytes exceeds kMaxSummaryBytes"));
      }
    }
    summarised = true;
  }
  return InsertNewLocked(key, data.size(), put,
                         [&](absl::Span<uint8_t> dst) -> absl::StatusOr<FilledCopy> {
                           std::memcpy(dst.data(), data.data(), data.size());
                           return FilledCopy{checksum, std::move(summary)};
                         });
}

absl::StatusOr<PutOutcome> BlockStoreImpl::InsertNewLocked(
    const BlockKey& key, uint64_t size_bytes, const PutOptions& put,
    absl::FunctionRef<absl::StatusOr<FilledCopy>(absl::Span<uint8_t>)> fill) {
  mu_.AssertHeld();
  if (put.retain) {
    const TenantState& t = TenantLocked(key.tenant);
    KVTIER_RETURN_IF_ERROR(CheckQuota(key.tenant, "retained_bytes", t.usage.retained_bytes,
                                      size_bytes, t.limits.retained_bytes));
  }
  auto owned = std::make_unique<Entry>();
  Entry* e = owned.get();
  e->key = key;
  e->size_bytes = size_bytes;
  summary_bytes_ += e->summary.capacity();
  e->created_micros = static_cast<int64_t>(env_->WallMicros());
  e->last_access_micros = env_->NowMicros();
  e->busy = 1;  // and writing: invisible until filled
  entries_[key] = std::move(owned);
  if (put.retain) SetRetainedLocked(e);

  auto fail = [&](absl::Status st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    --e->busy;
    e->writing = false;
    if (e->durable) {
      // Never the case today (a durable entry was persisted, which is the
      // last step), but a record must not outlive its entry.
      absl::Status erased = EraseLocked(e);
      if (!erased.ok()) LogLocked(std::string(erased.message()));
    } else {
      ForgetLocked(e);
    }
    return st;
  };
  absl::Status room = MakeTenantHostRoomLocked(key.tenant, size_bytes);
  if (!room.ok()) return fail(room);
  absl::StatusOr<HostSlot> slot = MakeRoomHostLocked(size_bytes);
  if (!slot.ok()) {
    ReleaseHostInFlightLocked(key.tenant, size_bytes);
    return fail(slot.status());
  }
  auto dst = host_->Data(*slot);
  if (!dst.ok()) {
    ReleaseHostInFlightLocked(key.tenant, size_bytes);
    if (absl::Status st = host_->Free(*slot); !st.ok()) LogLocked(std::string(st.message()));
    return fail(dst.status());
  }
  // The slot is ours alone until e->host is set: the entry is writing, so
  // nothing reads, demotes or evicts it meanwhile.
  absl::StatusOr<FilledCopy> filled = absl::UnknownError("not filled");
  {
    MutexUnlock unlocked(&mu_);
    filled = fill(absl::MakeSpan(reinterpret_cast<uint8_t*>(dst->data()), size_bytes));
  }
  // Counted below (AddCopyLocked) or dropped, without releasing mu_.
  ReleaseHostInFlightLocked(key.tenant, size_bytes);
  if (filled.ok() && filled->summary.size() > kMaxSummaryBytes) {
    filled = absl::InternalError(
        absl::StrCat("summary of ", filled->summary.size(), " bytes exceeds kMaxSummaryBytes"));
  }
  if (!filled.ok()) {
    if (absl::Status st = host_->Free(*slot); !st.ok()) {
      LogLocked(absl::StrCat("host tier: ", st.message()));
    }
    return fail(filled.status());
  }
  e->checksum = filled->checksum;
  summary_bytes_ -= e->summary.capacity();
  e->summary = std::move(filled->summary);
  e->summary.shrink_to_fit();  // encoders grow strings; keep only the bytes
  summary_bytes_ += e->summary.capacity();
  e->host = *slot;
  AddCopyLocked(e, TierId::kHost);
  if (filled->summary_deferred) {
    // Stays busy (its host copy in place) until the summary is set.
    e->summary_state = Entry::SummaryState::kQueued;
    ++e->busy;
    ++deferred_summaries_;
    ++summaries_deferred_total_;
    deferred_summary_bytes_ += e->size_bytes;
    summary_queue_.push_back(key);
  }
  if (put.durable || options_.write_through) {
    absl::Status st = PersistLocked(e);
    if (!st.ok() && put.durable) return fail(st);
  }
  --e->busy;
  e->writing = false;
  idle_cv_.SignalAll();
  PutOutcome outcome;
  outcome.tier = *e->Fastest();
  outcome.durable = e->durable;
  outcome.retained = e->retained;
  return outcome;
}

absl::StatusOr<std::vector<StagingSlot>> BlockStoreImpl::ReserveStaging(const std::string& tenant,
                                                                        uint64_t profile_id,
                                                                        uint32_t count,
                                                                        uint64_t ttl_ms) {
  if (count == 0 || count > kMaxStagingSlotsPerCall) {
    return absl::InvalidArgumentError(
        absl::StrCat("count: ", count, " is outside 1..", kMaxStagingSlotsPerCall));
  }
  if (ttl_ms > options_.max_lease_ttl_ms) {
    return absl::InvalidArgumentError(
        absl::StrCat("lease_ttl_ms: ", ttl_ms, " exceeds the maximum ", options_.max_lease_ttl_ms));
  }
  absl::MutexLock lock(&mu_);
  size_t reaped = 0;
  KVTIER_RETURN_IF_ERROR(ReapLocked(&reaped));
  const ModelProfile* found = ProfileOfLocked(tenant, profile_id);
  if (found == nullptr) return UnknownProfile(profile_id);
  const ModelProfile& profile = *found;
  const uint64_t size = BlockSizeBytes(profile);
  {
    const TenantState& t = TenantLocked(tenant);
    KVTIER_RETURN_IF_ERROR(
        CheckQuota(tenant, "staging_slots", t.usage.staging_slots, count, t.limits.staging_slots));
  }
  KVTIER_ASSIGN_OR_RETURN(MemorySpace * space, SpaceLocked(tenant, /*staging=*/true));
  HostTier* staging = space->staging;
  const uint64_t deadline =
      env_->NowMicros() + 1000 * (ttl_ms == 0 ? options_.default_lease_ttl_ms : ttl_ms);
  std::vector<StagingSlot> out;
  for (uint32_t i = 0; i < count; ++i) {
    absl::StatusOr<HostSlot> slot = staging->Allocate(size);
    if (!slot.ok()) {
      for (const StagingSlot& s : out) {
        if (absl::Status st = staging->Free(staging_slots_[s.slot_id].slot); !st.ok()) {
          LogLocked(absl::StrCat("staging: ", st.message()));
        }
        staging_slots_.erase(s.slot_id);
      }
      TenantLocked(tenant).usage.staging_slots -= out.size();
      return absl::ResourceExhaustedError(
          absl::StrCat("staging area full (", staging->stats().capacity_bytes,
                       " bytes): release or use reserved slots first: ", slot.status().message()));
    }
    // Random ids: a tenant cannot guess another tenant's slot ids.
    uint64_t id = 0;
    while (id == 0 || staging_slots_.contains(id)) id = RandomId();
    staging_slots_[id] = StagingReservation{*slot, tenant, profile_id, deadline, staging};
    ++TenantLocked(tenant).usage.staging_slots;
    out.push_back(StagingSlot{id, slot->offset, slot->size_bytes, slot->generation});
  }
  return out;
}

absl::StatusOr<PutOutcome> BlockStoreImpl::PutFromStaging(const BlockKey& key,
                                                          const StagingSlot& slot,
                                                          const PutOptions& put) {
  HostSlot host_slot;
  HostTier* staging = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = staging_slots_.find(slot.slot_id);
    if (it == staging_slots_.end() || it->second.tenant != key.tenant ||
        it->second.slot.offset != slot.offset_bytes ||
        it->second.slot.generation != slot.generation ||
        it->second.slot.size_bytes != slot.size_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot: slot_id ", slot.slot_id,
                       " is not a reserved staging slot "
                       "(unknown, expired, already used, or offset/generation differ)"));
    }
    if (it->second.profile_id != key.profile_id) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot: slot_id ", slot.slot_id, " was reserved for another profile"));
    }
    host_slot = it->second.slot;
    staging = it->second.staging;
    staging_slots_.erase(it);
    --TenantLocked(key.tenant).usage.staging_slots;
  }
  auto data = staging->Data(host_slot);
  auto free_staging = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (absl::Status st = staging->Free(host_slot); !st.ok()) {
      LogLocked(absl::StrCat("staging: ", st.message()));
    }
  };
  if (!data.ok()) {
    absl::MutexLock lock(&mu_);
    free_staging();
    return data.status();
  }
  const auto src =
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(data->data()), data->size());
  // The slot is shared with the client, which may still be writing it: the
  // daemon stores one private copy, and checksum, summary and tiers all see
  // those same bytes. The staging file outlives its reservations.
  //
  // A block not stored yet (the common case) is copied straight into its
  // host-tier slot and hashed chunk by chunk as it is copied (one pass over
  // memory for copy and checksum); the summary is then taken from that
  // copy. Nothing else copies the bytes.
  {
    absl::MutexLock lock(&mu_);
    absl::Status payload = CheckPayload(key, src.size());
    if (!payload.ok()) {
      free_staging();
      return payload;
    }
    if (!entries_.contains(key)) {
      absl::StatusOr<PutOutcome> outcome =
          PutNewLocked(key, absl::MakeConstSpan(&src, 1), src.size(), put);
      free_staging();
      return outcome;
    }
  }
  // Stored already, or being put right now: compare (or wait) on a private
  // copy. It goes to a per-thread buffer that is reused (not zero-filled,
  // no page faults) for blocks up to kReusedPutBufferBytes.
  constexpr size_t kReusedPutBufferBytes = 4 << 20;
  thread_local std::unique_ptr<uint8_t[]> reused;
  thread_local size_t reused_size = 0;
  std::unique_ptr<uint8_t[]> once;
  uint8_t* copy = nullptr;
  const size_t n = src.size();
  if (n <= kReusedPutBufferBytes) {
    if (reused_size < n) {
      reused.reset(new uint8_t[n]);
      reused_size = n;
    }
    copy = reused.get();
  } else {
    once.reset(new uint8_t[n]);
    copy = once.get();
  }
  const uint64_t checksum = CopyWithChecksum(src, copy);
  {
    absl::MutexLock lock(&mu_);
    free_staging();
  }
  return PutPrivate(key, absl::MakeConstSpan(copy, n), checksum, put);
}

}  // namespace kvtier
