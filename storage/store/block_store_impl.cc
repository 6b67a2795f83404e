#include "storage/store/block_store_impl.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "storage/common/status_macros.h"
#include "storage/host/gpu_status.h"

namespace kvtier {
namespace {

constexpr uint64_t kSlotAlignmentBytes = 4096;
constexpr uint32_t kMaxStagingSlotsPerCall = 4096;

std::string Describe(const BlockKey& key) {
  return absl::StrCat("block ", absl::BytesToHexString(key.block_id), " (profile ",
                      key.profile_id, ")");
}

uint64_t Checksum(absl::Span<const uint8_t> data) { return XXH3_64bits(data.data(), data.size()); }

NvmeExtent ToExtent(const NvmeLocation& loc) {
  return NvmeExtent{loc.file_index, loc.offset_bytes, loc.length_bytes};
}
NvmeLocation FromExtent(const NvmeExtent& ext) {
  return NvmeLocation{ext.file_index, ext.offset, ext.length};
}

}  // namespace

absl::StatusOr<std::unique_ptr<BlockStore>> BlockStore::Open(const BlockStoreOptions& options) {
  if (options.env == nullptr) return absl::InvalidArgumentError("options.env: must be set");
  if (options.device_ops == nullptr) {
    return absl::InvalidArgumentError("options.device_ops: must be set");
  }
  if (options.data_dir.empty()) return absl::InvalidArgumentError("options.data_dir: empty");
  if (options.host_capacity_bytes < kSlotAlignmentBytes) {
    return absl::InvalidArgumentError("options.host_capacity_bytes: below 4096");
  }
  if (options.staging_capacity_bytes < kSlotAlignmentBytes) {
    return absl::InvalidArgumentError("options.staging_capacity_bytes: below 4096");
  }
  if (options.default_lease_ttl_ms == 0 ||
      options.max_lease_ttl_ms < options.default_lease_ttl_ms) {
    return absl::InvalidArgumentError(
        "options.default_lease_ttl_ms: must be > 0 and <= max_lease_ttl_ms");
  }
  auto store = std::make_unique<BlockStoreImpl>(options);
  KVTIER_RETURN_IF_ERROR(store->Init());
  return std::unique_ptr<BlockStore>(std::move(store));
}

BlockStoreImpl::BlockStoreImpl(const BlockStoreOptions& options)
    : options_(options), env_(options.env) {}

BlockStoreImpl::~BlockStoreImpl() = default;

absl::Status BlockStoreImpl::Init() {
  KVTIER_RETURN_IF_ERROR(env_->CreateDir(options_.data_dir, /*recursive=*/true));
  CatalogOptions catalog_options;
  KVTIER_ASSIGN_OR_RETURN(catalog_,
                          Catalog::Open(options_.data_dir + "/catalog", catalog_options));

  HostTierOptions host_options;
  host_options.path = options_.host_shm_path;
  host_options.capacity_bytes =
      options_.host_capacity_bytes / kSlotAlignmentBytes * kSlotAlignmentBytes;
  host_options.alignment_bytes = kSlotAlignmentBytes;
  host_options.file.file_mode = 0600;
  KVTIER_ASSIGN_OR_RETURN(host_, HostTier::Open(host_options));

  HostTierOptions staging_options = host_options;
  staging_options.path = options_.staging_shm_path;
  staging_options.capacity_bytes =
      options_.staging_capacity_bytes / kSlotAlignmentBytes * kSlotAlignmentBytes;
  staging_options.file.file_mode = 0660;  // clients write their blocks here
  KVTIER_ASSIGN_OR_RETURN(staging_, HostTier::Open(staging_options));

  NvmeTierOptions nvme_options;
  nvme_options.directory = options_.nvme_dir;
  nvme_options.num_files = options_.nvme_file_count;
  nvme_options.file_size_bytes = options_.nvme_file_size_bytes;
  nvme_options.use_odirect = options_.nvme_direct_io;
  nvme_options.io_threads = options_.nvme_io_threads;
  nvme_options.queue_depth = options_.nvme_queue_depth;
  nvme_options.env = env_;
  nvme_options.staging_bytes = std::min<uint64_t>(64ull << 20, options_.nvme_file_size_bytes);
  nvme_options.max_block_bytes = nvme_options.staging_bytes;
  auto host_region = host_->region();
  nvme_options.registered_regions.push_back(
      absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(host_region.data()), host_region.size()));
  // A tier file that is missing now is recreated empty by Open; catalog
  // records pointing into it must not survive (no entry without its file).
  std::vector<bool> file_existed(options_.nvme_file_count, false);
  for (uint32_t i = 0; i < options_.nvme_file_count; ++i) {
    auto exists = env_->FileExists(options_.nvme_dir + "/" + NvmeTier::FileName(i));
    file_existed[i] = exists.ok() && *exists;
  }
  KVTIER_ASSIGN_OR_RETURN(nvme_, NvmeTier::Open(nvme_options));

