// BlockStoreImpl administration: Stats, listing, Verify, Evict and Drain (the
// rest of the implementation is in block_store_impl.cc and
// block_store_leases.cc).
#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

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

// ---- Administration --------------------------------------------------------

BlockStoreStats BlockStoreImpl::Stats() {
  BlockStoreStats stats;
  HostTierStats host = host_->stats();
  absl::MutexLock lock(&mu_);
  ReleaseSettledLocked();
  NvmeTierStats nvme = nvme_->stats();
  TierUsage& d = stats.tiers[0];
  d.tier = TierId::kDevice;
  d.capacity_bytes = device_capacity_bytes_;
  if (multi_tenant_) {
    d.backend = "per-tenant arenas";
    d.location = absl::StrCat(spaces_.size(), " tenant arenas, ", arena_bytes_, " bytes");
    for (const auto& [tenant, space] : spaces_) {
      if (space->device_alloc) d.used_bytes += space->device_alloc->used_bytes();
    }
  } else {
    const gpu::ArenaInfo& arena = shared_.device->arena();
    d.backend = arena.backend;
    d.location = arena.shm_path.empty() ? arena.backend : arena.shm_path;
    d.used_bytes = shared_.device_alloc->used_bytes();
  }
  d.pinned_bytes = pinned_bytes_;
  d.blocks = blocks_in_tier_[0];
  TierUsage& h = stats.tiers[1];
  h.tier = TierId::kHost;
  h.backend = "dram";
  h.location = host_->path();
  h.capacity_bytes = host.capacity_bytes;
  h.used_bytes = host.used_bytes;
  h.blocks = blocks_in_tier_[1];
  if (prefaulter_ != nullptr) {
    for (TierUsage* t : {&d, &h}) {
      const PrefaultStats p = prefaulter_->stats(static_cast<int>(t->tier));
      t->prefault_target_bytes = p.target_bytes;
      t->prefaulted_bytes = p.done_bytes;
      t->prefault_failed_bytes = p.failed_bytes;
      t->prefault_error = p.last_error;
    }
  }
  TierUsage& n = stats.tiers[2];
  n.tier = TierId::kNvme;
  n.backend = nvme.direct_io ? "nvme (O_DIRECT)" : "nvme (buffered)";
  n.location = options_.nvme_dir;
  n.capacity_bytes = nvme.capacity_bytes;
  n.used_bytes = nvme.used_bytes;
  n.releasing_bytes = pending_free_bytes_;
  n.blocks = blocks_in_tier_[2];
  stats.blocks = entries_.size();
  stats.profiles = profile_count_;
  stats.active_leases = leases_.size();
  stats.quarantined_blocks = quarantined_;
  for (int t = 0; t < kNumTiers; ++t) stats.checksum_failures[t] = checksum_failures_[t];
  stats.evicted_blocks = evicted_blocks_;
  stats.summaries_deferred = summaries_deferred_total_;
  stats.summaries_pending = deferred_summaries_;
  stats.view_bytes = view_bytes_;
  stats.views_copied_over_cap = views_copied_over_cap_;
  for (int t = 0; t < kNumTiers; ++t) {
    stats.reads_from[t] = reads_from_[t];
    stats.promotions[t] = promotions_[t];
  }
  stats.read_misses = read_misses_;
  stats.demotions = demotions_;
  stats.retained_bytes = retained_bytes_;
  stats.staging_slots = staging_slots_.size();
  // Estimate: Entry, the map slot (key inline + pointer, at ~80% load),
  // two heap copies of a 32-byte id, one placement list node, malloc
  // headers, and the summaries' actual allocation (measured by
  // bench/putget's metadata probe within a few percent).
  const uint64_t blocks = std::max<uint64_t>(1, entries_.size());
  stats.metadata_bytes_per_block = sizeof(Entry) + (sizeof(BlockKey) + sizeof(void*)) * 5 / 4 +
                                   2 * 48 + 40 + 16 + summary_bytes_ / blocks;
  return stats;
}

