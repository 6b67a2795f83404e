// BlockStoreImpl: persisting blocks to NVMe and making room in every tier
// (eviction and demotion); see block_store_impl.h.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "storage/common/mutex_unlock.h"
#include "storage/common/status_macros.h"
#include "storage/host/gpu_status.h"
#include "storage/store/block_store_impl.h"
#include "storage/store/store_internal.h"

namespace kvtier {
namespace {

using store_internal::Checksum;
using store_internal::Describe;
using store_internal::HostPlace;
using store_internal::ToExtent;

}  // namespace

// ---- Space -----------------------------------------------------------------

absl::Status BlockStoreImpl::PersistLocked(Entry* e) {
  mu_.AssertHeld();
  // The record carries the summary (may release mu_; e stays: busy).
  ++e->busy;
  EnsureSummaryLocked(e);
  --e->busy;
  idle_cv_.SignalAll();
  while (e->persisting) {
    ++e->busy;  // nothing frees a busy entry while we wait
    idle_cv_.Wait(&mu_);
    --e->busy;
    idle_cv_.SignalAll();
  }
  if (e->durable) return absl::OkStatus();
  if (e->quarantined) {
    return QuarantinedError(e->key, "failed its checksum and is quarantined");
  }
  if (e->nvme) {
    // Its synced NVMe copy is kept, but a failed removal left its record's
    // fate unknown: write the record again.
    BlockRecord record = RecordLocked(*e);
    record.durable = true;
    KVTIER_RETURN_IF_ERROR(catalog_->PutBlock(e->key, record));
    e->durable = true;
    return absl::OkStatus();
  }
  if (!e->host && !e->device) {
    return absl::InternalError(absl::StrCat(Describe(e->key), " has no copy to persist"));
  }
  ++e->busy;
  e->persisting = true;
  uint64_t in_flight = 0;  // reserved against the tenant's nvme_bytes
  auto finish = [&](absl::Status st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    TenantLocked(e->key.tenant).nvme_in_flight -= in_flight;
    --e->busy;
    e->persisting = false;
    idle_cv_.SignalAll();
    return st;
  };
  if (absl::Status quota = ReserveNvmeLocked(e); !quota.ok()) return finish(quota);
  in_flight = e->size_bytes;
  PersistWrite w;
  w.key = e->key;
  w.record = RecordLocked(*e);
  w.size = e->size_bytes;
  w.host = e->host;
  w.device = e->device;
  w.device_ops = w.device ? SpaceOfLocked(*e)->device : nullptr;
  {
    MutexUnlock unlocked(&mu_);
    // The entry is busy: its host and device copies stay where they are.
    WritePersistCopy(e, &w);
  }
  absl::Status st = w.status;
  if (st.ok() && !w.intact) {
    const TierId tier = w.host ? TierId::kHost : TierId::kDevice;
    std::string place = w.host ? HostPlace("host slot", *w.host)
                               : absl::StrCat("device arena @ ", w.device->offset);
    --e->busy;  // so that the quarantine can free its copies
    st = CheckCopyLocked(e, tier, std::move(place), absl::MakeConstSpan(w.src, w.size));
    ++e->busy;
    if (st.ok()) st = absl::InternalError("copy changed while it was being persisted");
  }
  if (!w.freed.ok()) {
    LogLocked(absl::StrCat("nvme: extent ", w.loc->ToString(), " of ", Describe(w.key),
                           " after a failed persist: ", w.freed.message()));
  }
  // The synced record write also synced earlier evictions' removals.
  ReleaseSettledLocked();
  if (!st.ok()) return finish(st);
  e->nvme = *w.loc;
  e->durable = true;
  AddCopyLocked(e, TierId::kNvme);
  return finish(absl::OkStatus());
}

absl::Status BlockStoreImpl::ReserveNvmeLocked(Entry* e) {
  mu_.AssertHeld();
  // The tenant's own NVMe blocks make room for it under its quota, which
  // counts the tenant's other persists in flight.
  while (true) {
    TenantState& t = TenantLocked(e->key.tenant);
    absl::Status quota =
        CheckQuota(e->key.tenant, "nvme_bytes", t.usage.nvme_bytes + t.nvme_in_flight,
                   e->size_bytes, t.limits.nvme_bytes);
    if (quota.ok()) {
      t.nvme_in_flight += e->size_bytes;
      return absl::OkStatus();
    }
    absl::Status evicted = EvictOneNvmeLocked(&e->key.tenant, e);
    if (!evicted.ok()) {
      return absl::Status(quota.code(), absl::StrCat(quota.message(), "; ", evicted.message()));
    }
  }
}

void BlockStoreImpl::WritePersistCopy(const Entry* self, PersistWrite* w) {
  absl::Status& st = w->status;
  if (w->host) {
    auto data = host_->Data(*w->host);
    st = data.status();
    if (st.ok()) w->src = reinterpret_cast<const uint8_t*>(data->data());
  } else {
    w->device_copy.resize(w->size);
    gpu::ArenaToHostCopy copy{w->device->offset, w->device_copy.data(), w->size};
    st = GpuToStatus(w->device_ops->CopyToHost({&copy, 1}));
    w->src = w->device_copy.data();
  }
  const auto src = absl::MakeConstSpan(w->src, w->size);
  w->intact = st.ok() && Checksum(src) == w->record.checksum;
  const bool intact = w->intact;
  absl::StatusOr<NvmeLocation>& loc = w->loc;
  const uint64_t sync_failures_before = nvme_->sync_failures();
  if (st.ok() && intact) {
    loc = WriteNvmeMakingRoom(src, self);
    st = loc.status();
  }
  if (st.ok() && intact) st = nvme_->Sync();
  if (st.ok() && intact && nvme_->sync_failures() != sync_failures_before) {
    // A sync that failed after this write may have dropped its pages; the
    // successful one cannot vouch for them.
    st = absl::UnavailableError(
        absl::StrCat("an NVMe sync failed while the block was being written (",
                     nvme_->last_sync_error().message(), "); not durable, retry the put"));
  }
  bool record_unknown = false;  // the record may or may not be on disk
  if (st.ok() && intact) {
    w->record.nvme = ToExtent(*loc);
    w->record.durable = true;
    st = catalog_->PutBlock(w->key, w->record);
    record_unknown = !st.ok();
  }
  if (!st.ok() && loc.ok()) {
    // A failed catalog write may still have reached the WAL, and a restart
    // would replay a record naming this extent. A synced removal of the
    // record settles it; if that fails too, the extent stays allocated
    // until the next Open, whose reconciliation frees it unless a record
    // names it (then the synced bytes are that block).
    absl::Status undone = record_unknown ? catalog_->DeleteBlock(w->key) : absl::OkStatus();
    if (!undone.ok()) {
      w->freed =
          absl::DataLossError(absl::StrCat("kept allocated until restart (the catalog write "
                                           "failed: ",
                                           st.message(),
                                           "; removing the record "
                                           "failed too: ",
                                           undone.message(), ")"));
    } else {
      w->freed = nvme_->Free(*loc);
    }
  }
}

absl::StatusOr<NvmeLocation> BlockStoreImpl::WriteNvmeMakingRoom(absl::Span<const uint8_t> data,
                                                                 const Entry* self) {
  absl::StatusOr<NvmeLocation> loc = absl::UnknownError("not written");
  while (true) {
    loc = nvme_->Write(data);
    if (!NvmeTier::IsTierFull(loc.status())) return loc;
    // The NVMe tier is full: it is the last tier, so a victim goes (unless
    // evicted blocks' space is only waiting for its removal to be synced),
    // and the catalog sync that frees its extent runs without mu_.
    absl::Status evicted;
    {
      absl::MutexLock lock(&mu_);
      ReleaseSettledLocked();
      evicted = pending_frees_.empty() ? EvictOneNvmeLocked(nullptr, self) : absl::OkStatus();
      if (evicted.ok()) evicted = SettlePendingFreesLocked();
    }
    if (!evicted.ok()) {
      return absl::Status(evicted.code(),
                          absl::StrCat(loc.status().message(), "; ", evicted.message()));
    }
  }
}

absl::Status BlockStoreImpl::EvictOneNvmeLocked(const std::string* tenant, const Entry* self) {
  mu_.AssertHeld();
  // Every NVMe copy is a durable one, and a durable block survives a crash
  // until it is evicted: its NVMe copy goes only with the whole block, so
  // pinned blocks are not candidates.
  Entry* victim = policy_->Victim(TierId::kNvme, [&](const Entry& x) {
    return &x != self && x.busy == 0 && !x.writing && !x.persisting && !x.retained && x.pins == 0 &&
           (tenant == nullptr || x.key.tenant == *tenant);
  });
  if (victim == nullptr) {
    NvmeTierStats n = nvme_->stats();
    return absl::ResourceExhaustedError(absl::StrCat(
        "nvme tier: no block ", tenant ? absl::StrCat("of tenant \"", *tenant, "\" ") : "",
        "can be evicted (", n.used_bytes, " of ", n.capacity_bytes,
        " bytes used; every block on it is retained, pinned or in use)"));
  }
  // The record goes first, unsynced: its extent stays allocated until the
  // removal is synced, so no record a power loss brings back names reused
  // space (such a block comes back with its own bytes). If the removal
  // fails nothing is freed; it may still have reached the WAL, so the
  // block is no longer durable.
  absl::Status st = catalog_->DeleteBlock(victim->key, /*sync=*/false);
  if (!st.ok()) {
    victim->durable = false;
    return absl::Status(st.code(),
                        absl::StrCat("removing the catalog record of ", Describe(victim->key), ": ",
                                     st.message(), " (it may still take effect at restart)"));
  }
  if (victim->nvme) {
    pending_frees_.push_back(
        PendingFree{*victim->nvme, catalog_->writes_done(), victim->key, victim->size_bytes});
    pending_free_bytes_ += victim->size_bytes;
    DropCopyLocked(victim, TierId::kNvme, /*free_extent=*/false);
  }
  ForgetLocked(victim);
  ++evicted_blocks_;
  return absl::OkStatus();
}

void BlockStoreImpl::ReleaseSettledLocked() {
  mu_.AssertHeld();
  const uint64_t synced = catalog_->synced_through();
  while (!pending_frees_.empty() && pending_frees_.front().ticket <= synced) {
    const PendingFree& f = pending_frees_.front();
    if (absl::Status st = nvme_->Free(f.location); !st.ok()) {
      LogLocked(absl::StrCat("nvme tier: freeing extent ", f.location.ToString(), " of evicted ",
                             Describe(f.key), ": ", st.message()));
    }
    pending_free_bytes_ -= f.size_bytes;
    pending_frees_.pop_front();
  }
}

absl::Status BlockStoreImpl::SettlePendingFreesLocked() {
  mu_.AssertHeld();
  ReleaseSettledLocked();
  if (pending_frees_.empty()) return absl::OkStatus();
  absl::Status st;
  {
    MutexUnlock unlocked(&mu_);
    st = catalog_->SyncWal();
  }
  ReleaseSettledLocked();
  if (!st.ok()) {
    return absl::Status(st.code(),
                        absl::StrCat("freeing the NVMe space of evicted blocks: ", st.message()));
  }
  return absl::OkStatus();
}

void BlockStoreImpl::SetReleaseListener(ReleaseListener listener) {
  absl::MutexLock lock(&mu_);
  release_listener_ = std::move(listener);
}

void BlockStoreImpl::NotifyReleaseLocked(const Entry& e) {
  mu_.AssertHeld();
  if (!release_listener_ || !e.host) return;
  auto data = host_->Data(*e.host);
  if (!data.ok()) return;
  release_listener_(
      e.key, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(data->data()), data->size()));
}