  device_capacity_bytes_ =
      std::min(options_.device_capacity_bytes, options_.device_ops->arena().size_bytes);
  absl::MutexLock lock(&mu_);
  device_alloc_ = std::make_unique<ExtentAllocator>(device_capacity_bytes_, kSlotAlignmentBytes);
  policy_ = options_.make_placement ? options_.make_placement() : NewLruPolicy();
  next_device_generation_ = (std::random_device()() | 1ull) << 20;

  // Reconcile: durable records with a valid extent become NVMe-only blocks;
  // everything else is removed from the catalog.
  KVTIER_ASSIGN_OR_RETURN(auto profiles, catalog_->ListProfiles());
  for (const ModelProfile& p : profiles) profiles_[p.profile_id] = p;
  std::vector<BlockKey> stale;
  const int64_t now = static_cast<int64_t>(env_->NowMicros());
  KVTIER_ASSIGN_OR_RETURN(
      CatalogScanStats scan,
      catalog_->ForEachBlock([&](const BlockKey& key, const absl::StatusOr<BlockRecord>& record) {
        auto profile = profiles_.find(key.profile_id);
        if (!record.ok() || profile == profiles_.end()) {
          stale.push_back(key);
          return true;
        }
        auto entry = std::make_unique<Entry>();
        entry->key = key;
        entry->size_bytes = record->size_bytes;
        entry->checksum = record->checksum;
        entry->created_micros = record->created_micros;
        entry->summary = record->summary;
        entry->summary.shrink_to_fit();
        summary_bytes_ += entry->summary.capacity();
        entry->last_access_micros = static_cast<uint64_t>(now);
        entry->writing = false;
        if (record->quarantined) {
          entry->quarantined = true;
          ++quarantined_;
          entries_[key] = std::move(entry);
          return true;
        }
        if (!record->durable || !record->nvme.has_value() ||
            record->nvme->file_index >= file_existed.size() ||
            !file_existed[record->nvme->file_index] ||
            record->size_bytes != BlockSizeBytes(profile->second) ||
            !nvme_->Reserve(FromExtent(*record->nvme)).ok()) {
          stale.push_back(key);
          return true;
        }
        Entry* e = entry.get();
        e->nvme = FromExtent(*record->nvme);
        e->durable = true;
        entries_[key] = std::move(entry);
        AddCopyLocked(e, TierId::kNvme);
        return true;
      }));
  (void)scan;
  for (const BlockKey& key : stale) KVTIER_RETURN_IF_ERROR(catalog_->DeleteBlock(key));
  KVTIER_ASSIGN_OR_RETURN(NvmeOrphanReport orphans, nvme_->RemoveOrphanFiles());
  (void)orphans;
  return absl::OkStatus();
}

// ---- Profiles --------------------------------------------------------------

absl::StatusOr<std::pair<ModelProfile, bool>> BlockStoreImpl::RegisterProfile(
    const ModelProfile& profile) {
  KVTIER_RETURN_IF_ERROR(ValidateProfile(profile));
  KVTIER_ASSIGN_OR_RETURN(RegisteredProfile registered, catalog_->RegisterProfile(profile));
  absl::MutexLock lock(&mu_);
  profiles_[registered.profile.profile_id] = registered.profile;
  return std::make_pair(registered.profile, registered.created);
}

absl::StatusOr<ModelProfile> BlockStoreImpl::GetProfile(uint64_t profile_id) {
  absl::MutexLock lock(&mu_);
  return ProfileLocked(profile_id);
}

absl::StatusOr<ModelProfile> BlockStoreImpl::ProfileLocked(uint64_t profile_id) {
  auto it = profiles_.find(profile_id);
  if (it == profiles_.end()) {
    return absl::NotFoundError(absl::StrCat("profile_id: ", profile_id, " is not registered"));
  }
  return it->second;
}

absl::Status BlockStoreImpl::CheckPayload(const BlockKey& key, uint64_t size_bytes) {
  KVTIER_RETURN_IF_ERROR(ValidateBlockKey(key));
  auto found = profiles_.find(key.profile_id);
  if (found == profiles_.end()) {
    // A write naming an unregistered profile is a bad argument, not a miss.
    return absl::InvalidArgumentError(
        absl::StrCat("profile_id: ", key.profile_id, " is not registered"));
  }
  const ModelProfile& profile = found->second;
  const uint64_t want = BlockSizeBytes(profile);
  if (size_bytes != want) {
    return absl::InvalidArgumentError(absl::StrCat("data: ", size_bytes, " bytes, but blocks of profile ",
                                                   key.profile_id, " are ", want, " bytes"));
  }
  return absl::OkStatus();
}

