#include "daemon/runtime.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <filesystem>
#include <functional>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/keydiff_placement.h"
#include "daemon/options.h"
#include "gpu/cpu/shm_device_ops.h"
#include "gpu/cuda/device_ops_factory.h"
#include "storage/common/errno_status.h"
#include "storage/common/mutex_unlock.h"
#include "storage/common/status_macros.h"
#include "storage/env/env.h"
#include "storage/host/gpu_status.h"

namespace kvtier::daemon {
namespace {

// Shared-memory file names are unique per user and data directory, so two
// daemons on one host do not collide and a restarted daemon replaces its
// own leftovers.
std::string ShmName(const Config& config, const std::string& dir, const std::string& what) {
  std::error_code ec;
  std::string data_dir = std::filesystem::absolute(config.server.data_dir, ec).lexically_normal();
  size_t h = std::hash<std::string>()(data_dir);
  return absl::StrCat(dir, "/kvtier-", ::getuid(), "-", absl::Hex(h), "-", what);
}

// Creates (or takes over) a directory only this user can enter: mode 0700,
// owned by us, not a symlink.
absl::Status MakePrivateDir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, "key 'auth.shm_dir': mkdir " + dir);
  }
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) return ErrnoToStatus(errno, "key 'auth.shm_dir': " + dir);
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "key 'auth.shm_dir': ", dir, " is not a directory owned by the daemon's user"));
  }
  if ((st.st_mode & 0777) != 0700 && ::chmod(dir.c_str(), 0700) != 0) {
    return ErrnoToStatus(errno, "key 'auth.shm_dir': chmod 0700 " + dir);
  }
  return absl::OkStatus();
}

// Most keys waiting for the prefetcher.
constexpr size_t kMaxPendingPrefetchKeys = 1 << 16;

// An flock on <data_dir>/kvtierd.lock: the descriptor, or
// FAILED_PRECONDITION when another kvtierd holds it.
absl::StatusOr<int> LockDataDir(const Config& config) {
  const std::string lock_path = config.server.data_dir + "/kvtierd.lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, "key 'server.data_dir': open " + lock_path);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("key 'server.data_dir': another kvtierd is using ", config.server.data_dir));
  }
  return fd;
}

// Everything the daemon creates is 0700 / 0600; a folder it did not create
// may let others in.
void WarnOpenFolders(const Config& config) {
  for (const std::string* dir : {&config.server.data_dir, &config.nvme.dir}) {
    struct stat st;
    if (!dir->empty() && ::stat(dir->c_str(), &st) == 0 && (st.st_mode & 0077) != 0) {
      spdlog::warn(
          "{} is accessible to its group or other users (mode {:o}): tier files and "
          "catalogs hold tenants' data; chmod 0700 it",
          *dir, st.st_mode & 0777);
    }
  }
}

// The I/O pool: per-tenant queue limit a quarter of the daemon's, and one
// thread left free for other tenants when authentication is on (0 in the
// config = these defaults).
BlockingPoolOptions BlockingPoolOptionsOf(const Config& config, bool per_tenant) {
  BlockingPoolOptions pool;
  pool.threads = static_cast<size_t>(config.server.io_threads);
  pool.max_queued = static_cast<size_t>(config.server.io_queue_limit);
  pool.max_queued_per_tenant = config.server.io_queue_limit_per_tenant != 0
                                   ? static_cast<size_t>(config.server.io_queue_limit_per_tenant)
                                   : std::max<size_t>(1, pool.max_queued / 4);
  pool.max_running_per_tenant =
      config.server.io_threads_per_tenant != 0
          ? static_cast<size_t>(config.server.io_threads_per_tenant)
          : (per_tenant && pool.threads > 1 ? pool.threads - 1 : pool.threads);
  return pool;
}

// The Select pool: as the I/O pool's, from the select.* keys.
BlockingPoolOptions SelectPoolOptionsOf(const Config& config, bool per_tenant) {
  const Config::Select& s = config.select;
  BlockingPoolOptions pool;
  pool.threads = static_cast<size_t>(s.threads);
  pool.max_queued = static_cast<size_t>(s.queue_limit);
  pool.max_queued_per_tenant = s.queue_limit_per_tenant != 0
                                   ? static_cast<size_t>(s.queue_limit_per_tenant)
                                   : std::max<size_t>(1, pool.max_queued / 4);
  pool.max_running_per_tenant =
      s.threads_per_tenant != 0
          ? static_cast<size_t>(s.threads_per_tenant)
          : (per_tenant && pool.threads > 1 ? pool.threads - 1 : pool.threads);
  pool.queue_limit_key = "select.queue_limit";
  pool.queue_limit_per_tenant_key = "select.queue_limit_per_tenant";
  pool.waits_for = "a Select thread";
  return pool;
}

