// BlockStoreImpl leases: pinning blocks into the device arena for clients
// (AcquireHandles, and MarkWanted before it), releasing and expiring
// leases (the rest of the implementation is in block_store_impl.cc and
// block_store_admin.cc).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "storage/common/mutex_unlock.h"
#include "storage/common/status_macros.h"
#include "storage/host/gpu_status.h"
#include "storage/store/block_store_impl.h"
#include "storage/store/store_internal.h"

namespace kvtier {

using store_internal::Checksum;
using store_internal::Describe;
using store_internal::HostPlace;

// ---- Pinning -----------------------------------------------------------------

namespace {
constexpr absl::string_view kPromotionDeferredUrl = "kvtier.store/promotion_deferred";
}  // namespace

absl::Status PromotionDeferredError(uint64_t limit_bytes) {
  absl::Status st = absl::UnavailableError(absl::StrCat(
      "the block is in host memory; its promotion to the device arena is deferred (this call "
      "promoted its limit of ",
      limit_bytes, " bytes)"));
  st.SetPayload(kPromotionDeferredUrl, absl::Cord("1"));
  return st;
}

bool IsPromotionDeferred(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable &&
         status.GetPayload(kPromotionDeferredUrl).has_value();
}

absl::StatusOr<uint64_t> BlockStoreImpl::AcquireHandles(
    const std::string& tenant, const std::vector<BlockKey>& keys, uint64_t ttl_ms,
    std::vector<absl::StatusOr<DeviceHandle>>* handles, const PinOptions& pin) {
  if (ttl_ms > options_.max_lease_ttl_ms) {
    return absl::InvalidArgumentError(
        absl::StrCat("lease_ttl_ms: ", ttl_ms, " exceeds the maximum ", options_.max_lease_ttl_ms));
  }
  handles->clear();
  absl::MutexLock lock(&mu_);
  KVTIER_RETURN_IF_ERROR(CheckLeaseQuotaLocked(tenant, pin.replaces_lease));
  KVTIER_ASSIGN_OR_RETURN(MemorySpace * space, SpaceLocked(tenant, /*staging=*/false));
  // The loop below may drop mu_ (promotions): the lease's place is held
  // until it is added (or not), with mu_ held again.
  ++TenantLocked(tenant).leases_pending;
  absl::Cleanup unreserve = [this, &tenant]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    --TenantLocked(tenant).leases_pending;
  };
  // The lease holds its entries (invariant 8), in a released lease's list
  // when one is spare: a Select's lease allocates nothing once warm.
  std::vector<Entry*> pinned;
  if (!spare_lists_.empty()) {
    pinned = std::move(spare_lists_.back());
    spare_lists_.pop_back();
  }
  pinned.clear();
  handles->reserve(keys.size());
  const uint64_t now = env_->NowMicros();  // one access time for the whole set
  // With mark_wanted every key is looked up once, here, and its entry kept
  // for the loop below. The loop drops mu_ while it copies; an entry found
  // here is used only while no entry has been freed since (forgotten_) and
  // it is not being written (a Delete in progress); otherwise it looks the
  // key up again, as it does for keys not found here.
  thread_local std::vector<Entry*> found;
  found.clear();
  const uint64_t forgotten_before = forgotten_;
  absl::Status deferred;  // PromotionDeferredError, made at the first deferral
  if (pin.mark_wanted) FindWantedLocked(keys, now, &found);
  for (size_t i = 0; i < keys.size(); ++i) {
    const BlockKey& key = keys[i];
    absl::Status valid = ValidateBlockKey(key);
    if (valid.ok() && key.tenant != tenant) {
      valid = absl::PermissionDeniedError(
          absl::StrCat(Describe(key), " belongs to another tenant than the lease's"));
    }
    if (!valid.ok()) {
      handles->push_back(valid);
      continue;
    }
    Entry* e = i < found.size() ? found[i] : nullptr;
    if (e == nullptr || e->writing || forgotten_ != forgotten_before) e = FindReadyLocked(key);
    CountReadLocked(e);
    if (e == nullptr) {
      handles->push_back(absl::NotFoundError(absl::StrCat(Describe(key), " is not stored")));
      continue;
    }
    if (absl::Status pinnable = CheckPinnableLocked(tenant, key, *e, pin, &deferred);
        !pinnable.ok()) {
      handles->push_back(pinnable);
      continue;
    }
    e->last_access_micros = now;
    ++e->busy;  // keeps every copy of e in place while we work on it
    absl::Status st;
    if (!e->device) {
      st = PromoteLocked(e, space, tenant, pin);
    } else {
      policy_->Touch(TierId::kDevice, e);
    }
    if (st.ok()) {
      if (e->pins++ == 0) {
        pinned_bytes_ += e->size_bytes;
        TenantLocked(tenant).usage.pinned_bytes += e->size_bytes;
      }
      pinned.push_back(e);
      handles->push_back(DeviceHandle{space->device->arena().arena_id, e->device->offset,
                                      e->size_bytes, e->device->generation});
    } else {
      handles->push_back(st);
    }
    --e->busy;
    idle_cv_.SignalAll();
  }
  if (pinned.empty()) {
    RecycleListLocked(std::move(pinned));
    return 0;
  }
  const uint64_t ttl = ttl_ms == 0 ? options_.default_lease_ttl_ms : ttl_ms;
  return leases_.Add(tenant, std::move(pinned), env_->NowMicros() + ttl * 1000);
}