// ---- Entries and copies ----------------------------------------------------

Entry* BlockStoreImpl::FindReadyLocked(const BlockKey& key) {
  while (true) {
    auto it = entries_.find(key);
    if (it == entries_.end()) return nullptr;
    if (!it->second->writing) return it->second.get();
    idle_cv_.Wait(&mu_);
  }
}

void BlockStoreImpl::WaitIdleLocked(Entry* e) {
  while (e->busy > 0 || e->writing) idle_cv_.Wait(&mu_);
}

void BlockStoreImpl::AddCopyLocked(Entry* e, TierId tier) {
  ++blocks_in_tier_[static_cast<int>(tier)];
  policy_->Insert(tier, e);
}

void BlockStoreImpl::DropCopyLocked(Entry* e, TierId tier) {
  if (!e->Has(tier)) return;
  policy_->Remove(tier, e);
  --blocks_in_tier_[static_cast<int>(tier)];
  switch (tier) {
    case TierId::kDevice:
      device_alloc_->Free(e->device->offset, e->device->size_bytes);
      e->device.reset();
      break;
    case TierId::kHost:
      host_->Free(*e->host).IgnoreError();
      e->host.reset();
      break;
    case TierId::kNvme:
      nvme_->Free(*e->nvme).IgnoreError();
      e->nvme.reset();
      e->durable = false;
      break;
  }
}

void BlockStoreImpl::EraseLocked(Entry* e) {
  if (e->durable || e->quarantined) {
    // The record goes first: a crash in between leaves free space, never a
    // record pointing at reused space.
    absl::Status st = catalog_->DeleteBlock(e->key);
    (void)st;
  }
  if (e->quarantined) --quarantined_;
  for (TierId t : {TierId::kDevice, TierId::kHost, TierId::kNvme}) DropCopyLocked(e, t);
  summary_bytes_ -= e->summary.capacity();
  BlockKey key = e->key;
  entries_.erase(key);
  idle_cv_.SignalAll();
}

void BlockStoreImpl::QuarantineLocked(Entry* e, const absl::Status& why) {
  if (e->quarantined) return;
  e->quarantined = true;
  ++quarantined_;
  BlockRecord record = RecordLocked(*e);
  record.quarantined = true;
  record.durable = false;
  record.nvme.reset();
  // Persist the verdict so the block stays a miss after a restart.
  absl::Status st = catalog_->PutBlock(e->key, record);
  (void)st;
  (void)why;
  // Only the corrupt NVMe copy goes now (reads of it verify checksums, so a
  // racing reader fails rather than seeing reused space). Other copies may
  // be in use by readers; eviction drops them later without persisting.
  DropCopyLocked(e, TierId::kNvme);
}

BlockRecord BlockStoreImpl::RecordLocked(const Entry& e) const {
  BlockRecord record;
  record.size_bytes = e.size_bytes;
  record.checksum = e.checksum;
  if (e.nvme) record.nvme = ToExtent(*e.nvme);
  record.durable = e.durable;
  record.quarantined = e.quarantined;
  record.created_micros = e.created_micros;
  record.last_access_micros = e.created_micros;
  record.summary = e.summary;
  return record;
}

BlockLocation BlockStoreImpl::LocationLocked(const Entry& e) const {
  BlockLocation loc;
  auto fastest = e.Fastest();
  if (e.writing || e.quarantined || !fastest) return loc;
  loc.present = true;
  loc.tier = *fastest;
  loc.durable = e.durable;
  loc.pinned = e.pins > 0;
  loc.size_bytes = e.size_bytes;
  return loc;
}

// ---- Space -----------------------------------------------------------------

