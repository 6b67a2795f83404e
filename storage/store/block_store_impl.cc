#include "storage/store/block_store_impl.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "absl/algorithm/container.h"
#include "absl/base/macros.h"
#include "absl/strings/escaping.h"
#include "absl/strings/internal/resize_uninitialized.h"
#include "absl/strings/str_cat.h"
#include "storage/common/status_macros.h"
#include "storage/host/gpu_status.h"
#include "storage/store/store_internal.h"

namespace kvtier {
namespace {

using store_internal::Checksum;
using store_internal::Describe;
using store_internal::FromExtent;
using store_internal::HostPlace;
using store_internal::ToExtent;

constexpr uint64_t kSlotAlignmentBytes = 4096;
constexpr uint32_t kMaxStagingSlotsPerCall = 4096;

}  // namespace

absl::StatusOr<std::unique_ptr<BlockStore>> BlockStore::Open(const BlockStoreOptions& options) {
  if (options.env == nullptr) return absl::InvalidArgumentError("options.env: must be set");
  const bool multi = options.make_tenant_arena != nullptr;
  if (multi != (options.tenant_staging_path != nullptr)) {
    return absl::InvalidArgumentError(
        "options.make_tenant_arena and tenant_staging_path: set both or neither");
  }
  if (!multi && options.device_ops == nullptr) {
    return absl::InvalidArgumentError("options.device_ops: must be set");
  }
  if (multi && (options.tenant_arena_bytes < kSlotAlignmentBytes ||
                options.tenant_staging_bytes < kSlotAlignmentBytes)) {
    return absl::InvalidArgumentError(
        "options.tenant_arena_bytes and tenant_staging_bytes: at least 4096");
  }
  if (options.data_dir.empty()) return absl::InvalidArgumentError("options.data_dir: empty");
  if (options.host_capacity_bytes < kSlotAlignmentBytes) {
    return absl::InvalidArgumentError("options.host_capacity_bytes: below 4096");
  }
  if (!multi && options.staging_capacity_bytes < kSlotAlignmentBytes) {
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

BlockStoreImpl::~BlockStoreImpl() { StopSummaryThread(); }

absl::Status BlockStoreImpl::Init() {
  KVTIER_RETURN_IF_ERROR(env_->CreateDir(options_.data_dir, /*recursive=*/true));
  CatalogOptions catalog_options;
  catalog_options.rocksdb_env = options_.catalog_env;
  KVTIER_ASSIGN_OR_RETURN(catalog_,
                          Catalog::Open(options_.data_dir + "/catalog", catalog_options));

  HostTierOptions host_options;
  host_options.path = options_.host_shm_path;
  host_options.capacity_bytes =
      options_.host_capacity_bytes / kSlotAlignmentBytes * kSlotAlignmentBytes;
  host_options.alignment_bytes = kSlotAlignmentBytes;
  host_options.file.file_mode = 0600;
  KVTIER_ASSIGN_OR_RETURN(host_, HostTier::Open(host_options));

  multi_tenant_ = options_.make_tenant_arena != nullptr;
  if (!multi_tenant_) {
    HostTierOptions staging_options = host_options;
    staging_options.path = options_.staging_shm_path;
    staging_options.capacity_bytes =
        options_.staging_capacity_bytes / kSlotAlignmentBytes * kSlotAlignmentBytes;
    staging_options.file.file_mode = 0660;  // clients write their blocks here
    KVTIER_ASSIGN_OR_RETURN(shared_.owned_staging, HostTier::Open(staging_options));
    shared_.staging = shared_.owned_staging.get();
  }

  NvmeTierOptions nvme_options;
  nvme_options.directory = options_.nvme_dir;
  nvme_options.num_files = options_.nvme_file_count;
  nvme_options.file_size_bytes = options_.nvme_file_size_bytes;
  nvme_options.use_odirect = options_.nvme_direct_io;
  nvme_options.io_threads = options_.nvme_io_threads;
  nvme_options.queue_depth = options_.nvme_queue_depth;
  nvme_options.env = env_;
  nvme_options.staging_bytes = std::min<uint64_t>(kMaxBlockBytes, options_.nvme_file_size_bytes);
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

  absl::MutexLock lock(&mu_);
  if (multi_tenant_) {
    device_capacity_bytes_ = options_.device_capacity_bytes;
  } else {
    device_capacity_bytes_ =
        std::min(options_.device_capacity_bytes, options_.device_ops->arena().size_bytes);
    shared_.device = options_.device_ops;
    shared_.capacity_bytes = device_capacity_bytes_;
    shared_.device_alloc =
        std::make_unique<ExtentAllocator>(device_capacity_bytes_, kSlotAlignmentBytes);
  }
  policy_ = options_.make_placement ? options_.make_placement() : NewLruPolicy();
  policy_uses_wants_ = policy_->uses_wants();
  next_device_generation_ = (std::random_device()() | 1ull) << 20;

  // Reconcile: durable records with a valid extent become NVMe-only blocks;
  // everything else is removed from the catalog.
  KVTIER_ASSIGN_OR_RETURN(auto profiles, catalog_->ListProfiles());
  for (const ModelProfile& p : profiles) {
    profiles_[p.profile_id] = p;
    if (!p.owner.empty()) ++TenantLocked(p.owner).usage.profiles;
  }
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
        if (record->retained) SetRetainedLocked(e);
        return true;
      }));
  if (scan.corrupt_records > 0 || scan.corrupt_keys > 0) {
    LogLocked(absl::StrCat("catalog: ", scan.corrupt_records, " block records and ",
                           scan.corrupt_keys, " keys failed to decode at open; dropped"));
  }
  if (!stale.empty()) {
    LogLocked(absl::StrCat("recovery: ", stale.size(),
                           " catalog records without a valid durable NVMe copy were dropped"));
  }
  for (const BlockKey& key : stale) KVTIER_RETURN_IF_ERROR(catalog_->DeleteBlock(key));
  KVTIER_ASSIGN_OR_RETURN(NvmeOrphanReport orphans, nvme_->RemoveOrphanFiles());
  for (const std::string& path : orphans.removed) {
    LogLocked(absl::StrCat("recovery: removed ", path, " (not a file of this NVMe tier)"));
  }
  for (const std::string& path : orphans.foreign) {
    LogLocked(absl::StrCat("recovery: ", path, " in the NVMe directory is not kvtier's; kept"));
  }
  if (options_.defer_summaries && options_.summarize) {
    summary_thread_ = std::thread([this] { SummaryLoop(); });
  }
  return absl::OkStatus();
}