bool BlockStoreImpl::FreeOneHostCopyLocked(const std::function<bool(const Entry&)>& accept,
                                           absl::flat_hash_set<BlockKey>* stuck,
                                           absl::Status* why) {
  mu_.AssertHeld();
  Entry* victim = policy_->Victim(TierId::kHost, [&](const Entry& e) {
    return e.busy == 0 && !e.writing && accept(e) && !stuck->contains(e.key);
  });
  if (victim == nullptr) return false;
  if (victim->Copies() > 1 || victim->quarantined) {
    if (!victim->quarantined && !victim->device) NotifyReleaseLocked(*victim);
    DropCopyLocked(victim, TierId::kHost);
    return true;
  }
  const BlockKey key = victim->key;
  absl::Status st = PersistLocked(victim);  // releases mu_; victim stays (not freed while busy)
  if (st.ok()) {
    // Now on NVMe: the host copy goes unless someone started using it.
    if (victim->busy == 0 && victim->host && victim->Copies() > 1) {
      if (!victim->device) NotifyReleaseLocked(*victim);
      DropCopyLocked(victim, TierId::kHost);
      ++demotions_;
    }
    return true;
  }
  if (st.code() == absl::StatusCode::kResourceExhausted && !victim->retained && victim->pins == 0 &&
      victim->busy == 0 && !victim->writing && !victim->durable) {
    // NVMe has no room for it either: the cache gives the block up.
    if (!victim->device) NotifyReleaseLocked(*victim);
    ForgetLocked(victim);  // not durable: it has no catalog record
    ++evicted_blocks_;
    return true;
  }
  stuck->insert(key);
  *why = st;
  return true;
}