absl::Status BlockStoreImpl::PersistLocked(Entry* e) {
  while (e->persisting) idle_cv_.Wait(&mu_);
  if (e->durable) return absl::OkStatus();
  if (e->quarantined) {
    return absl::FailedPreconditionError(absl::StrCat(Describe(e->key), " is quarantined"));
  }
  if (!e->host && !e->device) {
    return absl::InternalError(absl::StrCat(Describe(e->key), " has no copy to persist"));
  }
  ++e->busy;
  e->persisting = true;
  const BlockKey key = e->key;
  BlockRecord record = RecordLocked(*e);
  const uint64_t size = e->size_bytes;
  std::optional<HostSlot> host = e->host;
  std::optional<DeviceSlot> device = e->device;
  mu_.Unlock();
  // The entry is busy: its host and device copies stay where they are.
  std::vector<uint8_t> device_copy;
  const uint8_t* src = nullptr;
  absl::Status st;
  if (host) {
    auto data = host_->Data(*host);
    st = data.status();
    if (st.ok()) src = reinterpret_cast<const uint8_t*>(data->data());
  } else {
    device_copy.resize(size);
    gpu::ArenaToHostCopy copy{device->offset, device_copy.data(), size};
    st = GpuToStatus(options_.device_ops->CopyToHost({&copy, 1}));
    src = device_copy.data();
  }
  absl::StatusOr<NvmeLocation> loc = absl::UnknownError("not written");
  if (st.ok()) {
    loc = nvme_->Write(absl::MakeConstSpan(src, size));
    st = loc.status();
  }
  if (st.ok()) st = nvme_->Sync();
  if (st.ok()) {
    record.nvme = ToExtent(*loc);
    record.durable = true;
    st = catalog_->PutBlock(key, record);
  }
  if (!st.ok() && loc.ok()) nvme_->Free(*loc).IgnoreError();
  mu_.Lock();
  --e->busy;
  e->persisting = false;
  idle_cv_.SignalAll();
  if (!st.ok()) return st;
  e->nvme = *loc;
  e->durable = true;
  AddCopyLocked(e, TierId::kNvme);
  return absl::OkStatus();
}

absl::StatusOr<HostSlot> BlockStoreImpl::MakeRoomHostLocked(uint64_t size_bytes) {
  while (true) {
    absl::StatusOr<HostSlot> slot = host_->Allocate(size_bytes);
    if (slot.ok() || slot.status().code() != absl::StatusCode::kResourceExhausted) return slot;
    Entry* victim = policy_->Victim(TierId::kHost, [](const Entry& e) {
      return e.busy == 0 && !e.writing;
    });
    if (victim == nullptr) {
      HostTierStats s = host_->stats();
      return absl::ResourceExhaustedError(
          absl::StrCat("host tier full: ", s.used_bytes, " of ", s.capacity_bytes,
                       " bytes used and every block in it is in use"));
    }
    if (victim->Copies() > 1 || victim->quarantined) {
      DropCopyLocked(victim, TierId::kHost);
      continue;
    }
    absl::Status st = PersistLocked(victim);
    if (!st.ok()) {
      return absl::Status(st.code(), absl::StrCat("host tier full and demotion to nvme failed: ",
                                                  st.message()));
    }
    // Persisted: the host copy is no longer the last one and goes on the
    // next iteration unless someone started using it meanwhile.
  }
}

absl::StatusOr<DeviceSlot> BlockStoreImpl::MakeRoomDeviceLocked(uint64_t size_bytes) {
  while (true) {
    std::optional<uint64_t> offset = device_alloc_->Allocate(size_bytes);
    if (offset) return DeviceSlot{*offset, size_bytes, next_device_generation_++};
    if (device_alloc_->RoundUp(size_bytes) > device_alloc_->capacity_bytes()) {
      return absl::ResourceExhaustedError(absl::StrCat("device tier capacity ",
                                                       device_capacity_bytes_,
                                                       " bytes is smaller than one block"));
    }
    Entry* victim = policy_->Victim(TierId::kDevice, [](const Entry& e) {
      return e.pins == 0 && e.busy == 0 && !e.writing;
    });
    if (victim == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "device tier full: ", device_alloc_->used_bytes(), " of ", device_capacity_bytes_,
          " bytes used and every block in it is pinned or in use"));
    }
    if (victim->Copies() == 1 && !victim->quarantined) {
      KVTIER_RETURN_IF_ERROR(EnsureHostCopyLocked(victim));
    }
    if (victim->pins == 0 && victim->busy == 0) DropCopyLocked(victim, TierId::kDevice);
  }
}

absl::Status BlockStoreImpl::EnsureHostCopyLocked(Entry* e) {
  if (e->host) return absl::OkStatus();
  ++e->busy;
  absl::StatusOr<HostSlot> slot = MakeRoomHostLocked(e->size_bytes);
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
    mu_.Unlock();
    gpu::ArenaToHostCopy copy{dslot.offset, dst, dslot.size_bytes};
    st = GpuToStatus(options_.device_ops->CopyToHost({&copy, 1}));
    mu_.Lock();
  } else if (e->nvme) {
    NvmeLocation loc = *e->nvme;
    uint64_t checksum = e->checksum;
    mu_.Unlock();
    st = nvme_->Read(loc, checksum, absl::MakeSpan(dst, loc.length_bytes));
    mu_.Lock();
    if (st.code() == absl::StatusCode::kDataLoss) QuarantineLocked(e, st);
  } else {
    st = absl::InternalError(absl::StrCat(Describe(e->key), " has no copy"));
  }
  --e->busy;
  idle_cv_.SignalAll();
  if (!st.ok() || e->host || e->quarantined) {
    host_->Free(*slot).IgnoreError();  // failed, or someone else promoted it
    if (e->quarantined) {
      return absl::NotFoundError(
          absl::StrCat("DATA_LOSS: ", Describe(e->key), " failed its checksum: ", st.message()));
    }
    return st;
  }
  e->host = *slot;
  AddCopyLocked(e, TierId::kHost);
  return absl::OkStatus();
}