StreamLimits StreamLimitsOf(const Config& config) {
  StreamLimits limits;
  limits.max_streams = config.server.max_streams;
  limits.max_streams_per_tenant = config.server.max_streams_per_tenant;
  limits.write_timeout_ms = config.server.stream_write_timeout_ms;
  limits.max_queued_bytes = config.server.max_queued_bytes;
  limits.max_queued_bytes_per_tenant = config.server.max_queued_bytes_per_tenant;
  return limits;
}

// The block store's options that come from the config alone.
void FillStoreOptionsOf(const Config& config, BlockStoreOptions* out) {
  BlockStoreOptions& options = *out;
  options.host_shm_path = ShmName(config, config.host.shm_dir, "host");
  options.host_capacity_bytes = config.host.capacity_bytes;
  options.staging_name = "kvtier-staging";
  options.staging_capacity_bytes = config.host.staging_bytes;
  options.prefault = config.host.prefault;
  options.nvme_dir = config.nvme.dir;
  options.nvme_file_count = static_cast<uint32_t>(config.nvme.file_count);
  options.nvme_file_size_bytes = config.nvme.file_size_bytes;
  options.nvme_direct_io = config.nvme.direct_io;
  options.nvme_io_threads = static_cast<uint32_t>(config.nvme.io_threads);
  options.nvme_queue_depth = static_cast<uint32_t>(config.nvme.queue_depth);
  options.write_through = config.nvme.write_through;
  options.default_lease_ttl_ms = config.leases.default_ttl_ms;
  options.max_lease_ttl_ms = config.leases.max_ttl_ms;
  options.log_warning = [](const std::string& message) { spdlog::warn("store: {}", message); };
  options.defer_summaries = config.server.defer_summaries;
  options.max_view_bytes = config.host.max_in_flight_get_bytes;
  if (config.placement.policy == PlacementSetting::kKeyDiff) {
    KeyDiffPlacementOptions keydiff;
    keydiff.redundancy_weight = static_cast<float>(config.placement.redundancy_weight);
    keydiff.age_weight = static_cast<float>(config.placement.age_weight);
    keydiff.sample_blocks = static_cast<int32_t>(config.placement.sample_blocks);
    keydiff.newest_protected = static_cast<float>(config.placement.newest_protected);
    options.make_placement = [keydiff] { return NewKeyDiffPlacement(keydiff); };
  } else if (config.placement.policy == PlacementSetting::kStability) {
    StabilityPolicyOptions stability;
    stability.unwanted_first = config.placement.unwanted_first;
    options.make_placement = [stability] { return NewStabilityPolicy(stability); };
  }
}

absl::StatusOr<std::unique_ptr<TenantRegistry>> LoadTenants(const Config& config) {
  if (config.auth.tenants_file.empty()) return std::make_unique<TenantRegistry>();
  absl::StatusOr<std::unique_ptr<TenantRegistry>> tenants =
      TenantRegistry::Load(config.auth.tenants_file);
  if (!tenants.ok()) {
    return absl::Status(tenants.status().code(),
                        absl::StrCat("key 'auth.tenants_file': ", tenants.status().message()));
  }
  return tenants;
}

// The device arena: CUDA HBM when a device is there ("auto") or demanded
// ("cuda"), the shared-memory arena otherwise ("shm", or no device).
gpu::DeviceTierOptions ArenaOptionsOf(const Config& config) {
  gpu::DeviceTierOptions o;
  switch (config.device.backend) {
    case DeviceBackendSetting::kCuda:
      o.backend = gpu::DeviceBackend::kCuda;
      break;
    case DeviceBackendSetting::kShm:
      o.backend = gpu::DeviceBackend::kShm;
      break;
    case DeviceBackendSetting::kAuto:
      o.backend = gpu::DeviceBackend::kAuto;
      break;
  }
  o.arena_bytes = config.device.capacity_bytes;
  o.shm_path = ShmName(config, config.device.shm_dir, "arena");
  o.shm.file.file_mode = 0640;  // clients in the daemon's group map it read-only
  return o;
}