// ---- Tenants ---------------------------------------------------------------

BlockStoreImpl::TenantState& BlockStoreImpl::TenantLocked(const std::string& tenant) {
  return tenants_[tenant];
}

absl::Status BlockStoreImpl::CheckQuota(const std::string& tenant, const char* what,
                                        uint64_t used, uint64_t add, uint64_t limit) {
  if (limit == 0 || used + add <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat("quota ", what, " of tenant \"", tenant,
                                                   "\": ", used, " in use + ", add, " exceeds ",
                                                   limit));
}

void BlockStoreImpl::SetTenantLimits(const std::string& tenant, const TenantLimits& limits) {
  absl::MutexLock lock(&mu_);
  TenantLocked(tenant).limits = limits;
}

TenantUsage BlockStoreImpl::UsageOf(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  TenantUsage u = TenantLocked(tenant).usage;
  u.leases = leases_.CountOf(tenant);
  if (multi_tenant_) {
    auto it = spaces_.find(tenant);
    u.arena_bytes = it == spaces_.end() ? 0 : it->second->capacity_bytes;
  } else {
    u.arena_bytes = shared_.capacity_bytes;
  }
  return u;
}

absl::StatusOr<BlockStoreImpl::MemorySpace*> BlockStoreImpl::SpaceLocked(
    const std::string& tenant, bool staging) {
  if (!multi_tenant_) return &shared_;
  std::unique_ptr<MemorySpace>& space = spaces_[tenant];
  if (space == nullptr) space = std::make_unique<MemorySpace>();
  const TenantLimits& limits = TenantLocked(tenant).limits;
  if (space->device == nullptr) {
    const uint64_t want = (limits.device_bytes != 0 ? limits.device_bytes
                                                    : options_.tenant_arena_bytes) /
                          kSlotAlignmentBytes * kSlotAlignmentBytes;
    if (arena_bytes_ + want > device_capacity_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "device tier: an arena of ", want, " bytes for tenant \"", tenant, "\" does not fit (",
          arena_bytes_, " of tiers.device.capacity_bytes = ", device_capacity_bytes_,
          " are other tenants' arenas)"));
    }
    absl::StatusOr<std::unique_ptr<gpu::DeviceOps>> ops = options_.make_tenant_arena(tenant, want);
    if (!ops.ok()) return ops.status();
    space->owned_device = std::move(*ops);
    space->device = space->owned_device.get();
    space->capacity_bytes = std::min(want, space->device->arena().size_bytes);
    space->device_alloc =
        std::make_unique<ExtentAllocator>(space->capacity_bytes, kSlotAlignmentBytes);
    arena_bytes_ += space->capacity_bytes;
  }
  if (staging && space->staging == nullptr) {
    HostTierOptions o;
    o.path = options_.tenant_staging_path(tenant);
    o.capacity_bytes = (limits.staging_bytes != 0 ? limits.staging_bytes
                                                  : options_.tenant_staging_bytes) /
                       kSlotAlignmentBytes * kSlotAlignmentBytes;
    o.alignment_bytes = kSlotAlignmentBytes;
    o.file.file_mode = 0600;  // handed to its tenant only, as a file descriptor
    KVTIER_ASSIGN_OR_RETURN(space->owned_staging, HostTier::Open(o));
    space->staging = space->owned_staging.get();
  }
  return space.get();
}

BlockStoreImpl::MemorySpace* BlockStoreImpl::SpaceOfLocked(const Entry& e) {
  if (!multi_tenant_) return &shared_;
  return spaces_.at(e.key.tenant).get();
}