// ---- Blocks ----------------------------------------------------------------

absl::StatusOr<PutOutcome> BlockStoreImpl::Put(const BlockKey& key,
                                               absl::Span<const uint8_t> data, bool durable,
                                               uint64_t expected_xxh3) {
  ModelProfile profile;
  {
    absl::MutexLock lock(&mu_);
    KVTIER_RETURN_IF_ERROR(CheckPayload(key, data.size()));
    profile = profiles_.at(key.profile_id);
  }
  const uint64_t checksum = Checksum(data);
  if (expected_xxh3 != 0 && expected_xxh3 != checksum) {
    return absl::DataLossError(absl::StrCat(
        "xxh3: the payload of ", Describe(key), " does not match the checksum the client sent"));
  }
  std::string summary;
  if (options_.summarize) {
    KVTIER_ASSIGN_OR_RETURN(summary, options_.summarize(profile, data));
    if (summary.size() > kMaxSummaryBytes) {
      return absl::InternalError(absl::StrCat("summary of ", summary.size(),
                                              " bytes exceeds kMaxSummaryBytes"));
    }
  }
  absl::MutexLock lock(&mu_);
  PutOutcome outcome;
  if (Entry* e = FindReadyLocked(key)) {
    if (e->quarantined) {
      WaitIdleLocked(e);
      EraseLocked(e);  // the correct bytes restore a quarantined block
    } else if (e->checksum != checksum || e->size_bytes != data.size()) {
      return absl::AlreadyExistsError(absl::StrCat(
          Describe(key), ": different bytes are already stored under this block_id"));
    } else {
      outcome.existed = true;
      policy_->Touch(*e->Fastest(), e);
      if (durable && !e->durable) KVTIER_RETURN_IF_ERROR(PersistLocked(e));
      outcome.tier = *e->Fastest();
      outcome.durable = e->durable;
      return outcome;
    }
  }
  auto owned = std::make_unique<Entry>();
  Entry* e = owned.get();
  e->key = key;
  e->size_bytes = data.size();
  e->checksum = checksum;
  e->summary = std::move(summary);
  e->summary.shrink_to_fit();  // encoders grow strings; keep only the bytes
  summary_bytes_ += e->summary.capacity();
  e->created_micros = static_cast<int64_t>(env_->WallMicros());
  e->last_access_micros = env_->NowMicros();
  e->busy = 1;
  entries_[key] = std::move(owned);

  auto fail = [&](absl::Status st) {
    --e->busy;
    e->writing = false;
    EraseLocked(e);
    return st;
  };
  absl::StatusOr<HostSlot> slot = MakeRoomHostLocked(data.size());
  if (!slot.ok()) return fail(slot.status());
  auto dst = host_->Data(*slot);
  mu_.Unlock();
  std::memcpy(dst->data(), data.data(), data.size());
  mu_.Lock();
  e->host = *slot;
  AddCopyLocked(e, TierId::kHost);
  if (durable || options_.write_through) {
    absl::Status st = PersistLocked(e);
    if (!st.ok() && durable) return fail(st);
  }
  --e->busy;
  e->writing = false;
  idle_cv_.SignalAll();
  outcome.tier = *e->Fastest();
  outcome.durable = e->durable;
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
    return absl::InvalidArgumentError(absl::StrCat("lease_ttl_ms: ", ttl_ms, " exceeds the maximum ",
                                                   options_.max_lease_ttl_ms));
  }
  absl::MutexLock lock(&mu_);
  size_t reaped = 0;
  KVTIER_RETURN_IF_ERROR(ReapLocked(&reaped));
  if (!profiles_.contains(profile_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile_id: ", profile_id, " is not registered"));
  }
  const ModelProfile& profile = profiles_.at(profile_id);
  const uint64_t size = BlockSizeBytes(profile);
  const uint64_t deadline =
      env_->NowMicros() + 1000 * (ttl_ms == 0 ? options_.default_lease_ttl_ms : ttl_ms);
  std::vector<StagingSlot> out;
  for (uint32_t i = 0; i < count; ++i) {
    absl::StatusOr<HostSlot> slot = staging_->Allocate(size);
    if (!slot.ok()) {
      for (const StagingSlot& s : out) {
        staging_->Free(staging_slots_[s.slot_id].slot).IgnoreError();
        staging_slots_.erase(s.slot_id);
      }
      return absl::ResourceExhaustedError(absl::StrCat(
          "staging area full (", staging_->stats().capacity_bytes,
          " bytes): release or use reserved slots first: ", slot.status().message()));
    }
    uint64_t id = next_staging_id_++;
    staging_slots_[id] = StagingReservation{*slot, tenant, profile_id, deadline};
    out.push_back(StagingSlot{id, slot->offset, slot->size_bytes, slot->generation});
  }
  return out;
}

