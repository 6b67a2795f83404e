#include "daemon/runtime.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>

#include <filesystem>
#include <functional>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "daemon/keydiff_placement.h"
#include "daemon/options.h"
#include "gpu/cpu/shm_device_ops.h"
#include "gpu/cuda/device_ops_factory.h"
#include "storage/common/errno_status.h"
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

// Most keys waiting for the prefetcher.
constexpr size_t kMaxPendingPrefetchKeys = 1 << 16;

}  // namespace

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create(const Config& config) {
  std::unique_ptr<Runtime> rt(new Runtime(config));
  // One daemon per data directory: the lock comes before anything that
  // could disturb a running daemon (its shared-memory files, its catalog).
  const std::string lock_path = config.server.data_dir + "/kvtierd.lock";
  rt->lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (rt->lock_fd_ < 0) return ErrnoToStatus(errno, "key 'server.data_dir': open " + lock_path);
  if (::flock(rt->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "key 'server.data_dir': another kvtierd is using ", config.server.data_dir));
  }
  rt->probe_ = gpu::ProbeDevices();
  // The device arena: CUDA HBM when a device is there ("auto") or demanded
  // ("cuda"), the shared-memory arena otherwise ("shm", or no device).
  gpu::DeviceTierOptions arena_options;
  arena_options.backend = config.device.backend == "cuda"  ? gpu::DeviceBackend::kCuda
                          : config.device.backend == "shm" ? gpu::DeviceBackend::kShm
                                                           : gpu::DeviceBackend::kAuto;
  arena_options.arena_bytes = config.device.capacity_bytes;
  arena_options.shm_path = ShmName(config, config.device.shm_dir, "arena");
  arena_options.shm.file.file_mode = 0640;  // clients in the daemon's group map it read-only
  std::string why;
  gpu::GpuStatus gst = gpu::NewDeviceOps(arena_options, &rt->device_ops_, &why);
  if (!gst.ok()) {
    return absl::Status(GpuToStatus(gst).code(),
                        absl::StrCat("key 'tiers.device.backend' = \"", config.device.backend,
                                     "\": cannot create the device arena: ", gst.message));
  }
  spdlog::info("device arena: {}", why);
  rt->device_backend_ = rt->device_ops_->arena().backend;

  absl::StatusOr<index::ScorerKind> scorer = DefaultScorerOf(config);
  if (!scorer.ok()) return scorer.status();
  rt->default_scorer_ = *scorer;
  rt->stability_scorers_ = StabilityScorersOf(config);
  rt->selector_options_ = SelectorOptionsOf(config);
  if (absl::Status st = index::ValidateSelectorOptions(rt->selector_options_); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("select.*: ", st.message()));
  }
  rt->summarizer_ = std::make_unique<Summarizer>(SummarizerOptionsOf(config));

  BlockStoreOptions options;
  options.data_dir = config.server.data_dir;
  options.env = Env::Default();
  options.device_ops = rt->device_ops_.get();
  options.device_capacity_bytes = config.device.capacity_bytes;
  options.host_shm_path = ShmName(config, config.host.shm_dir, "host");
  options.host_capacity_bytes = config.host.capacity_bytes;
  options.staging_shm_path = ShmName(config, config.host.shm_dir, "staging");
  options.staging_capacity_bytes = config.host.staging_bytes;
  options.nvme_dir = config.nvme.dir;
  options.nvme_file_count = static_cast<uint32_t>(config.nvme.file_count);
  options.nvme_file_size_bytes = config.nvme.file_size_bytes;
  options.nvme_direct_io = config.nvme.direct_io;
  options.nvme_io_threads = static_cast<uint32_t>(config.nvme.io_threads);
  options.nvme_queue_depth = static_cast<uint32_t>(config.nvme.queue_depth);
  options.write_through = config.nvme.write_through;
  options.default_lease_ttl_ms = config.leases.default_ttl_ms;
  options.max_lease_ttl_ms = config.leases.max_ttl_ms;
  options.summarize = [summarizer = rt->summarizer_.get()](const ModelProfile& profile,
                                                           absl::Span<const uint8_t> payload) {
    return summarizer->Summarize(profile, payload);
  };
  if (config.placement.policy == "keydiff") {
    KeyDiffPlacementOptions keydiff;
    keydiff.redundancy_weight = static_cast<float>(config.placement.redundancy_weight);
    keydiff.age_weight = static_cast<float>(config.placement.age_weight);
    keydiff.sample_blocks = static_cast<int32_t>(config.placement.sample_blocks);
    options.make_placement = [keydiff] { return NewKeyDiffPlacement(keydiff); };
  }
  auto store = BlockStore::Open(options);
  if (!store.ok()) {
    return absl::Status(store.status().code(),
                        absl::StrCat("cannot open the block store: ", store.status().message()));
  }
  rt->store_ = std::move(*store);

  const ContextManagerOptions contexts = ContextManagerOptionsOf(config);
  rt->contexts_ = std::make_unique<ContextManager>(rt->store_.get(), Env::Default(), contexts);
  rt->prefetcher_ = std::make_unique<Prefetcher>(rt->store_.get(), kMaxPendingPrefetchKeys);
  rt->reaper_ = std::thread([r = rt.get()] { r->ReaperLoop(); });
  return rt;
}

Runtime::Runtime(const Config& config)
    : config_(config), started_(std::chrono::steady_clock::now()) {}

Runtime::~Runtime() {
  {
    std::lock_guard<std::mutex> lock(reaper_mu_);
    stopping_ = true;
  }
  reaper_cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
  prefetcher_.reset();
  contexts_.reset();  // unpins what contexts hold
  store_.reset();
  device_ops_.reset();
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

void Runtime::ReaperLoop() {
  std::unique_lock<std::mutex> lock(reaper_mu_);
  while (!stopping_) {
    // A periodic timer, not synchronisation: leases expire on the clock.
    reaper_cv_.wait_for(lock, kReaperPeriod, [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    size_t reaped = store_->ReapExpired();
    if (reaped > 0) spdlog::debug("reaped {} expired leases", reaped);
    size_t closed = contexts_->ReapIdle();
    if (closed > 0) spdlog::debug("closed {} idle contexts", closed);
    lock.lock();
  }
}

uint64_t Runtime::uptime_s() const {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::steady_clock::now() - started_)
                                   .count());
}

}  // namespace kvtier::daemon
