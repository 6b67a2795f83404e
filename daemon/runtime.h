// Runtime: what the services share for the lifetime of the daemon: the
// effective configuration, the start time, the device arena, the block store
// (with the summarizer and the placement policy plugged in), the open
// contexts, the prefetcher, the threads that run RPC work which may wait on
// a disk, plus the background reaper of expired leases and idle contexts.
//
// Thread safety: constant after Create(); the block store, summarizer,
// context manager and prefetcher are thread-safe.
#ifndef KVTIER_DAEMON_RUNTIME_H_
#define KVTIER_DAEMON_RUNTIME_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/auth/fd_server.h"
#include "daemon/auth/tenants.h"
#include "daemon/blocking_pool.h"
#include "daemon/compaction/compactor.h"
#include "daemon/compaction/version_store.h"
#include "daemon/config.h"
#include "daemon/context_manager.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/prefetcher.h"
#include "daemon/streams.h"
#include "daemon/summarizer.h"
#include "gpu/device_ops.h"
#include "gpu/device_probe.h"
#include "index/select/scorer.h"
#include "index/select/selector.h"
#include "storage/remote/remote_store.h"
#include "storage/store/block_store.h"

namespace kvtier::gpu {
struct DeviceTierOptions;  // gpu/cuda/device_ops_factory.h
}  // namespace kvtier::gpu

namespace kvtier::daemon {

class Runtime {
 public:
  // Locks the data directory (FAILED_PRECONDITION when another kvtierd
  // holds it), probes the device, creates the device arena (tiers.device.backend =
  // "cuda" without a CUDA arena is FAILED_PRECONDITION naming the key),
  // opens the block store (reconciling catalog and files) and starts the
  // reaper of expired leases and idle contexts. With auth.tenants_file set
  // it loads the tenants and gives each tenant an arena (in auth.shm_dir,
  // mode 0700, files 0600) and a staging file of its own. Staging files
  // are sealed memfds in both modes; their descriptors (and per-tenant
  // arenas') are served on auth.fd_socket_path.
  // `env`: the block store's Env (nullptr: Env::Default()); it must
  // outlive the runtime.
  static absl::StatusOr<std::unique_ptr<Runtime>> Create(const Config& config, Env* env = nullptr);
  // Stops the reaper and the prefetcher, closes every context, closes the
  // store, removes shm files.
  ~Runtime();

  const Config& config() const { return config_; }
  // Admin Drain and Verify calls running now, against
  // limits.max_admin_operations (every server's AdminService shares it).
  std::atomic<uint64_t>& admin_operations() { return admin_operations_; }
  // The tenants (authentication off: the one "default" tenant).
  const TenantRegistry& tenants() const { return *tenants_; }
  // The 0700 directory of the per-tenant arena and staging files; "" when
  // authentication is off.
  const std::string& tenant_shm_dir() const { return tenant_shm_dir_; }
  // Re-reads auth.tenants_file (SIGHUP) and applies the quotas to the store
  // and the context manager; on error nothing changes. Thread-safe.
  absl::Status ReloadTenants();
  // The leases `tenant` may hold at once: its `leases` quota, else (with
  // authentication on) auth.tenant_max_leases; 0 = no limit.
  uint64_t LeaseLimitOf(const Tenant& tenant) const;
  // True when the reaper (which takes the store's and the contexts' locks
  // every kReaperPeriod) completed a round within `within`: what the
  // systemd watchdog ping vouches for.
  bool Responsive(std::chrono::milliseconds within) const;
  // The socket handing out descriptors of staging files (and, with
  // authentication on, of per-tenant arenas).
  std::string fd_socket_path() const { return fd_server_ ? fd_server_->path() : ""; }
  const gpu::DeviceProbe& device_probe() const { return probe_; }
  // "cuda:0 ..." or "shm-arena".
  const std::string& device_backend() const { return device_backend_; }
  uint64_t uptime_s() const;
  BlockStore* store() const { return store_.get(); }
  // The remote tier wrapping store() (the same object), or null when
  // tiers.remote.redis_cluster is empty.
  remote::RemoteStore* remote() const { return remote_; }
  Summarizer* summarizer() const { return summarizer_.get(); }
  ContextManager* contexts() const { return contexts_.get(); }
  Prefetcher* prefetcher() const { return prefetcher_.get(); }
  // SelKV compaction of contexts and their stored versions.
  Compactor* compactor() const { return compactor_.get(); }
  // Where RPC handlers run work that may wait on a disk (server.io_threads).
  BlockingPool* blocking_pool() const { return blocking_pool_.get(); }
  // Where Select requests are answered (select.threads): tenants' requests
  // take turns by deficit round robin, each costing the blocks it scores.
  BlockingPool* select_pool() const { return select_pool_.get(); }
  // Open streaming calls and their per-tenant limits (server.max_streams*,
  // stream_write_timeout_ms, max_queued_bytes*).
  StreamTable* streams() const { return streams_.get(); }
  // What /metrics exports; counters are fed by the handlers.
  DaemonMetrics* metrics() const { return metrics_.get(); }
  // Selector options and the scorer of SCORER_UNSPECIFIED (select.*).
  const index::SelectorOptions& selector_options() const { return selector_options_; }
  index::ScorerKind default_scorer() const { return default_scorer_; }
  // Whether the stability filter runs for `kind` (select.stability_scorers).
  bool uses_stability(index::ScorerKind kind) const {
    return (stability_scorers_ >> static_cast<uint32_t>(kind)) & 1u;
  }