void BlockStoreImpl::FindWantedLocked(const std::vector<BlockKey>& keys, uint64_t now,
                                      std::vector<Entry*>* found) {
  mu_.AssertHeld();
  found->reserve(keys.size());
  for (const BlockKey& key : keys) {
    auto it = entries_.find(key);
    Entry* e = it == entries_.end() ? nullptr : it->second.get();
    if (e != nullptr && (e->writing || e->quarantined)) e = nullptr;
    if (e != nullptr && policy_uses_wants_) policy_->Want(e, now);
    found->push_back(e);
  }
}

absl::Status BlockStoreImpl::CheckPinnableLocked(const std::string& tenant, const BlockKey& key,
                                                 const Entry& e, const PinOptions& pin,
                                                 absl::Status* deferred) {
  mu_.AssertHeld();
  if (e.quarantined) return QuarantinedError(key, "failed its checksum and is quarantined");
  if (e.pins == 0) {
    const TenantState& t = TenantLocked(tenant);
    KVTIER_RETURN_IF_ERROR(CheckQuota(tenant, "pinned_bytes", t.usage.pinned_bytes, e.size_bytes,
                                      t.limits.pinned_bytes));
  }
  if (pin.memory_only && !e.device && !e.host) {
    return absl::UnavailableError(
        absl::StrCat(Describe(key), " is on NVMe only; not read on this path"));
  }
  PromotionBudget* const budget = pin.budget;
  if (budget != nullptr && !e.device &&
      e.size_bytes > budget->limit_bytes - std::min(budget->limit_bytes, budget->promoted_bytes)) {
    // One status per call, copied (a reference count) for every block
    // deferred: nothing is allocated per block under the store's lock.
    if (deferred->ok()) *deferred = PromotionDeferredError(budget->limit_bytes);
    ++budget->deferred;
    return *deferred;
  }
  return absl::OkStatus();
}

absl::Status BlockStoreImpl::PromoteLocked(Entry* e, MemorySpace* space, const std::string& tenant,
                                           const PinOptions& pin) {
  mu_.AssertHeld();
  absl::Status st = EnsureHostCopyLocked(e);
  absl::StatusOr<DeviceSlot> slot =
      st.ok() ? MakeRoomDeviceLocked(space, tenant, e->size_bytes, pin.memory_only)
              : absl::StatusOr<DeviceSlot>(st);
  if (!slot.ok()) return slot.status();
  if (e->device) {
    space->device_alloc->Free(slot->offset, slot->size_bytes);  // promoted meanwhile
    return st;
  }
  auto src = host_->Data(*e->host);
  const HostSlot host_slot = *e->host;
  const uint64_t checksum = e->checksum;
  // Promotion verifies what it promotes: a damaged host copy never
  // reaches the arena clients read.
  const auto src_bytes =
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(src->data()), src->size());
  bool intact = false;
  {
    MutexUnlock unlocked(&mu_);
    intact = Checksum(src_bytes) == checksum;
    if (intact) {
      gpu::HostToArenaCopy copy{src->data(), slot->offset, slot->size_bytes};
      st = GpuToStatus(space->device->CopyToArena({&copy, 1}));
    }
  }
  if (!intact) {
    space->device_alloc->Free(slot->offset, slot->size_bytes);
    --e->busy;
    st = CheckCopyLocked(e, TierId::kHost, HostPlace("host slot", host_slot), src_bytes);
    ++e->busy;
    if (st.ok()) st = absl::InternalError("host copy changed while it was promoted");
  } else if (st.ok()) {
    e->device = *slot;
    AddCopyLocked(e, TierId::kDevice);
    ++promotions_[static_cast<int>(TierId::kDevice)];
    if (pin.budget != nullptr) pin.budget->promoted_bytes += e->size_bytes;
  } else {
    space->device_alloc->Free(slot->offset, slot->size_bytes);
  }
  return st;
}