absl::StatusOr<PutOutcome> BlockStoreImpl::PutFromStaging(const BlockKey& key,
                                                          const StagingSlot& slot, bool durable,
                                                          uint64_t expected_xxh3) {
  HostSlot host_slot;
  {
    absl::MutexLock lock(&mu_);
    auto it = staging_slots_.find(slot.slot_id);
    if (it == staging_slots_.end() || it->second.slot.offset != slot.offset_bytes ||
        it->second.slot.generation != slot.generation ||
        it->second.slot.size_bytes != slot.size_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot: slot_id ", slot.slot_id, " is not a reserved staging slot "
                       "(unknown, expired, already used, or offset/generation differ)"));
    }
    if (it->second.tenant != key.tenant || it->second.profile_id != key.profile_id) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot: slot_id ", slot.slot_id, " was reserved for another profile"));
    }
    host_slot = it->second.slot;
    staging_slots_.erase(it);
  }
  auto data = staging_->Data(host_slot);
  absl::StatusOr<PutOutcome> outcome =
      data.ok() ? Put(key,
                      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(data->data()),
                                          data->size()),
                      durable, expected_xxh3)
                : absl::StatusOr<PutOutcome>(data.status());
  staging_->Free(host_slot).IgnoreError();
  return outcome;
}

absl::Status BlockStoreImpl::Get(const BlockKey& key, std::string* out, TierId* from) {
  KVTIER_RETURN_IF_ERROR(ValidateBlockKey(key));
  absl::MutexLock lock(&mu_);
  Entry* e = FindReadyLocked(key);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat(Describe(key), " is not stored"));
  if (e->quarantined) {
    return absl::NotFoundError(absl::StrCat("DATA_LOSS: ", Describe(key),
                                            " failed its checksum and is quarantined"));
  }
  e->last_access_micros = env_->NowMicros();
  if (!e->host && !e->device) {
    // NVMe only: promote to the host tier when there is room, else read
    // into a private buffer.
    absl::Status st = EnsureHostCopyLocked(e);
    if (!st.ok() && e->quarantined) return st;
    if (!st.ok() && !e->host) {
      NvmeLocation loc = *e->nvme;
      uint64_t checksum = e->checksum;
      ++e->busy;
      mu_.Unlock();
      out->resize(loc.length_bytes);
      st = nvme_->Read(loc, checksum,
                       absl::MakeSpan(reinterpret_cast<uint8_t*>(out->data()), out->size()));
      mu_.Lock();
      --e->busy;
      idle_cv_.SignalAll();
      if (st.code() == absl::StatusCode::kDataLoss) {
        out->clear();
        QuarantineLocked(e, st);
        return absl::NotFoundError(
            absl::StrCat("DATA_LOSS: ", Describe(key), " failed its checksum: ", st.message()));
      }
      if (!st.ok()) out->clear();
      if (st.ok()) *from = TierId::kNvme;
      return st;
    }
    *from = TierId::kNvme;
  } else {
    *from = *e->Fastest();
  }
  ++e->busy;
  policy_->Touch(*e->Fastest(), e);
  absl::Status st;
  if (e->host) {
    auto data = host_->Data(*e->host);
    mu_.Unlock();
    out->assign(reinterpret_cast<const char*>(data->data()), data->size());
    mu_.Lock();
  } else {
    DeviceSlot slot = *e->device;
    mu_.Unlock();
    out->resize(slot.size_bytes);
    gpu::ArenaToHostCopy copy{slot.offset, out->data(), slot.size_bytes};
    st = GpuToStatus(options_.device_ops->CopyToHost({&copy, 1}));
    mu_.Lock();
  }
  --e->busy;
  idle_cv_.SignalAll();
  return st;
}