absl::StatusOr<gpu::ArenaInfo> BlockStoreImpl::Arena(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  KVTIER_ASSIGN_OR_RETURN(MemorySpace * space, SpaceLocked(tenant, /*staging=*/false));
  return space->device->arena();
}

absl::StatusOr<std::string> BlockStoreImpl::StagingPath(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  KVTIER_ASSIGN_OR_RETURN(MemorySpace * space, SpaceLocked(tenant, /*staging=*/true));
  return space->staging->path();
}

// ---- Profiles --------------------------------------------------------------

absl::StatusOr<std::pair<ModelProfile, bool>> BlockStoreImpl::RegisterProfile(
    const ModelProfile& profile, const std::string& tenant) {
  KVTIER_RETURN_IF_ERROR(ValidateProfile(profile));
  // Every block must fit every tier it can be demoted to.
  const uint64_t block_bytes = BlockSizeBytes(profile);
  if (block_bytes > nvme_->options().max_block_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile: blocks of ", block_bytes,
                     " bytes exceed the largest block the NVMe tier stores (",
                     nvme_->options().max_block_bytes,
                     " bytes: min(64 MiB, tiers.nvme.file_size_bytes))"));
  }
  if (block_bytes > host_->stats().capacity_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("profile: blocks of ", block_bytes,
                                                   " bytes exceed the host tier's capacity of ",
                                                   host_->stats().capacity_bytes, " bytes"));
  }
  ModelProfile owned = profile;
  owned.owner = tenant;
  {
    absl::MutexLock lock(&mu_);
    bool known = false;
    for (const auto& [id, p] : profiles_) {
      known |= p.name == profile.name && p.revision == profile.revision;
    }
    TenantState& t = TenantLocked(tenant);
    if (!known) {
      KVTIER_RETURN_IF_ERROR(CheckQuota(tenant, "profiles", t.usage.profiles, 1, t.limits.profiles));
    }
  }
  KVTIER_ASSIGN_OR_RETURN(RegisteredProfile registered, catalog_->RegisterProfile(owned));
  absl::MutexLock lock(&mu_);
  profiles_[registered.profile.profile_id] = registered.profile;
  if (registered.created) ++TenantLocked(tenant).usage.profiles;
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

Entry* BlockStoreImpl::WaitIdleLocked(const BlockKey& key) {
  while (true) {
    // Looked up again after every wait: the entry may be freed meanwhile
    // (evicted, deleted) and the key reused.
    auto it = entries_.find(key);
    if (it == entries_.end()) return nullptr;
    Entry* e = it->second.get();
    if (e->busy == 0 && !e->writing) return e;
    idle_cv_.Wait(&mu_);
  }
}

void BlockStoreImpl::AddCopyLocked(Entry* e, TierId tier) {
  ++blocks_in_tier_[static_cast<int>(tier)];
  policy_->Insert(tier, e);
  TenantUsage& u = TenantLocked(e->key.tenant).usage;
  (tier == TierId::kDevice ? u.device_bytes
   : tier == TierId::kHost ? u.host_bytes
                           : u.nvme_bytes) += e->size_bytes;
}

void BlockStoreImpl::DropCopyLocked(Entry* e, TierId tier, bool free_extent) {
  if (!e->Has(tier)) return;
  policy_->Remove(tier, e);
  --blocks_in_tier_[static_cast<int>(tier)];
  TenantUsage& u = TenantLocked(e->key.tenant).usage;
  switch (tier) {
    case TierId::kDevice:
      SpaceOfLocked(*e)->device_alloc->Free(e->device->offset, e->device->size_bytes);
      e->device.reset();
      u.device_bytes -= e->size_bytes;
      break;
    case TierId::kHost:
      if (absl::Status st = host_->Free(*e->host); !st.ok()) {
        LogLocked(absl::StrCat("host tier: freeing the copy of ", Describe(e->key), ": ",
                               st.message()));
      }
      e->host.reset();
      u.host_bytes -= e->size_bytes;
      break;
    case TierId::kNvme:
      if (absl::Status st = free_extent ? nvme_->Free(*e->nvme) : absl::OkStatus(); !st.ok()) {
        LogLocked(absl::StrCat("nvme tier: freeing the copy of ", Describe(e->key), ": ",
                               st.message()));
      }
      e->nvme.reset();
      e->durable = false;
      u.nvme_bytes -= e->size_bytes;
      break;
    case TierId::kRemote:  // not a tier of this store
      break;
  }
}

absl::Status BlockStoreImpl::EraseLocked(Entry* e) {
  if (e->durable || e->quarantined || e->nvme) {
    // The record goes first: a crash in between leaves free space, never a
    // record pointing at reused space. If it cannot go, nothing is freed;
    // the removal may still have reached the WAL and take effect at the
    // next Open, so the block is no longer durable (a durable put of it
    // writes the record again).
    absl::Status st = catalog_->DeleteBlock(e->key);
    if (!st.ok()) {
      e->durable = false;
      return absl::Status(st.code(), absl::StrCat("removing the catalog record of ",
                                                  Describe(e->key), ": ", st.message(),
                                                  " (it may still take effect at restart)"));
    }
  }
  ForgetLocked(e);
  return absl::OkStatus();
}