// Makes a tenant's own arena (per-tenant mode), in `dir`.
std::function<absl::StatusOr<std::unique_ptr<gpu::DeviceOps>>(const std::string&, uint64_t)>
TenantArenaFactory(const gpu::DeviceTierOptions& arena_options, const std::string& dir) {
  return
      [arena_options, dir](const std::string& tenant,
                           uint64_t size_bytes) -> absl::StatusOr<std::unique_ptr<gpu::DeviceOps>> {
        gpu::DeviceTierOptions o = arena_options;
        o.arena_bytes = size_bytes;
        o.shm_path = absl::StrCat(dir, "/arena-", tenant);
        std::unique_ptr<gpu::DeviceOps> ops;
        gpu::GpuStatus st = gpu::NewDeviceOps(o, &ops, nullptr);
        if (!st.ok()) {
          return absl::Status(GpuToStatus(st).code(), absl::StrCat("the device arena of tenant \"",
                                                                   tenant, "\": ", st.message));
        }
        return ops;
      };
}

}  // namespace

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create(const Config& config, Env* env) {
  std::unique_ptr<Runtime> rt(new Runtime(config));
  // One daemon per data directory: the lock comes before anything that
  // could disturb a running daemon (its shared-memory files, its catalog).
  KVTIER_ASSIGN_OR_RETURN(rt->lock_fd_, LockDataDir(config));
  WarnOpenFolders(config);
  rt->probe_ = gpu::ProbeDevices();
  KVTIER_ASSIGN_OR_RETURN(rt->tenants_, LoadTenants(config));
  const bool per_tenant = rt->tenants_->enabled();
  // The device arena: CUDA HBM when a device is there ("auto") or demanded
  // ("cuda"), the shared-memory arena otherwise ("shm", or no device).
  gpu::DeviceTierOptions arena_options = ArenaOptionsOf(config);
  if (per_tenant) {
    // Arenas are made per tenant on first use; this one only finds the
    // backend (and fails start-up, not a tenant's first call, when the
    // demanded backend is missing).
    rt->tenant_shm_dir_ = config.auth.shm_dir.empty()
                              ? ShmName(config, config.device.shm_dir, "tenants")
                              : config.auth.shm_dir;
    KVTIER_RETURN_IF_ERROR(MakePrivateDir(rt->tenant_shm_dir_));
    arena_options.arena_bytes = 4096;
    arena_options.shm_path = rt->tenant_shm_dir_ + "/probe";
    arena_options.shm.file.file_mode = 0600;
  }
  std::string why;
  gpu::GpuStatus gst = gpu::NewDeviceOps(arena_options, &rt->device_ops_, &why);
  if (!gst.ok()) {
    return absl::Status(GpuToStatus(gst).code(),
                        absl::StrCat("key 'tiers.device.backend' = \"",
                                     NameOf(kDeviceBackendNames, config.device.backend),
                                     "\": cannot create the device arena: ", gst.message));
  }
  spdlog::info("device arena: {}", why);
  rt->device_backend_ = rt->device_ops_->arena().backend;
  if (per_tenant) rt->device_ops_.reset();

  rt->default_scorer_ = config.select.default_scorer;
  rt->stability_scorers_ = StabilityScorersOf(config);
  rt->selector_options_ = SelectorOptionsOf(config);
  // One pool for every Select stream's batches: threads do not grow with
  // streams.
  rt->selector_options_.pool =
      std::make_shared<index::WorkerPool>(rt->selector_options_.num_threads - 1);
  if (absl::Status st = index::ValidateSelectorOptions(rt->selector_options_); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("select.*: ", st.message()));
  }
  rt->summarizer_ = std::make_unique<Summarizer>(SummarizerOptionsOf(config));

  KVTIER_RETURN_IF_ERROR(rt->OpenStore(config, env, arena_options));

  const ContextManagerOptions contexts = ContextManagerOptionsOf(config);
  rt->contexts_ = std::make_unique<ContextManager>(rt->store_.get(), Env::Default(), contexts);
  rt->prefetcher_ = std::make_unique<Prefetcher>(rt->store_.get(), kMaxPendingPrefetchKeys);
  {
    // In the block store's catalog; an older daemon's separate store in
    // <data_dir>/compaction is moved into it.
    auto versions =
        VersionStore::Open(rt->store_->catalog(), config.server.data_dir + "/compaction");
    if (!versions.ok()) return versions.status();
    rt->versions_ = std::move(*versions);
    CompactorOptions compaction;
    compaction.max_context_bytes = config.compaction.max_context_bytes;
    compaction.max_observation_rows = static_cast<uint32_t>(config.compaction.max_observation_rows);
    rt->compactor_ = std::make_unique<Compactor>(rt->store_.get(), rt->contexts_.get(),
                                                 rt->versions_.get(), compaction);
  }
  rt->blocking_pool_ =
      std::make_unique<BlockingPool>(BlockingPoolOptionsOf(config, rt->tenants_->enabled()));
  rt->select_pool_ =
      std::make_unique<BlockingPool>(SelectPoolOptionsOf(config, rt->tenants_->enabled()));
  rt->streams_ = std::make_unique<StreamTable>(StreamLimitsOf(config));
  rt->ApplyTenantQuotas();
  {
    // Staging files are reached only through this socket, in both modes;
    // per-tenant arenas too (a single-tenant arena is mapped by path).
    absl::StatusOr<std::unique_ptr<FdServer>> fds =
        FdServer::Start(config.auth.fd_socket_path, config.server.socket_mode,
                        [r = rt.get()](const std::string& token, SharedFile kind) {
                          return r->SharedFileOf(token, kind);
                        });
    if (!fds.ok()) {
      return absl::Status(fds.status().code(),
                          absl::StrCat("key 'auth.fd_socket_path': ", fds.status().message()));
    }
    rt->fd_server_ = std::move(*fds);
  }
  rt->metrics_ = std::make_unique<DaemonMetrics>(rt.get());
  rt->reaper_ = std::thread([r = rt.get()] { r->ReaperLoop(); });
  return rt;
}