void BlockStoreImpl::ForEachBlock(
    uint64_t profile_id, const std::function<void(const BlockKey&, const BlockLocation&)>& fn) {
  std::vector<std::pair<BlockKey, BlockLocation>> snapshot;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, entry] : entries_) {
      if (profile_id != 0 && key.profile_id != profile_id) continue;
      BlockLocation loc = LocationLocked(*entry);
      if (loc.present) snapshot.emplace_back(key, loc);
    }
  }
  for (const auto& [key, loc] : snapshot) fn(key, loc);
}

void BlockStoreImpl::ForEachQuarantined(uint64_t profile_id,
                                        const std::function<void(const QuarantinedBlock&)>& fn) {
  std::vector<QuarantinedBlock> snapshot;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, entry] : entries_) {
      if (!entry->quarantined || (profile_id != 0 && key.profile_id != profile_id)) continue;
      QuarantinedBlock q;
      q.key = key;
      if (entry->quarantine) {
        q.tier = entry->quarantine->tier;
        q.location = entry->quarantine->location;
        q.reason = entry->quarantine->reason;
        q.found_micros = entry->quarantine->found_micros;
      } else {
        q.reason = "found before the last restart";
      }
      snapshot.push_back(std::move(q));
    }
  }
  for (const QuarantinedBlock& q : snapshot) fn(q);
}

absl::Status BlockStoreImpl::Verify(
    uint64_t profile_id, const std::function<void(uint64_t, uint64_t, const BlockKey*)>& progress) {
  std::vector<BlockKey> keys;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, entry] : entries_) {
      if ((profile_id == 0 || key.profile_id == profile_id) && !entry->quarantined) {
        keys.push_back(key);
      }
    }
  }
  std::vector<uint8_t> buffer;
  uint64_t done = 0;
  for (const BlockKey& key : keys) {
    bool corrupt = false;
    for (TierId tier : {TierId::kDevice, TierId::kHost, TierId::kNvme}) {
      absl::MutexLock lock(&mu_);
      auto it = entries_.find(key);
      if (it == entries_.end() || it->second->writing || it->second->quarantined) break;
      Entry* e = it->second.get();
      if (!e->Has(tier)) continue;
      ++e->busy;
      const uint64_t checksum = e->checksum;
      absl::Status st;
      std::string place;
      bool intact = true;
      if (tier == TierId::kNvme) {
        NvmeLocation loc = *e->nvme;
        place = loc.ToString();
        {
          MutexUnlock unlocked(&mu_);
          buffer.resize(loc.length_bytes);
          st = nvme_->Read(loc, checksum, absl::MakeSpan(buffer));
        }
        intact = st.code() != absl::StatusCode::kDataLoss;
      } else if (tier == TierId::kHost) {
        auto data = host_->Data(*e->host);
        place = HostPlace("host slot", *e->host);
        st = data.status();
        MutexUnlock unlocked(&mu_);
        if (st.ok()) {
          buffer.assign(reinterpret_cast<const uint8_t*>(data->data()),
                        reinterpret_cast<const uint8_t*>(data->data()) + data->size());
          intact = Checksum(buffer) == checksum;
        }
      } else {
        DeviceSlot slot = *e->device;
        gpu::DeviceOps* ops = SpaceOfLocked(*e)->device;
        place = absl::StrCat("device arena @ ", slot.offset);
        MutexUnlock unlocked(&mu_);
        buffer.resize(slot.size_bytes);
        gpu::ArenaToHostCopy copy{slot.offset, buffer.data(), slot.size_bytes};
        st = GpuToStatus(ops->CopyToHost({&copy, 1}));
        if (st.ok()) intact = Checksum(buffer) == checksum;
      }
      --e->busy;
      idle_cv_.SignalAll();
      if (!intact) {
        if (tier == TierId::kNvme) {
          QuarantineLocked(e, tier, std::move(place), st);
          corrupt = true;
        } else {
          // Re-checks the buffer and quarantines; its status is the verdict.
          corrupt = !CheckCopyLocked(e, tier, std::move(place), buffer).ok();
        }
        if (corrupt) break;
      }
      if (!st.ok()) return st;
    }
    ++done;
    progress(done, keys.size(), corrupt ? &key : nullptr);
  }
  if (keys.empty()) progress(0, 0, nullptr);
  return absl::OkStatus();
}