 private:
  explicit Runtime(const Config& config);
  void ReaperLoop();
  void ApplyTenantQuotas();
  // Create's step for storage: opens the block store (per-tenant arenas
  // from arena_options when tenants are enabled) and, with
  // tiers.remote.redis_cluster set, wraps it in the remote tier. Sets
  // store_ (and remote_); the error names what failed.
  absl::Status OpenStore(const Config& config, Env* env,
                         const gpu::DeviceTierOptions& arena_options);
  // The FdServer's resolver: the caller's own arena or staging file.
  absl::StatusOr<SharedFileRef> SharedFileOf(const std::string& token, SharedFile kind);

  const Config config_;
  std::atomic<uint64_t> admin_operations_{0};
  int lock_fd_ = -1;  // flock'ed <data_dir>/kvtierd.lock, held for life
  gpu::DeviceProbe probe_;
  std::string device_backend_;
  const std::chrono::steady_clock::time_point started_;
  std::unique_ptr<TenantRegistry> tenants_;
  absl::Mutex reload_mu_;                       // serialises ReloadTenants (guards no field)
  std::string tenant_shm_dir_;                  // per-tenant mode only
  std::unique_ptr<gpu::DeviceOps> device_ops_;  // single-tenant mode only
  std::unique_ptr<Summarizer> summarizer_;
  std::unique_ptr<BlockStore> store_;
  remote::RemoteStore* remote_ = nullptr;  // store_ itself when set
  std::unique_ptr<ContextManager> contexts_;
  std::unique_ptr<Prefetcher> prefetcher_;
  std::unique_ptr<VersionStore> versions_;
  std::unique_ptr<Compactor> compactor_;
  std::unique_ptr<BlockingPool> blocking_pool_;
  std::unique_ptr<BlockingPool> select_pool_;
  std::unique_ptr<StreamTable> streams_;  // outlives every reactor (the server's)
  std::unique_ptr<FdServer> fd_server_;
  std::unique_ptr<DaemonMetrics> metrics_;
  index::SelectorOptions selector_options_;
  index::ScorerKind default_scorer_ = index::ScorerKind::kKeyKey;
  uint32_t stability_scorers_ = 0;

  absl::Mutex reaper_mu_;
  bool stopping_ ABSL_GUARDED_BY(reaper_mu_) = false;  // ends ReaperLoop
  std::atomic<int64_t> reaper_round_ns_{0};            // steady clock, end of the last round
  std::thread reaper_;
};

// Reaper period: how late an expired lease or idle context may be reclaimed.
inline constexpr std::chrono::milliseconds kReaperPeriod{100};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_RUNTIME_H_