void BlockStoreImpl::ForgetLocked(Entry* e) {
  ABSL_ASSERT(e->pins == 0);  // invariant 8: leases point at pinned entries
  if (e->quarantined) --quarantined_;
  if (e->retained) {
    retained_bytes_ -= e->size_bytes;
    TenantLocked(e->key.tenant).usage.retained_bytes -= e->size_bytes;
  }
  for (TierId t : {TierId::kDevice, TierId::kHost, TierId::kNvme}) DropCopyLocked(e, t);
  summary_bytes_ -= e->summary.capacity();
  BlockKey key = e->key;
  entries_.erase(key);
  ++forgotten_;
  idle_cv_.SignalAll();
}

void BlockStoreImpl::SetRetainedLocked(Entry* e) {
  if (e->retained) return;
  e->retained = true;
  retained_bytes_ += e->size_bytes;
  TenantLocked(e->key.tenant).usage.retained_bytes += e->size_bytes;
}

void BlockStoreImpl::LogLocked(const std::string& message) {
  if (options_.log_warning) options_.log_warning(message);
}

absl::Status BlockStoreImpl::QuarantinedError(const BlockKey& key, absl::string_view detail) {
  return absl::NotFoundError(absl::StrCat("DATA_LOSS: ", Describe(key), " ", detail));
}

absl::Status BlockStoreImpl::CheckCopyLocked(Entry* e, TierId tier, std::string location,
                                             absl::Span<const uint8_t> data) {
  const uint64_t got = Checksum(data);
  if (got == e->checksum) return absl::OkStatus();
  absl::Status why = absl::DataLossError(
      absl::StrCat("checksum mismatch in the ", std::string(TierName(tier)), " copy: stored ",
                   absl::Hex(e->checksum, absl::kZeroPad16), ", read ",
                   absl::Hex(got, absl::kZeroPad16)));
  QuarantineLocked(e, tier, std::move(location), why);
  return QuarantinedError(e->key, absl::StrCat("failed its checksum: ", why.message()));
}

void BlockStoreImpl::QuarantineLocked(Entry* e, TierId tier, std::string location,
                                      const absl::Status& why) {
  ++checksum_failures_[static_cast<int>(tier)];
  if (e->quarantined) return;
  e->quarantined = true;
  ++quarantined_;
  auto note = std::make_unique<QuarantineNote>();
  note->tier = tier;
  note->location = std::move(location);
  note->reason = std::string(why.message());
  note->found_micros = static_cast<int64_t>(env_->WallMicros());
  // A durable block's verdict is persisted so that it stays a miss after a
  // restart. If that fails, the in-memory verdict still holds, and after a
  // restart the durable record's copy is verified again on its first read.
  // A block that was never durable has no record and would not survive a
  // restart anyway.
  absl::Status st;
  if (e->durable || e->nvme) {
    BlockRecord record = RecordLocked(*e);
    record.quarantined = true;
    record.durable = false;
    record.nvme.reset();
    st = catalog_->PutBlock(e->key, record);
  }
  LogLocked(absl::StrCat("quarantined ", std::string(TierName(tier)), " copy of block ",
                         absl::BytesToHexString(e->key.block_id), " of tenant \"", e->key.tenant,
                         "\" profile ", e->key.profile_id, " at ", note->location, ": ",
                         note->reason,
                         st.ok() ? ""
                                 : absl::StrCat(" (verdict not persisted: ", st.message(), ")")));
  e->quarantine = std::move(note);
  // The NVMe copy goes now (reads of it verify checksums, so a racing
  // reader fails rather than seeing reused space); the others go once no
  // one reads or pins them (eviction drops what is left).
  DropCopyLocked(e, TierId::kNvme);
  if (e->busy == 0) {
    DropCopyLocked(e, TierId::kHost);
    if (e->pins == 0) DropCopyLocked(e, TierId::kDevice);
  }
}

BlockRecord BlockStoreImpl::RecordLocked(const Entry& e) const {
  BlockRecord record;
  record.size_bytes = e.size_bytes;
  record.checksum = e.checksum;
  if (e.nvme) record.nvme = ToExtent(*e.nvme);
  record.durable = e.durable;
  record.quarantined = e.quarantined;
  record.retained = e.retained;
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
  loc.retained = e.retained;
  loc.size_bytes = e.size_bytes;
  return loc;
}

// ---- Space -----------------------------------------------------------------