std::vector<ModelProfile> BlockStoreImpl::ListProfiles() {
  absl::MutexLock lock(&mu_);
  std::vector<ModelProfile> out;
  out.reserve(profile_count_);
  for (const auto& [id, list] : profiles_) out.insert(out.end(), list.begin(), list.end());
  std::sort(out.begin(), out.end(), [](const ModelProfile& a, const ModelProfile& b) {
    return std::tie(a.profile_id, a.owner) < std::tie(b.profile_id, b.owner);
  });
  return out;
}

absl::Status BlockStoreImpl::Evict(const BlockKey& key, TierId tier) {
  if (tier == TierId::kRemote) {
    return absl::InvalidArgumentError("tier: the remote tier is not a local tier");
  }
  KVTIER_RETURN_IF_ERROR(ValidateBlockKey(key));
  const std::string tier_name(TierName(tier));
  {
    absl::MutexLock lock(&mu_);
    Entry* e = WaitIdleLocked(key);
    if (e == nullptr || e->quarantined) {
      return absl::NotFoundError(absl::StrCat(Describe(key), " is not stored"));
    }
    if (tier != TierId::kNvme && !e->Has(tier)) {
      return absl::NotFoundError(
          absl::StrCat(Describe(key), " has no copy in the ", tier_name, " tier"));
    }
    if (e->pins > 0 && tier != TierId::kHost) {
      return absl::FailedPreconditionError(
          absl::StrCat(Describe(key), " is pinned by a lease (", e->pins, ")"));
    }
    switch (tier) {
      case TierId::kDevice:
        if (e->Copies() == 1) {
          KVTIER_RETURN_IF_ERROR(EnsureHostCopyLocked(e));
          e = WaitIdleLocked(key);  // mu_ was released: look again
          if (e == nullptr || !e->Has(TierId::kDevice)) return absl::OkStatus();
          if (e->pins > 0) {
            return absl::FailedPreconditionError(
                absl::StrCat(Describe(key), " was pinned by a lease meanwhile"));
          }
        }
        DropCopyLocked(e, TierId::kDevice);
        return absl::OkStatus();
      case TierId::kHost:
        if (e->Copies() == 1) {
          KVTIER_RETURN_IF_ERROR(PersistLocked(e));
          e = WaitIdleLocked(key);
          if (e == nullptr || !e->Has(TierId::kHost)) return absl::OkStatus();
          ++demotions_;
        }
        if (e->Copies() > 1) DropCopyLocked(e, TierId::kHost);
        return absl::OkStatus();
      case TierId::kNvme:
        if (e->retained) {
          return absl::FailedPreconditionError(
              absl::StrCat(Describe(key), " is retained by its writer: only a delete removes it"));
        }
        break;  // below, without mu_: the record's removal is a synced write
      case TierId::kRemote:
        break;
    }
  }
  KVTIER_RETURN_IF_ERROR(Delete(key));
  absl::MutexLock lock(&mu_);
  ++evicted_blocks_;
  return absl::OkStatus();
}

absl::Status BlockStoreImpl::Drain(const std::function<void(uint64_t, uint64_t)>& progress) {
  std::vector<BlockKey> keys;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, entry] : entries_) keys.push_back(key);
  }
  uint64_t done = 0;
  for (const BlockKey& key : keys) {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it != entries_.end() && !it->second->writing && !it->second->quarantined) {
      KVTIER_RETURN_IF_ERROR(PersistLocked(it->second.get()));
      Entry* e = WaitIdleLocked(key);  // may be gone once idle (evicted)
      if (e != nullptr && e->durable) {
        if (e->pins == 0) DropCopyLocked(e, TierId::kDevice);
        DropCopyLocked(e, TierId::kHost);
      }
    }
    ++done;
    MutexUnlock unlocked(&mu_);  // progress may take its time
    progress(done, keys.size());
  }
  if (keys.empty()) progress(0, 0);
  return absl::OkStatus();
}

}  // namespace kvtier