absl::Status BlockStoreImpl::MakeTenantHostRoomLocked(const std::string& tenant,
                                                      uint64_t size_bytes, bool memory_only) {
  mu_.AssertHeld();
  absl::flat_hash_set<BlockKey> stuck;
  absl::Status why;
  while (true) {
    TenantState& t = TenantLocked(tenant);
    const uint64_t used = t.usage.host_bytes + t.host_in_flight;
    if (t.limits.host_bytes == 0 || used + size_bytes <= t.limits.host_bytes) {
      t.host_in_flight += size_bytes;
      return absl::OkStatus();
    }
    const bool freed = FreeOneHostCopyLocked(
        [&](const Entry& e) {
          return e.key.tenant == tenant && (!memory_only || e.Copies() > 1 || e.quarantined);
        },
        &stuck, &why);
    if (!freed) {
      absl::Status quota = CheckQuota(tenant, "host_bytes", used, size_bytes, t.limits.host_bytes);
      if (why.ok()) return quota;
      return absl::Status(
          quota.code(),
          absl::StrCat(quota.message(), " and demotion to nvme failed: ", why.message()));
    }
  }
}

void BlockStoreImpl::ReleaseHostInFlightLocked(const std::string& tenant, uint64_t size_bytes) {
  mu_.AssertHeld();
  TenantLocked(tenant).host_in_flight -= size_bytes;
}