absl::Status BlockStoreImpl::PersistLocked(Entry* e) {
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
  auto finish = [&](absl::Status st) {
    TenantLocked(e->key.tenant).nvme_in_flight -= in_flight;
    --e->busy;
    e->persisting = false;
    idle_cv_.SignalAll();
    return st;
  };
  // The tenant's own NVMe blocks make room for it under its quota, which
  // counts the tenant's other persists in flight.
  while (true) {
    TenantState& t = TenantLocked(e->key.tenant);
    absl::Status quota = CheckQuota(e->key.tenant, "nvme_bytes",
                                    t.usage.nvme_bytes + t.nvme_in_flight, e->size_bytes,
                                    t.limits.nvme_bytes);
    if (quota.ok()) {
      in_flight = e->size_bytes;
      t.nvme_in_flight += in_flight;
      break;
    }
    absl::Status evicted = EvictOneNvmeLocked(&e->key.tenant, e);
    if (!evicted.ok()) {
      return finish(absl::Status(quota.code(), absl::StrCat(quota.message(), "; ",
                                                            evicted.message())));
    }
  }
  const BlockKey key = e->key;
  BlockRecord record = RecordLocked(*e);
  const uint64_t size = e->size_bytes;
  std::optional<HostSlot> host = e->host;
  std::optional<DeviceSlot> device = e->device;
  gpu::DeviceOps* device_ops = device ? SpaceOfLocked(*e)->device : nullptr;
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
    st = GpuToStatus(device_ops->CopyToHost({&copy, 1}));
    src = device_copy.data();
  }
  const bool intact = st.ok() && Checksum(absl::MakeConstSpan(src, size)) == record.checksum;
  absl::StatusOr<NvmeLocation> loc = absl::UnknownError("not written");
  const uint64_t sync_failures_before = nvme_->sync_failures();
  if (st.ok() && intact) {
    while (true) {
      loc = nvme_->Write(absl::MakeConstSpan(src, size));
      if (!NvmeTier::IsTierFull(loc.status())) break;
      // The NVMe tier is full: it is the last tier, so a victim goes
      // (unless evicted blocks' space is only waiting for its removal to
      // be synced), and the catalog sync that frees its extent runs
      // without mu_.
      mu_.Lock();
      ReleaseSettledLocked();
      absl::Status evicted =
          pending_frees_.empty() ? EvictOneNvmeLocked(nullptr, e) : absl::OkStatus();
      if (evicted.ok()) evicted = SettlePendingFreesLocked();
      mu_.Unlock();
      if (!evicted.ok()) {
        loc = absl::Status(evicted.code(), absl::StrCat(loc.status().message(), "; ",
                                                        evicted.message()));
        break;
      }
    }
    st = loc.status();
  }
  if (st.ok() && intact) st = nvme_->Sync();
  if (st.ok() && intact && nvme_->sync_failures() != sync_failures_before) {
    // A sync that failed after this write may have dropped its pages; the
    // successful one cannot vouch for them.
    st = absl::UnavailableError(absl::StrCat(
        "an NVMe sync failed while the block was being written (", nvme_->last_sync_error().message(),
        "); not durable, retry the put"));
  }
  bool record_unknown = false;  // the record may or may not be on disk
  if (st.ok() && intact) {
    record.nvme = ToExtent(*loc);
    record.durable = true;
    st = catalog_->PutBlock(key, record);
    record_unknown = !st.ok();
  }
  absl::Status freed;
  if (!st.ok() && loc.ok()) {
    // A failed catalog write may still have reached the WAL, and a restart
    // would replay a record naming this extent. A synced removal of the
    // record settles it; if that fails too, the extent stays allocated
    // until the next Open, whose reconciliation frees it unless a record
    // names it (then the synced bytes are that block).
    absl::Status undone = record_unknown ? catalog_->DeleteBlock(key) : absl::OkStatus();
    if (!undone.ok()) {
      freed = absl::DataLossError(absl::StrCat("kept allocated until restart (the catalog write "
                                               "failed: ", st.message(), "; removing the record "
                                               "failed too: ", undone.message(), ")"));
    } else {
      freed = nvme_->Free(*loc);
    }
  }
  mu_.Lock();
  if (st.ok() && !intact) {
    const TierId tier = host ? TierId::kHost : TierId::kDevice;
    std::string place = host ? HostPlace("host slot", *host)
                             : absl::StrCat("device arena @ ", device->offset);
    --e->busy;  // so that the quarantine can free its copies
    st = CheckCopyLocked(e, tier, std::move(place), absl::MakeConstSpan(src, size));
    ++e->busy;
    if (st.ok()) st = absl::InternalError("copy changed while it was being persisted");
  }
  if (!freed.ok()) {
    LogLocked(absl::StrCat("nvme: extent ", loc->ToString(), " of ", Describe(key),
                           " after a failed persist: ", freed.message()));
  }
  // The synced record write also synced earlier evictions' removals.
  ReleaseSettledLocked();
  if (!st.ok()) return finish(st);
  e->nvme = *loc;
  e->durable = true;
  AddCopyLocked(e, TierId::kNvme);
  return finish(absl::OkStatus());
}

