#include "storage/store/block_store_impl.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/algorithm/container.h"
#include "absl/base/macros.h"
#include "absl/strings/escaping.h"
#include "absl/strings/internal/resize_uninitialized.h"
#include "absl/strings/str_cat.h"
#include "storage/common/errno_status.h"
#include "storage/common/mutex_unlock.h"
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
using store_internal::UnknownProfile;

constexpr uint64_t kSlotAlignmentBytes = 4096;

}  // namespace

absl::StatusOr<std::unique_ptr<BlockStore>> BlockStore::Open(const BlockStoreOptions& options) {
  if (options.env == nullptr) return absl::InvalidArgumentError("options.env: must be set");
  const bool multi = options.make_tenant_arena != nullptr;
  if (multi != (options.tenant_staging_name != nullptr)) {
    return absl::InvalidArgumentError(
        "options.make_tenant_arena and tenant_staging_name: set both or neither");
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

BlockStoreImpl::~BlockStoreImpl() {
  prefaulter_.reset();  // stops touching the regions before they are unmapped
  StopSummaryThread();
}

absl::Status BlockStoreImpl::Init() {
  std::vector<bool> file_existed;
  KVTIER_RETURN_IF_ERROR(OpenTiers(&file_existed));
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

  KVTIER_RETURN_IF_ERROR(RecoverLocked(file_existed));
  if (options_.prefault) {
    prefaulter_ = std::make_unique<Prefaulter>();
    prefaulter_->Add(static_cast<int>(TierId::kHost), host_->region());
    if (!multi_tenant_) {
      prefaulter_->Add(static_cast<int>(TierId::kHost), shared_.staging->region());
      prefaulter_->Add(static_cast<int>(TierId::kDevice), shared_.device->HostMapping());
    }
  }
  if (options_.defer_summaries && options_.summarize) {
    summary_thread_ = std::thread([this] { SummaryLoop(); });
  }
  return absl::OkStatus();
}

absl::Status BlockStoreImpl::OpenTiers(std::vector<bool>* file_existed) {
  KVTIER_RETURN_IF_ERROR(env_->CreateDir(options_.data_dir, /*recursive=*/true));
  CatalogOptions catalog_options;
  catalog_options.rocksdb_env = options_.catalog_env;
  KVTIER_ASSIGN_OR_RETURN(catalog_, Catalog::Open(options_.data_dir + "/catalog", catalog_options));

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
    staging_options.path = options_.staging_name;
    staging_options.capacity_bytes =
        options_.staging_capacity_bytes / kSlotAlignmentBytes * kSlotAlignmentBytes;
    // Clients write their blocks here through descriptors they hold: sealed,
    // so none of them can shrink it under our mapping (SIGBUS) or grow it.
    staging_options.file.sealed = true;
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
  file_existed->assign(options_.nvme_file_count, false);
  for (uint32_t i = 0; i < options_.nvme_file_count; ++i) {
    auto exists = env_->FileExists(options_.nvme_dir + "/" + NvmeTier::FileName(i));
    (*file_existed)[i] = exists.ok() && *exists;
  }
  KVTIER_ASSIGN_OR_RETURN(nvme_, NvmeTier::Open(nvme_options));
  return absl::OkStatus();
}

absl::Status BlockStoreImpl::RecoverLocked(const std::vector<bool>& file_existed) {
  mu_.AssertHeld();
  // Reconcile: durable records with a valid extent become NVMe-only blocks;
  // everything else is removed from the catalog.
  KVTIER_ASSIGN_OR_RETURN(auto profiles, catalog_->ListProfiles());
  for (ModelProfile& p : profiles) {
    ++TenantLocked(p.owner).usage.profiles;
    profiles_[p.profile_id].push_back(std::move(p));
    ++profile_count_;
  }
  std::vector<BlockKey> stale;
  const int64_t now = static_cast<int64_t>(env_->NowMicros());
  KVTIER_ASSIGN_OR_RETURN(
      CatalogScanStats scan,
      catalog_->ForEachBlock([&](const BlockKey& key, const absl::StatusOr<BlockRecord>& record)
                                 ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                   RecoverBlockLocked(key, record, file_existed, now, &stale);
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
  return absl::OkStatus();
}

void BlockStoreImpl::RecoverBlockLocked(const BlockKey& key,
                                        const absl::StatusOr<BlockRecord>& record,
                                        const std::vector<bool>& file_existed, int64_t now,
                                        std::vector<BlockKey>* stale) {
  mu_.AssertHeld();
  const ModelProfile* profile = ProfileOfLocked(key.tenant, key.profile_id);
  if (!record.ok() || profile == nullptr) {
    stale->push_back(key);
    return;
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
    return;
  }
  if (!record->durable || !record->nvme.has_value() ||
      record->nvme->file_index >= file_existed.size() || !file_existed[record->nvme->file_index] ||
      record->size_bytes != BlockSizeBytes(*profile) ||
      !nvme_->Reserve(FromExtent(*record->nvme)).ok()) {
    stale->push_back(key);
    return;
  }
  Entry* e = entry.get();
  e->nvme = FromExtent(*record->nvme);
  e->durable = true;
  entries_[key] = std::move(entry);
  AddCopyLocked(e, TierId::kNvme);
  if (record->retained) SetRetainedLocked(e);
}

// ---- Tenants ---------------------------------------------------------------

BlockStoreImpl::TenantState& BlockStoreImpl::TenantLocked(const std::string& tenant) {
  mu_.AssertHeld();
  return tenants_[tenant];
}

absl::Status BlockStoreImpl::CheckQuota(const std::string& tenant, const char* what, uint64_t used,
                                        uint64_t add, uint64_t limit) {
  if (limit == 0 || used + add <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat("quota ", what, " of tenant \"", tenant, "\": ",
                                                   used, " in use + ", add, " exceeds ", limit));
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

absl::StatusOr<BlockStoreImpl::MemorySpace*> BlockStoreImpl::SpaceLocked(const std::string& tenant,
                                                                         bool staging) {
  mu_.AssertHeld();
  if (!multi_tenant_) return &shared_;
  std::unique_ptr<MemorySpace>& space = spaces_[tenant];
  if (space == nullptr) space = std::make_unique<MemorySpace>();
  const TenantLimits& limits = TenantLocked(tenant).limits;
  if (space->device == nullptr) {
    const uint64_t want =
        (limits.device_bytes != 0 ? limits.device_bytes : options_.tenant_arena_bytes) /
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
    if (prefaulter_ != nullptr) {
      prefaulter_->Add(static_cast<int>(TierId::kDevice), space->device->HostMapping());
    }
  }
  if (staging && space->staging == nullptr) {
    HostTierOptions o;
    o.path = options_.tenant_staging_name(tenant);
    o.capacity_bytes =
        (limits.staging_bytes != 0 ? limits.staging_bytes : options_.tenant_staging_bytes) /
        kSlotAlignmentBytes * kSlotAlignmentBytes;
    o.alignment_bytes = kSlotAlignmentBytes;
    o.file.sealed = true;  // handed to its tenant only, as a file descriptor
    KVTIER_ASSIGN_OR_RETURN(space->owned_staging, HostTier::Open(o));
    space->staging = space->owned_staging.get();
    if (prefaulter_ != nullptr) {
      prefaulter_->Add(static_cast<int>(TierId::kHost), space->staging->region());
    }
  }
  return space.get();
}

BlockStoreImpl::MemorySpace* BlockStoreImpl::SpaceOfLocked(const Entry& e) {
  mu_.AssertHeld();
  if (!multi_tenant_) return &shared_;
  return spaces_.at(e.key.tenant).get();
}

absl::StatusOr<gpu::ArenaInfo> BlockStoreImpl::Arena(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  KVTIER_ASSIGN_OR_RETURN(MemorySpace * space, SpaceLocked(tenant, /*staging=*/false));
  return space->device->arena();
}

absl::StatusOr<StagingFile> BlockStoreImpl::OpenStagingFile(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  KVTIER_ASSIGN_OR_RETURN(MemorySpace * space, SpaceLocked(tenant, /*staging=*/true));
  StagingFile file;
  file.fd.Reset(space->staging->OpenDescriptor(/*writable=*/true));
  if (!file.fd.valid()) return ErrnoToStatus(errno, "open the staging file of \"" + tenant + "\"");
  file.size_bytes = space->staging->region().size();
  return file;
}

// ---- Profiles --------------------------------------------------------------

absl::StatusOr<RegisteredProfile> BlockStoreImpl::RegisterProfile(const ModelProfile& profile,
                                                                  const std::string& tenant) {
  KVTIER_RETURN_IF_ERROR(ValidateProfile(profile));
  // Every block must fit every tier it can be demoted to.
  const uint64_t block_bytes = BlockSizeBytes(profile);
  if (block_bytes > nvme_->options().max_block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile: blocks of ", block_bytes,
        " bytes exceed the largest block the NVMe tier stores (", nvme_->options().max_block_bytes,
        " bytes: min(64 MiB, tiers.nvme.file_size_bytes))"));
  }
  if (block_bytes > host_->stats().capacity_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("profile: blocks of ", block_bytes,
                                                   " bytes exceed the host tier's capacity of ",
                                                   host_->stats().capacity_bytes, " bytes"));
  }
  ModelProfile owned = profile;
  owned.owner = tenant;
  bool reserved = false;  // a place of the profiles quota, held across the write
  {
    absl::MutexLock lock(&mu_);
    bool known = false;
    for (const auto& [id, list] : profiles_) {
      for (const ModelProfile& p : list) {
        known |= p.owner == tenant && p.name == profile.name && p.revision == profile.revision;
      }
    }
    TenantState& t = TenantLocked(tenant);
    if (!known) {
      KVTIER_RETURN_IF_ERROR(CheckQuota(tenant, "profiles", t.usage.profiles + t.profiles_pending,
                                        1, t.limits.profiles));
      ++t.profiles_pending;
      reserved = true;
    }
  }
  absl::StatusOr<RegisteredProfile> written = catalog_->RegisterProfile(owned);
  absl::MutexLock lock(&mu_);
  if (reserved) --TenantLocked(tenant).profiles_pending;
  if (!written.ok()) return written.status();
  const RegisteredProfile& registered = *written;
  if (registered.created) {
    profiles_[registered.profile.profile_id].push_back(registered.profile);
    ++profile_count_;
    ++TenantLocked(tenant).usage.profiles;
  }
  return registered;
}

absl::StatusOr<ModelProfile> BlockStoreImpl::GetProfile(const std::string& tenant,
                                                        uint64_t profile_id) {
  absl::MutexLock lock(&mu_);
  const ModelProfile* profile = ProfileOfLocked(tenant, profile_id);
  if (profile == nullptr) return UnknownProfile(profile_id);
  return *profile;
}

const ModelProfile* BlockStoreImpl::ProfileOfLocked(absl::string_view tenant,
                                                    uint64_t profile_id) const {
  mu_.AssertHeld();
  auto it = profiles_.find(profile_id);
  if (it == profiles_.end()) return nullptr;
  for (const ModelProfile& p : it->second) {
    if (p.owner == tenant) return &p;
  }
  return nullptr;
}

absl::Status BlockStoreImpl::CheckPayload(const BlockKey& key, uint64_t size_bytes) {
  KVTIER_RETURN_IF_ERROR(ValidateBlockKey(key));
  const ModelProfile* found = ProfileOfLocked(key.tenant, key.profile_id);
  if (found == nullptr) return UnknownProfile(key.profile_id);
  const ModelProfile& profile = *found;
  const uint64_t want = BlockSizeBytes(profile);
  if (size_bytes != want) {
    return absl::InvalidArgumentError(absl::StrCat("data: ", size_bytes,
                                                   " bytes, but blocks of profile ", key.profile_id,
                                                   " are ", want, " bytes"));
  }
  return absl::OkStatus();
}

// ---- Entries and copies ----------------------------------------------------

Entry* BlockStoreImpl::FindReadyLocked(const BlockKey& key) {
  mu_.AssertHeld();
  while (true) {
    auto it = entries_.find(key);
    if (it == entries_.end()) return nullptr;
    if (!it->second->writing) return it->second.get();
    idle_cv_.Wait(&mu_);
  }
}

Entry* BlockStoreImpl::WaitIdleLocked(const BlockKey& key) {
  mu_.AssertHeld();
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
  mu_.AssertHeld();
  ++blocks_in_tier_[static_cast<int>(tier)];
  policy_->Insert(tier, e);
  TenantUsage& u = TenantLocked(e->key.tenant).usage;
  (tier == TierId::kDevice ? u.device_bytes
   : tier == TierId::kHost ? u.host_bytes
                           : u.nvme_bytes) += e->size_bytes;
}

void BlockStoreImpl::DropCopyLocked(Entry* e, TierId tier, bool free_extent) {
  mu_.AssertHeld();
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
        LogLocked(
            absl::StrCat("host tier: freeing the copy of ", Describe(e->key), ": ", st.message()));
      }
      e->host.reset();
      u.host_bytes -= e->size_bytes;
      break;
    case TierId::kNvme:
      if (absl::Status st = free_extent ? nvme_->Free(*e->nvme) : absl::OkStatus(); !st.ok()) {
        LogLocked(
            absl::StrCat("nvme tier: freeing the copy of ", Describe(e->key), ": ", st.message()));
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
  mu_.AssertHeld();
  if (e->durable || e->quarantined || e->nvme) {
    // The record goes first: a crash in between leaves free space, never a
    // record pointing at reused space. If it cannot go, nothing is freed;
    // the removal may still have reached the WAL and take effect at the
    // next Open, so the block is no longer durable (a durable put of it
    // writes the record again).
    absl::Status st = catalog_->DeleteBlock(e->key);
    if (!st.ok()) {
      e->durable = false;
      return absl::Status(st.code(),
                          absl::StrCat("removing the catalog record of ", Describe(e->key), ": ",
                                       st.message(), " (it may still take effect at restart)"));
    }
  }
  ForgetLocked(e);
  return absl::OkStatus();
}

void BlockStoreImpl::ForgetLocked(Entry* e) {
  mu_.AssertHeld();
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
  mu_.AssertHeld();
  if (e->retained) return;
  e->retained = true;
  retained_bytes_ += e->size_bytes;
  TenantLocked(e->key.tenant).usage.retained_bytes += e->size_bytes;
}

void BlockStoreImpl::LogLocked(const std::string& message) {
  mu_.AssertHeld();
  if (options_.log_warning) options_.log_warning(message);
}

absl::Status BlockStoreImpl::QuarantinedError(const BlockKey& key, absl::string_view detail) {
  return absl::NotFoundError(absl::StrCat("DATA_LOSS: ", Describe(key), " ", detail));
}

absl::Status BlockStoreImpl::CheckCopyLocked(Entry* e, TierId tier, std::string location,
                                             absl::Span<const uint8_t> data) {
  mu_.AssertHeld();
  const uint64_t got = Checksum(data);
  if (got == e->checksum) return absl::OkStatus();
  absl::Status why = absl::DataLossError(absl::StrCat(
      "checksum mismatch in the ", std::string(TierName(tier)), " copy: stored ",
      absl::Hex(e->checksum, absl::kZeroPad16), ", read ", absl::Hex(got, absl::kZeroPad16)));
  QuarantineLocked(e, tier, std::move(location), why);
  return QuarantinedError(e->key, absl::StrCat("failed its checksum: ", why.message()));
}

void BlockStoreImpl::QuarantineLocked(Entry* e, TierId tier, std::string location,
                                      const absl::Status& why) {
  mu_.AssertHeld();
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
  LogLocked(
      absl::StrCat("quarantined ", std::string(TierName(tier)), " copy of block ",
                   absl::BytesToHexString(e->key.block_id), " of tenant \"", e->key.tenant,
                   "\" profile ", e->key.profile_id, " at ", note->location, ": ", note->reason,
                   st.ok() ? "" : absl::StrCat(" (verdict not persisted: ", st.message(), ")")));
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
  mu_.AssertHeld();
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
  mu_.AssertHeld();
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

// ---- Blocks ----------------------------------------------------------------

void BlockStoreImpl::CountReadLocked(const Entry* e) {
  mu_.AssertHeld();
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
      {
        MutexUnlock unlocked(&mu_);
        out->resize(loc.length_bytes);
        st = nvme_->Read(loc, checksum,
                         absl::MakeSpan(reinterpret_cast<uint8_t*>(out->data()), out->size()));
      }
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
    MutexUnlock unlocked(&mu_);
    // One pass: copy and hash what was copied. The string's old capacity
    // is reused and its bytes are not zeroed first.
    absl::strings_internal::STLStringResizeUninitialized(out, data->size());
    intact = CopyWithChecksum(
                 absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(data->data()), data->size()),
                 reinterpret_cast<uint8_t*>(out->data())) == checksum;
  } else {
    DeviceSlot slot = *e->device;
    gpu::DeviceOps* ops = SpaceOfLocked(*e)->device;
    read_from = TierId::kDevice;
    place = absl::StrCat("device arena @ ", slot.offset);
    MutexUnlock unlocked(&mu_);
    out->resize(slot.size_bytes);
    gpu::ArenaToHostCopy copy{slot.offset, out->data(), slot.size_bytes};
    st = GpuToStatus(ops->CopyToHost({&copy, 1}));
    intact = st.ok() && Checksum(bytes()) == checksum;
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
    const bool unsynced = absl::c_any_of(
        pending_frees_, [&](const PendingFree& f) { return f.ticket > synced && f.key == key; });
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
  absl::Status st;
  {
    MutexUnlock unlocked(&mu_);
    st = catalog_->DeleteBlock(key);
  }
  --e->busy;
  e->writing = false;
  idle_cv_.SignalAll();
  if (!st.ok()) {
    // It may still take effect at the next Open: no longer durable.
    e->durable = false;
    return absl::Status(st.code(),
                        absl::StrCat("removing the catalog record of ", Describe(key), ": ",
                                     st.message(), " (it may still take effect at restart)"));
  }
  ForgetLocked(e);
  return absl::OkStatus();
}

}  // namespace kvtier