absl::StatusOr<HostSlot> BlockStoreImpl::MakeRoomHostLocked(uint64_t size_bytes, bool memory_only) {
  mu_.AssertHeld();
  absl::flat_hash_set<BlockKey> stuck;
  absl::Status why;
  while (true) {
    absl::StatusOr<HostSlot> slot = host_->Allocate(size_bytes);
    if (slot.ok() || slot.status().code() != absl::StatusCode::kResourceExhausted) return slot;
    const bool freed = FreeOneHostCopyLocked(
        [memory_only](const Entry& e) { return !memory_only || e.Copies() > 1 || e.quarantined; },
        &stuck, &why);
    if (!freed) {
      HostTierStats s = host_->stats();
      std::string msg = absl::StrCat("host tier full: ", s.used_bytes, " of ", s.capacity_bytes,
                                     " bytes used and every block in it is in use");
      if (!why.ok()) {
        absl::StrAppend(&msg, ", pinned, or retained and cannot be demoted: ", why.message());
      }
      return absl::ResourceExhaustedError(msg);
    }
  }
}

absl::StatusOr<DeviceSlot> BlockStoreImpl::MakeRoomDeviceLocked(MemorySpace* space,
                                                                const std::string& tenant,
                                                                uint64_t size_bytes,
                                                                bool memory_only) {
  mu_.AssertHeld();
  ExtentAllocator* alloc = space->device_alloc.get();
  // memory_only: set once host memory could not take a last copy; from
  // then on only copies that have another copy are victims.
  bool last_copies_stay = false;
  while (true) {
    std::optional<uint64_t> offset = alloc->Allocate(size_bytes);
    if (offset) return DeviceSlot{*offset, size_bytes, next_device_generation_++};
    if (alloc->RoundUp(size_bytes) > alloc->capacity_bytes()) {
      return absl::ResourceExhaustedError(absl::StrCat("device arena of ", alloc->capacity_bytes(),
                                                       " bytes is smaller than one block"));
    }
    // Only copies in this arena make room in it.
    Entry* victim = policy_->Victim(TierId::kDevice, [&](const Entry& e) {
      return e.pins == 0 && e.busy == 0 && !e.writing &&
             (!multi_tenant_ || e.key.tenant == tenant) &&
             (!last_copies_stay || e.Copies() > 1 || e.quarantined);
    });
    if (victim == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "device tier full: ", alloc->used_bytes(), " of ", alloc->capacity_bytes(), " bytes of ",
          multi_tenant_ ? absl::StrCat("tenant \"", tenant, "\"'s arena") : "the arena",
          " used and every block in it is pinned or in use"));
    }
    if (victim->Copies() == 1 && !victim->quarantined) {
      absl::Status st = EnsureHostCopyLocked(victim, memory_only);
      if (!st.ok() && !victim->quarantined) {  // a corrupt victim just goes
        if (memory_only && st.code() == absl::StatusCode::kResourceExhausted) {
          last_copies_stay = true;  // host memory is full of last copies
          continue;
        }
        return st;
      }
    }
    if (victim->pins == 0 && victim->busy == 0) DropCopyLocked(victim, TierId::kDevice);
  }
}