absl::Status BlockStoreImpl::CheckLeaseQuotaLocked(const std::string& tenant,
                                                   uint64_t replaces_lease) {
  mu_.AssertHeld();
  const uint64_t limit = TenantLocked(tenant).limits.leases;
  if (limit == 0) return absl::OkStatus();
  // The lease a context's next Select replaces is released right after
  // this call: while it is held, the new one may be one over the limit.
  auto allowed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return limit + (replaces_lease != 0 && leases_.Holds(replaces_lease, tenant) ? 1 : 0);
  };
  // Leases being taken by concurrent calls count as held.
  auto held = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return leases_.CountOf(tenant) + TenantLocked(tenant).leases_pending;
  };
  if (held() >= allowed()) {
    size_t reaped = 0;  // expired leases free their places first
    KVTIER_RETURN_IF_ERROR(ReapLocked(&reaped));
  }
  if (held() < allowed()) return absl::OkStatus();
  return CheckQuota(tenant, "leases", held(), 1, limit);
}

void BlockStoreImpl::MarkWanted(absl::Span<const BlockKey> keys) {
  if (!policy_uses_wants_ || keys.empty()) return;
  const uint64_t now = env_->NowMicros();  // one time for the whole set
  absl::MutexLock lock(&mu_);
  for (const BlockKey& key : keys) {
    auto it = entries_.find(key);
    if (it == entries_.end()) continue;
    Entry* e = it->second.get();
    if (e->writing || e->quarantined) continue;
    policy_->Want(e, now);
  }
}

// ---- Leases ----------------------------------------------------------------

void BlockStoreImpl::UnpinLocked(Entry* e) {
  mu_.AssertHeld();
  if (e->pins > 0 && --e->pins == 0) {
    pinned_bytes_ -= e->size_bytes;
    TenantLocked(e->key.tenant).usage.pinned_bytes -= e->size_bytes;
  }
}

void BlockStoreImpl::RecycleListLocked(std::vector<Entry*> list) {
  mu_.AssertHeld();
  if (spare_lists_.size() < kMaxSpareLists && list.capacity() > 0 &&
      list.capacity() <= kMaxSparePerList) {
    spare_lists_.push_back(std::move(list));
  }
}

absl::StatusOr<uint32_t> BlockStoreImpl::Release(const std::string& tenant, uint64_t lease_id) {
  absl::MutexLock lock(&mu_);
  std::optional<Lease> lease = leases_.Remove(lease_id, tenant);
  if (!lease) {
    return absl::NotFoundError(
        absl::StrCat("lease_id ", lease_id, " is unknown (released or expired)"));
  }
  for (Entry* e : lease->blocks) UnpinLocked(e);
  const auto released = static_cast<uint32_t>(lease->blocks.size());
  RecycleListLocked(std::move(lease->blocks));
  return released;
}

absl::Status BlockStoreImpl::ReapLocked(size_t* reaped) {
  mu_.AssertHeld();
  const uint64_t now = env_->NowMicros();
  for (Lease& lease : leases_.TakeExpired(now)) {
    for (Entry* e : lease.blocks) UnpinLocked(e);
    RecycleListLocked(std::move(lease.blocks));
    ++*reaped;
  }
  for (auto it = staging_slots_.begin(); it != staging_slots_.end();) {
    if (it->second.deadline_micros <= now) {
      if (absl::Status st = it->second.staging->Free(it->second.slot); !st.ok()) {
        LogLocked(absl::StrCat("staging: ", st.message()));
      }
      --TenantLocked(it->second.tenant).usage.staging_slots;
      staging_slots_.erase(it++);
      ++*reaped;
    } else {
      ++it;
    }
  }
  return absl::OkStatus();
}

size_t BlockStoreImpl::ReapExpired() {
  absl::MutexLock lock(&mu_);
  size_t reaped = 0;
  if (absl::Status st = ReapLocked(&reaped); !st.ok()) LogLocked(std::string(st.message()));
  return reaped;
}

}  // namespace kvtier