absl::Status BlockStoreImpl::EvictOneNvmeLocked(const std::string* tenant, const Entry* self) {
  // Every NVMe copy is a durable one, and a durable block survives a crash
  // until it is evicted: its NVMe copy goes only with the whole block, so
  // pinned blocks are not candidates.
  Entry* victim = policy_->Victim(TierId::kNvme, [&](const Entry& x) {
    return &x != self && x.busy == 0 && !x.writing && !x.persisting && !x.retained &&
           x.pins == 0 && (tenant == nullptr || x.key.tenant == *tenant);
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
    return absl::Status(st.code(), absl::StrCat("removing the catalog record of ",
                                                Describe(victim->key), ": ", st.message(),
                                                " (it may still take effect at restart)"));
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
  ReleaseSettledLocked();
  if (pending_frees_.empty()) return absl::OkStatus();
  mu_.Unlock();
  absl::Status st = catalog_->SyncWal();
  mu_.Lock();
  ReleaseSettledLocked();
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat("freeing the NVMe space of evicted blocks: ",
                                                st.message()));
  }
  return absl::OkStatus();
}

bool BlockStoreImpl::FreeOneHostCopyLocked(const std::function<bool(const Entry&)>& accept,
                                           absl::flat_hash_set<BlockKey>* stuck,
                                           absl::Status* why) {
  Entry* victim = policy_->Victim(TierId::kHost, [&](const Entry& e) {
    return e.busy == 0 && !e.writing && accept(e) && !stuck->contains(e.key);
  });
  if (victim == nullptr) return false;
  if (victim->Copies() > 1 || victim->quarantined) {
    DropCopyLocked(victim, TierId::kHost);
    return true;
  }
  const BlockKey key = victim->key;
  absl::Status st = PersistLocked(victim);  // releases mu_; victim stays (not freed while busy)
  if (st.ok()) {
    // Now on NVMe: the host copy goes unless someone started using it.
    if (victim->busy == 0 && victim->host && victim->Copies() > 1) {
      DropCopyLocked(victim, TierId::kHost);
      ++demotions_;
    }
    return true;
  }
  if (st.code() == absl::StatusCode::kResourceExhausted && !victim->retained &&
      victim->pins == 0 && victim->busy == 0 && !victim->writing && !victim->durable) {
    // NVMe has no room for it either: the cache gives the block up.
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
      absl::Status quota = CheckQuota(tenant, "host_bytes", used, size_bytes,
                                      t.limits.host_bytes);
      if (why.ok()) return quota;
      return absl::Status(quota.code(), absl::StrCat(quota.message(),
                                                     " and demotion to nvme failed: ",
                                                     why.message()));
    }
  }
}

void BlockStoreImpl::ReleaseHostInFlightLocked(const std::string& tenant, uint64_t size_bytes) {
  TenantLocked(tenant).host_in_flight -= size_bytes;
}