absl::StatusOr<uint64_t> BlockStoreImpl::AcquireHandles(
    const std::vector<BlockKey>& keys, uint64_t ttl_ms,
    std::vector<absl::StatusOr<DeviceHandle>>* handles) {
  if (ttl_ms > options_.max_lease_ttl_ms) {
    return absl::InvalidArgumentError(absl::StrCat("lease_ttl_ms: ", ttl_ms, " exceeds the maximum ",
                                                   options_.max_lease_ttl_ms));
  }
  handles->clear();
  absl::MutexLock lock(&mu_);
  std::vector<BlockKey> pinned;
  for (const BlockKey& key : keys) {
    absl::Status valid = ValidateBlockKey(key);
    if (!valid.ok()) {
      handles->push_back(valid);
      continue;
    }
    Entry* e = FindReadyLocked(key);
    if (e == nullptr) {
      handles->push_back(absl::NotFoundError(absl::StrCat(Describe(key), " is not stored")));
      continue;
    }
    if (e->quarantined) {
      handles->push_back(absl::NotFoundError(
          absl::StrCat("DATA_LOSS: ", Describe(key), " failed its checksum and is quarantined")));
      continue;
    }
    e->last_access_micros = env_->NowMicros();
    ++e->busy;  // keeps every copy of e in place while we work on it
    absl::Status st;
    if (!e->device) {
      st = EnsureHostCopyLocked(e);
      absl::StatusOr<DeviceSlot> slot =
          st.ok() ? MakeRoomDeviceLocked(e->size_bytes) : absl::StatusOr<DeviceSlot>(st);
      if (slot.ok() && e->device) {
        device_alloc_->Free(slot->offset, slot->size_bytes);  // promoted meanwhile
      } else if (slot.ok()) {
        auto src = host_->Data(*e->host);
        mu_.Unlock();
        gpu::HostToArenaCopy copy{src->data(), slot->offset, slot->size_bytes};
        st = GpuToStatus(options_.device_ops->CopyToArena({&copy, 1}));
        mu_.Lock();
        if (st.ok()) {
          e->device = *slot;
          AddCopyLocked(e, TierId::kDevice);
        } else {
          device_alloc_->Free(slot->offset, slot->size_bytes);
        }
      } else {
        st = slot.status();
      }
    } else {
      policy_->Touch(TierId::kDevice, e);
    }
    if (st.ok()) {
      if (e->pins++ == 0) pinned_bytes_ += e->size_bytes;
      pinned.push_back(key);
      handles->push_back(DeviceHandle{arena().arena_id, e->device->offset, e->size_bytes,
                                      e->device->generation});
    } else {
      handles->push_back(st);
    }
    --e->busy;
    idle_cv_.SignalAll();
  }
  if (pinned.empty()) return 0;
  const uint64_t ttl = ttl_ms == 0 ? options_.default_lease_ttl_ms : ttl_ms;
  return leases_.Add(std::move(pinned), env_->NowMicros() + ttl * 1000);
}

BlockLocation BlockStoreImpl::Lookup(const BlockKey& key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return BlockLocation{};
  return LocationLocked(*it->second);
}

std::vector<std::string> BlockStoreImpl::GetSummaries(const std::vector<BlockKey>& keys,
                                                      std::vector<BlockKey>* missing) {
  std::vector<std::string> out(keys.size());
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    Entry* e = FindReadyLocked(keys[i]);
    if (e == nullptr || e->quarantined || !e->Fastest()) {
      missing->push_back(keys[i]);
      continue;
    }
    out[i] = e->summary;
  }
  return out;
}

size_t BlockStoreImpl::Prefetch(const std::vector<BlockKey>& keys) {
  size_t promoted = 0;
  absl::MutexLock lock(&mu_);
  for (const BlockKey& key : keys) {
    auto it = entries_.find(key);
    if (it == entries_.end()) continue;
    Entry* e = it->second.get();
    if (e->writing || e->quarantined || e->host || e->device || !e->nvme) continue;
    if (EnsureHostCopyLocked(e).ok()) ++promoted;
  }
  return promoted;
}

absl::Status BlockStoreImpl::Delete(const BlockKey& key) {
  KVTIER_RETURN_IF_ERROR(ValidateBlockKey(key));
  absl::MutexLock lock(&mu_);
  Entry* e = FindReadyLocked(key);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat(Describe(key), " is not stored"));
  WaitIdleLocked(e);
  if (e->pins > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(Describe(key), " is pinned by ", e->pins, " lease(s)"));
  }
  EraseLocked(e);
  return absl::OkStatus();
}

// ---- Leases ----------------------------------------------------------------

void BlockStoreImpl::UnpinLocked(const BlockKey& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  Entry* e = it->second.get();
  if (e->pins > 0 && --e->pins == 0) pinned_bytes_ -= e->size_bytes;
}