absl::Status Runtime::OpenStore(const Config& config, Env* env,
                                const gpu::DeviceTierOptions& arena_options) {
  BlockStoreOptions options;
  options.data_dir = config.server.data_dir;
  options.env = env != nullptr ? env : Env::Default();
  options.device_ops = device_ops_.get();
  options.device_capacity_bytes = config.device.capacity_bytes;
  if (tenants_->enabled()) {
    options.make_tenant_arena = TenantArenaFactory(arena_options, tenant_shm_dir_);
    options.tenant_arena_bytes = config.auth.tenant_arena_bytes;
    options.tenant_staging_name = [](const std::string& tenant) {
      return absl::StrCat("kvtier-staging-", tenant);
    };
    options.tenant_staging_bytes = config.auth.tenant_staging_bytes;
  }
  FillStoreOptionsOf(config, &options);
  options.summarize = [summarizer = summarizer_.get()](const ModelProfile& profile,
                                                       absl::Span<const uint8_t> payload) {
    return summarizer->Summarize(profile, payload);
  };
  options.begin_summary = [summarizer = summarizer_.get()](const ModelProfile& profile) {
    return summarizer->Begin(profile);
  };
  auto store = BlockStore::Open(options);
  if (!store.ok()) {
    return absl::Status(store.status().code(),
                        absl::StrCat("cannot open the block store: ", store.status().message()));
  }
  store_ = std::move(*store);
  if (!config.remote.redis_cluster.empty()) {
    absl::StatusOr<remote::RemoteTierOptions> remote_options = RemoteOptionsOf(config);
    if (!remote_options.ok()) return remote_options.status();
    auto remote_store = remote::RemoteStore::Create(std::move(store_), *remote_options);
    if (!remote_store.ok()) {
      return absl::Status(remote_store.status().code(),
                          absl::StrCat("tiers.remote: ", remote_store.status().message()));
    }
    remote_ = remote_store->get();
    store_ = std::move(*remote_store);
  }

  return absl::OkStatus();
}

void Runtime::ApplyTenantQuotas() {
  for (const TenantPtr& t : tenants_->All()) {
    TenantLimits limits;
    limits.device_bytes = t->quotas.device_bytes;
    limits.pinned_bytes = t->quotas.pinned_bytes;
    limits.staging_bytes = t->quotas.staging_bytes;
    limits.staging_slots = t->quotas.staging_slots;
    limits.host_bytes = t->quotas.host_bytes;
    limits.nvme_bytes = t->quotas.nvme_bytes;
    limits.retained_bytes = t->quotas.retained_bytes;
    limits.profiles = t->quotas.profiles;
    limits.leases = LeaseLimitOf(*t);
    store_->SetTenantLimits(t->name, limits);
    contexts_->SetTenantLimits(t->name,
                               ContextLimits{t->quotas.contexts, t->quotas.blocks_per_context});
  }
}