absl::StatusOr<HostSlot> BlockStoreImpl::MakeRoomHostLocked(uint64_t size_bytes,
                                                             bool memory_only) {
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
          "device tier full: ", alloc->used_bytes(), " of ", alloc->capacity_bytes(),
          " bytes of ", multi_tenant_ ? absl::StrCat("tenant \"", tenant, "\"'s arena") : "the arena",
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
    mu_.Unlock();
    gpu::ArenaToHostCopy copy{dslot.offset, dst, dslot.size_bytes};
    st = GpuToStatus(ops->CopyToHost({&copy, 1}));
    const uint64_t checksum = e->checksum;  // constant while the entry lives
    const bool intact = st.ok() && Checksum(absl::MakeConstSpan(dst, dslot.size_bytes)) == checksum;
    mu_.Lock();
    if (st.ok() && !intact) {
      --e->busy;  // so that a quarantine can free the copies
      st = CheckCopyLocked(e, TierId::kDevice, absl::StrCat("device arena @ ", dslot.offset),
                           absl::MakeConstSpan(dst, dslot.size_bytes));
      ++e->busy;
    }
  } else if (e->nvme) {
    NvmeLocation loc = *e->nvme;
    uint64_t checksum = e->checksum;
    mu_.Unlock();
    st = nvme_->Read(loc, checksum, absl::MakeSpan(dst, loc.length_bytes));
    mu_.Lock();
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

// ---- Blocks ----------------------------------------------------------------

absl::StatusOr<PutOutcome> BlockStoreImpl::Put(const BlockKey& key,
                                               absl::Span<const uint8_t> data, bool durable,
                                               uint64_t expected_xxh3, bool retain) {
  {
    absl::MutexLock lock(&mu_);
    KVTIER_RETURN_IF_ERROR(CheckPayload(key, data.size()));
    if (!entries_.contains(key)) {
      return PutNewLocked(key, absl::MakeConstSpan(&data, 1), data.size(), durable,
                          expected_xxh3, retain);
    }
  }
  return PutPrivate(key, data, std::nullopt, durable, expected_xxh3, retain);
}

absl::StatusOr<PutOutcome> BlockStoreImpl::PutPieces(
    const BlockKey& key, absl::Span<const absl::Span<const uint8_t>> pieces, bool durable,
    uint64_t expected_xxh3, bool retain) {
  if (pieces.size() == 1) return Put(key, pieces[0], durable, expected_xxh3, retain);
  uint64_t size = 0;
  for (const absl::Span<const uint8_t>& p : pieces) size += p.size();
  {
    absl::MutexLock lock(&mu_);
    KVTIER_RETURN_IF_ERROR(CheckPayload(key, size));
    if (!entries_.contains(key)) {
      return PutNewLocked(key, pieces, size, durable, expected_xxh3, retain);
    }
  }
  // Stored already, or being put right now: compared on a contiguous
  // private copy, as a put of identical bytes is rare.
  std::string flat(size, '\0');
  uint8_t* dst = reinterpret_cast<uint8_t*>(flat.data());
  const uint64_t checksum = GatherWithChecksum(pieces, dst);
  return PutPrivate(key, absl::MakeConstSpan(dst, size), checksum, durable, expected_xxh3,
                    retain);
}

absl::StatusOr<PutOutcome> BlockStoreImpl::PutNewLocked(
    const BlockKey& key, absl::Span<const absl::Span<const uint8_t>> src, uint64_t size_bytes,
    bool durable, uint64_t expected_xxh3, bool retain) {
  const ModelProfile profile = profiles_.at(key.profile_id);
  // A non-durable put may leave its summary to the summary thread.
  // Deferred blocks stay in host memory until summarised, so they may
  // hold at most a quarter of it: the rest stays free to evict.
  const bool defer = options_.summarize && summary_thread_.joinable() && !durable &&
                     !options_.write_through &&
                     deferred_summaries_ < options_.max_deferred_summaries &&
                     deferred_summary_bytes_ + size_bytes <= options_.host_capacity_bytes / 4;
  return InsertNewLocked(
      key, size_bytes, durable, retain, [&](absl::Span<uint8_t> dst) -> absl::StatusOr<FilledCopy> {
        FilledCopy filled;
        filled.checksum = GatherWithChecksum(src, dst.data());
        if (expected_xxh3 != 0 && expected_xxh3 != filled.checksum) {
          return absl::DataLossError(absl::StrCat("xxh3: the payload of ", Describe(key),
                                                  " does not match the checksum the client sent"));
        }
        if (defer) {
          filled.summary_deferred = true;
        } else if (options_.summarize) {
          KVTIER_ASSIGN_OR_RETURN(filled.summary, options_.summarize(profile, dst));
        }
        return filled;
      });
}

absl::StatusOr<PutOutcome> BlockStoreImpl::PutPrivate(const BlockKey& key,
                                                      absl::Span<const uint8_t> data,
                                                      std::optional<uint64_t> known_checksum,
                                                      bool durable, uint64_t expected_xxh3,
                                                      bool retain) {
  ModelProfile profile;
  {
    absl::MutexLock lock(&mu_);
    KVTIER_RETURN_IF_ERROR(CheckPayload(key, data.size()));
    profile = profiles_.at(key.profile_id);
  }
  const uint64_t checksum = known_checksum ? *known_checksum : Checksum(data);
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
      outcome.existed = true;
      policy_->Touch(*e->Fastest(), e);
      if (retain && !e->retained) {
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
      if (durable && !e->durable) KVTIER_RETURN_IF_ERROR(PersistLocked(e));
      outcome.tier = *e->Fastest();
      outcome.durable = e->durable;
      outcome.retained = e->retained;
      return outcome;
    }
  }
  return InsertNewLocked(key, data.size(), durable, retain,
                         [&](absl::Span<uint8_t> dst) -> absl::StatusOr<FilledCopy> {
                           std::memcpy(dst.data(), data.data(), data.size());
                           return FilledCopy{checksum, std::move(summary)};
                         });
}

