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

SummarizerOptions SummarizerOptionsOf(const Config& config) {
  SummarizerOptions options;
  options.encoding = config.index.summary_encoding == "fp32" ? index::SummaryEncoding::kFp32
                                                              : index::SummaryEncoding::kFp16;
  options.bounds = config.index.summary_bounds;
  options.per_layer = config.index.summary_per_layer;
  options.per_layer_bounds = config.index.summary_per_layer_bounds;
  options.head_weights_min_blocks = config.index.head_weights_min_blocks;
  return options;
}

index::SelectorOptions SelectorOptionsOf(const Config& config) {
  const Config::Select& s = config.select;
  index::SelectorOptions options;
  options.grid_keep_fraction = s.grid_keep_fraction;
  options.chunk_keep_fraction = s.chunk_keep_fraction;
  options.page_keep_fraction = s.page_keep_fraction;
  options.sink_blocks = static_cast<int32_t>(s.sink_blocks);
  options.local_blocks = static_cast<int32_t>(s.local_blocks);
  options.max_prefetch_blocks = static_cast<int32_t>(s.max_prefetch_blocks);
  options.algorithm =
      s.algorithm == "gemm" ? index::SelectAlgorithm::kGemm : index::SelectAlgorithm::kDescent;
  options.stability.window_steps = static_cast<int32_t>(s.window_steps);
  options.stability.theta = static_cast<float>(s.theta);
  options.stability.weight = static_cast<float>(s.stability_weight);
  options.stability.hold_threshold = static_cast<float>(s.hold_threshold);
  options.num_threads = 1;  // one Selector per stream; streams run in parallel
  return options;
}

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

  absl::StatusOr<index::ScorerKind> scorer = index::ParseScorerKind(config.select.default_scorer);
  if (!scorer.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("key 'select.default_scorer': ",
                                                   scorer.status().message()));
  }
  rt->default_scorer_ = *scorer;
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

  ContextManagerOptions contexts;
  contexts.pages_per_chunk = static_cast<int32_t>(config.index.pages_per_chunk);
  contexts.chunks_per_grid = static_cast<int32_t>(config.index.chunks_per_grid);
  contexts.vector = rt->default_scorer_ == index::ScorerKind::kKeyKeyWeighted
                        ? index::TreeVector::kWeightedMean
                        : index::TreeVector::kMean;
  contexts.keep_summaries = config.index.keep_summaries;
  contexts.max_contexts = config.limits.max_contexts;
  contexts.default_ttl_ms = config.leases.default_ttl_ms;
  contexts.max_ttl_ms = config.leases.max_ttl_ms;
  contexts.max_append_blocks = config.limits.max_batch_blocks;
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