absl::StatusOr<uint32_t> BlockStoreImpl::Release(uint64_t lease_id) {
  absl::MutexLock lock(&mu_);
  std::optional<Lease> lease = leases_.Remove(lease_id);
  if (!lease) {
    return absl::NotFoundError(
        absl::StrCat("lease_id ", lease_id, " is unknown (released or expired)"));
  }
  for (const BlockKey& key : lease->blocks) UnpinLocked(key);
  return static_cast<uint32_t>(lease->blocks.size());
}

absl::Status BlockStoreImpl::ReapLocked(size_t* reaped) {
  const uint64_t now = env_->NowMicros();
  for (Lease& lease : leases_.TakeExpired(now)) {
    for (const BlockKey& key : lease.blocks) UnpinLocked(key);
    ++*reaped;
  }
  for (auto it = staging_slots_.begin(); it != staging_slots_.end();) {
    if (it->second.deadline_micros <= now) {
      staging_->Free(it->second.slot).IgnoreError();
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
  ReapLocked(&reaped).IgnoreError();
  return reaped;
}

// ---- Administration --------------------------------------------------------

BlockStoreStats BlockStoreImpl::Stats() {
  BlockStoreStats stats;
  HostTierStats host = host_->stats();
  NvmeTierStats nvme = nvme_->stats();
  absl::MutexLock lock(&mu_);
  TierUsage& d = stats.tiers[0];
  d.tier = TierId::kDevice;
  d.backend = arena().backend;
  d.location = arena().shm_path.empty() ? arena().backend : arena().shm_path;
  d.capacity_bytes = device_capacity_bytes_;
  d.used_bytes = device_alloc_->used_bytes();
  d.pinned_bytes = pinned_bytes_;
  d.blocks = blocks_in_tier_[0];
  TierUsage& h = stats.tiers[1];
  h.tier = TierId::kHost;
  h.backend = "dram";
  h.location = host_->path();
  h.capacity_bytes = host.capacity_bytes;
  h.used_bytes = host.used_bytes;
  h.blocks = blocks_in_tier_[1];
  TierUsage& n = stats.tiers[2];
  n.tier = TierId::kNvme;
  n.backend = nvme.direct_io ? "nvme (O_DIRECT)" : "nvme (buffered)";
  n.location = options_.nvme_dir;
  n.capacity_bytes = nvme.capacity_bytes;
  n.used_bytes = nvme.used_bytes;
  n.blocks = blocks_in_tier_[2];
  stats.blocks = entries_.size();
  stats.profiles = profiles_.size();
  stats.active_leases = leases_.size();
  stats.quarantined_blocks = quarantined_;
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

absl::Status BlockStoreImpl::Verify(
    uint64_t profile_id,
    const std::function<void(uint64_t, uint64_t, const BlockKey*)>& progress) {
  std::vector<BlockKey> keys;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, entry] : entries_) {
      if ((profile_id == 0 || key.profile_id == profile_id) && entry->durable) keys.push_back(key);
    }
  }
  std::vector<uint8_t> buffer;
  uint64_t done = 0;
  for (const BlockKey& key : keys) {
    bool corrupt = false;
    {
      absl::MutexLock lock(&mu_);
      auto it = entries_.find(key);
      if (it != entries_.end() && it->second->durable && !it->second->writing) {
        Entry* e = it->second.get();
        ++e->busy;
        NvmeLocation loc = *e->nvme;
        uint64_t checksum = e->checksum;
        mu_.Unlock();
        buffer.resize(loc.length_bytes);
        absl::Status st = nvme_->Read(loc, checksum, absl::MakeSpan(buffer));
        mu_.Lock();
        --e->busy;
        idle_cv_.SignalAll();
        if (st.code() == absl::StatusCode::kDataLoss) {
          QuarantineLocked(e, st);
          corrupt = true;
        } else if (!st.ok()) {
          return st;
        }
      }
    }
    ++done;
    progress(done, keys.size(), corrupt ? &key : nullptr);
  }
  if (keys.empty()) progress(0, 0, nullptr);
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
      Entry* e = it->second.get();
      KVTIER_RETURN_IF_ERROR(PersistLocked(e));
      WaitIdleLocked(e);
      if (e->pins == 0) DropCopyLocked(e, TierId::kDevice);
      DropCopyLocked(e, TierId::kHost);
    }
    ++done;
    mu_.Unlock();
    progress(done, keys.size());
    mu_.Lock();
  }
  if (keys.empty()) progress(0, 0);
  return absl::OkStatus();
}

}  // namespace kvtier