uint64_t Runtime::LeaseLimitOf(const Tenant& tenant) const {
  if (tenant.quotas.leases != 0) return tenant.quotas.leases;
  return tenants_->enabled() ? config_.auth.tenant_max_leases : 0;
}

absl::Status Runtime::ReloadTenants() {
  absl::MutexLock lock(&reload_mu_);
  KVTIER_RETURN_IF_ERROR(tenants_->Reload());
  ApplyTenantQuotas();
  // Revoked tokens stop serving now, open streams included.
  if (size_t n = streams_->CancelRevoked(*tenants_); n > 0) {
    spdlog::info("reload: cancelled {} streams of revoked credentials", n);
  }
  return absl::OkStatus();
}

absl::StatusOr<SharedFileRef> Runtime::SharedFileOf(const std::string& token, SharedFile kind) {
  TenantPtr tenant =
      tenants_->enabled() ? tenants_->ByToken(token) : tenants_->ByName(kDefaultTenant);
  if (tenant == nullptr) return absl::UnauthenticatedError("unknown bearer token");
  SharedFileRef ref;
  if (kind == SharedFile::kArena) {
    KVTIER_ASSIGN_OR_RETURN(gpu::ArenaInfo arena, store_->Arena(tenant->name));
    if (arena.shm_path.empty()) {
      return absl::FailedPreconditionError(
          "the device arena is CUDA memory: open it with OpenArena's cuda_ipc_handle");
    }
    ref.path = arena.shm_path;
    ref.size_bytes = arena.size_bytes;
  } else {
    KVTIER_ASSIGN_OR_RETURN(StagingFile staging, store_->OpenStagingFile(tenant->name));
    ref.fd = std::move(staging.fd);
    ref.size_bytes = staging.size_bytes;
  }
  return ref;
}

Runtime::Runtime(const Config& config)
    : config_(config), started_(std::chrono::steady_clock::now()) {}

Runtime::~Runtime() {
  {
    absl::MutexLock lock(&reaper_mu_);
    stopping_ = true;  // wakes ReaperLoop's Await
  }
  if (reaper_.joinable()) reaper_.join();
  fd_server_.reset();
  select_pool_.reset();  // runs what is queued (the gRPC server is gone)
  blocking_pool_.reset();
  prefetcher_.reset();
  compactor_.reset();
  versions_.reset();
  contexts_.reset();  // unpins what contexts hold
  store_.reset();
  device_ops_.reset();
  if (!tenant_shm_dir_.empty()) ::rmdir(tenant_shm_dir_.c_str());  // empty once the store closed
  if (lock_fd_ >= 0) ::close(lock_fd_);                            // releases the flock
}

void Runtime::ReaperLoop() {
  absl::MutexLock lock(&reaper_mu_);
  while (!stopping_) {
    // A periodic timer, not synchronisation: leases expire on the clock.
    reaper_mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::FromChrono(kReaperPeriod));
    if (stopping_) break;
    MutexUnlock unlocked(&reaper_mu_);  // a round runs without reaper_mu_
    size_t reaped = store_->ReapExpired();
    if (reaped > 0) spdlog::debug("reaped {} expired leases", reaped);
    size_t closed = contexts_->ReapIdle();
    if (size_t n = streams_->AbortStalled(std::chrono::steady_clock::now()); n > 0) {
      spdlog::warn("cancelled {} streams whose clients stopped reading", n);
    }
    if (closed > 0) spdlog::debug("closed {} idle contexts", closed);
    reaper_round_ns_.store(std::chrono::steady_clock::now().time_since_epoch().count(),
                           std::memory_order_relaxed);
  }
}

bool Runtime::Responsive(std::chrono::milliseconds within) const {
  const int64_t last = reaper_round_ns_.load(std::memory_order_relaxed);
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  // Before the first round: counted from the start.
  const auto since = last == 0 ? std::chrono::steady_clock::now() - started_
                               : now - std::chrono::steady_clock::duration(last);
  return since <= within;
}

uint64_t Runtime::uptime_s() const {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started_)
          .count());
}

}  // namespace kvtier::daemon