absl::StatusOr<PutOutcome> BlockStoreImpl::InsertNewLocked(
    const BlockKey& key, uint64_t size_bytes, bool durable, bool retain,
    absl::FunctionRef<absl::StatusOr<FilledCopy>(absl::Span<uint8_t>)> fill) {
  if (retain) {
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
  if (retain) SetRetainedLocked(e);

  auto fail = [&](absl::Status st) {
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
  mu_.Unlock();
  absl::StatusOr<FilledCopy> filled =
      fill(absl::MakeSpan(reinterpret_cast<uint8_t*>(dst->data()), size_bytes));
  mu_.Lock();
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
  if (durable || options_.write_through) {
    absl::Status st = PersistLocked(e);
    if (!st.ok() && durable) return fail(st);
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
  {
    const TenantState& t = TenantLocked(tenant);
    KVTIER_RETURN_IF_ERROR(CheckQuota(tenant, "staging_slots", t.usage.staging_slots, count,
                                      t.limits.staging_slots));
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
      return absl::ResourceExhaustedError(absl::StrCat(
          "staging area full (", staging->stats().capacity_bytes,
          " bytes): release or use reserved slots first: ", slot.status().message()));
    }
    // Random ids: a tenant cannot guess another tenant's slot ids.
    uint64_t id = 0;
    while (id == 0 || staging_slots_.contains(id)) id = staging_ids_();
    staging_slots_[id] = StagingReservation{*slot, tenant, profile_id, deadline, staging};
    ++TenantLocked(tenant).usage.staging_slots;
    out.push_back(StagingSlot{id, slot->offset, slot->size_bytes, slot->generation});
  }
  return out;
}

absl::StatusOr<PutOutcome> BlockStoreImpl::PutFromStaging(const BlockKey& key,
                                                          const StagingSlot& slot, bool durable,
                                                          uint64_t expected_xxh3, bool retain) {
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
          absl::StrCat("slot: slot_id ", slot.slot_id, " is not a reserved staging slot "
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
  const auto src = absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(data->data()), data->size());
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
          PutNewLocked(key, absl::MakeConstSpan(&src, 1), src.size(), durable, expected_xxh3,
                       retain);
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
  return PutPrivate(key, absl::MakeConstSpan(copy, n), checksum, durable, expected_xxh3, retain);
}

void BlockStoreImpl::CountReadLocked(const Entry* e) {
  std::optional<TierId> fastest = e != nullptr ? e->Fastest() : std::nullopt;
  if (e == nullptr || e->quarantined || !fastest) {
    ++read_misses_;
  } else {
    ++reads_from_[static_cast<int>(*fastest)];
  }
}

absl::Status BlockStoreImpl::Get(const BlockKey& key, std::string* out, TierId* from) {
  KVTIER_RETURN_IF_ERROR(ValidateBlockKey(key));
  absl::MutexLock lock(&mu_);
  Entry* e = FindReadyLocked(key);
  CountReadLocked(e);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat(Describe(key), " is not stored"));
  if (e->quarantined) return QuarantinedError(key, "failed its checksum and is quarantined");
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
        QuarantineLocked(e, TierId::kNvme, loc.ToString(), st);
        return QuarantinedError(key, absl::StrCat("failed its checksum: ", st.message()));
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
  TierId read_from = TierId::kHost;
  std::string place;
  const uint64_t checksum = e->checksum;
  auto bytes = [&] {
    return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(out->data()), out->size());
  };
  bool intact = false;
  // What leaves the store is what was put: the copy handed out is verified
  // (outside the lock), so a damaged host or device copy is never served.
  if (e->host) {
    auto data = host_->Data(*e->host);
    place = HostPlace("host slot", *e->host);
    mu_.Unlock();
    // One pass: copy and hash what was copied. The string's old capacity
    // is reused and its bytes are not zeroed first.
    absl::strings_internal::STLStringResizeUninitialized(out, data->size());
    intact = CopyWithChecksum(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(data->data()),
                                                  data->size()),
                              reinterpret_cast<uint8_t*>(out->data())) == checksum;
    mu_.Lock();
  } else {
    DeviceSlot slot = *e->device;
    gpu::DeviceOps* ops = SpaceOfLocked(*e)->device;
    read_from = TierId::kDevice;
    place = absl::StrCat("device arena @ ", slot.offset);
    mu_.Unlock();
    out->resize(slot.size_bytes);
    gpu::ArenaToHostCopy copy{slot.offset, out->data(), slot.size_bytes};
    st = GpuToStatus(ops->CopyToHost({&copy, 1}));
    intact = st.ok() && Checksum(bytes()) == checksum;
    mu_.Lock();
  }
  --e->busy;
  idle_cv_.SignalAll();
  if (st.ok() && !intact) st = CheckCopyLocked(e, read_from, std::move(place), bytes());
  if (!st.ok()) out->clear();
  return st;
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
    EnsureSummaryLocked(e);
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
  Entry* e = FindReadyLocked(key) != nullptr ? WaitIdleLocked(key) : nullptr;
  if (e == nullptr) {
    // An evicted block whose record removal is not synced yet could come
    // back after a power loss: a delete makes its removal durable first.
    const uint64_t synced = catalog_->synced_through();
    const bool unsynced = absl::c_any_of(pending_frees_, [&](const PendingFree& f) {
      return f.ticket > synced && f.key == key;
    });
    if (unsynced) KVTIER_RETURN_IF_ERROR(SettlePendingFreesLocked());
    return absl::NotFoundError(absl::StrCat(Describe(key), " is not stored"));
  }
  if (e->pins > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(Describe(key), " is pinned by ", e->pins, " lease(s)"));
  }
  if (!(e->durable || e->quarantined || e->nvme)) {
    ForgetLocked(e);  // no catalog record: nothing to sync
    return absl::OkStatus();
  }
  // The record's synced removal runs without mu_. Meanwhile the entry is
  // hidden as a put in progress is (readers, writers, pins and deletes of
  // this key wait for it; Lookup and Verify skip it) and busy keeps it from
  // eviction, so nothing else frees it. The record goes before any copy, as
  // in EraseLocked.
  e->writing = true;
  ++e->busy;
  mu_.Unlock();
  absl::Status st = catalog_->DeleteBlock(key);
  mu_.Lock();
  --e->busy;
  e->writing = false;
  idle_cv_.SignalAll();
  if (!st.ok()) {
    // It may still take effect at the next Open: no longer durable.
    e->durable = false;
    return absl::Status(st.code(), absl::StrCat("removing the catalog record of ",
                                                Describe(key), ": ", st.message(),
                                                " (it may still take effect at restart)"));
  }
  ForgetLocked(e);
  return absl::OkStatus();
}

}  // namespace kvtier