absl::Status BlockStoreImpl::EnsureHostCopyLocked(Entry* e, bool memory_only) {
  mu_.AssertHeld();
  if (e->host) return absl::OkStatus();
  ++e->busy;
  absl::Status room = MakeTenantHostRoomLocked(e->key.tenant, e->size_bytes, memory_only);
  absl::StatusOr<HostSlot> slot =
      room.ok() ? MakeRoomHostLocked(e->size_bytes, memory_only) : absl::StatusOr<HostSlot>(room);
  if (room.ok() && !slot.ok()) ReleaseHostInFlightLocked(e->key.tenant, e->size_bytes);
  if (!slot.ok()) {
    --e->busy;
    idle_cv_.SignalAll();
    return slot.status();
  }
  auto data = host_->Data(*slot);
  uint8_t* dst = reinterpret_cast<uint8_t*>(data->data());
  absl::Status st;
  if (e->device) {
    DeviceSlot dslot = *e->device;
    gpu::DeviceOps* ops = SpaceOfLocked(*e)->device;
    const uint64_t checksum = e->checksum;  // constant while the entry lives
    bool intact = false;
    {
      MutexUnlock unlocked(&mu_);
      gpu::ArenaToHostCopy copy{dslot.offset, dst, dslot.size_bytes};
      st = GpuToStatus(ops->CopyToHost({&copy, 1}));
      intact = st.ok() && Checksum(absl::MakeConstSpan(dst, dslot.size_bytes)) == checksum;
    }
    if (st.ok() && !intact) {
      --e->busy;  // so that a quarantine can free the copies
      st = CheckCopyLocked(e, TierId::kDevice, absl::StrCat("device arena @ ", dslot.offset),
                           absl::MakeConstSpan(dst, dslot.size_bytes));
      ++e->busy;
    }
  } else if (e->nvme) {
    NvmeLocation loc = *e->nvme;
    uint64_t checksum = e->checksum;
    {
      MutexUnlock unlocked(&mu_);
      st = nvme_->Read(loc, checksum, absl::MakeSpan(dst, loc.length_bytes));
    }
    if (st.code() == absl::StatusCode::kDataLoss) {
      --e->busy;
      QuarantineLocked(e, TierId::kNvme, loc.ToString(), st);
      ++e->busy;
    }
  } else {
    st = absl::InternalError(absl::StrCat(Describe(e->key), " has no copy"));
  }
  --e->busy;
  idle_cv_.SignalAll();
  // Counted below (AddCopyLocked) or dropped, without releasing mu_.
  ReleaseHostInFlightLocked(e->key.tenant, e->size_bytes);
  if (!st.ok() || e->host || e->quarantined) {
    // Failed, or someone else promoted it. The slot was allocated above and
    // is exactly ours, so freeing it cannot fail.
    absl::Status freed = host_->Free(*slot);
    if (!freed.ok()) LogLocked(absl::StrCat("host tier: ", freed.message()));
    if (e->quarantined) {
      return QuarantinedError(e->key, absl::StrCat("failed its checksum: ", st.message()));
    }
    return st;
  }
  e->host = *slot;
  AddCopyLocked(e, TierId::kHost);
  if (!e->device) ++promotions_[static_cast<int>(TierId::kHost)];  // from NVMe
  return absl::OkStatus();
}

}  // namespace kvtier
