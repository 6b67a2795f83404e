// Runtime: what the services share for the lifetime of the daemon: the
// effective configuration, the start time, the device arena, the block store
// (with the summarizer and the placement policy plugged in), the open
// contexts, the prefetcher, plus the background reaper of expired leases and
// idle contexts.
//
// Thread safety: constant after Create(); the block store, summarizer,
// context manager and prefetcher are thread-safe.
#ifndef KVTIER_DAEMON_RUNTIME_H_
#define KVTIER_DAEMON_RUNTIME_H_

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "daemon/config.h"
#include "daemon/context_manager.h"
#include "daemon/prefetcher.h"
#include "daemon/summarizer.h"
#include "gpu/device_ops.h"
#include "gpu/device_probe.h"
#include "index/scorer.h"
#include "index/selector.h"
#include "storage/store/block_store.h"

namespace kvtier::daemon {

class Runtime {
 public:
  // Locks the data directory (FAILED_PRECONDITION when another kvtierd
  // holds it), probes the device, creates the device arena (tiers.device.backend =
  // "cuda" without a CUDA arena is FAILED_PRECONDITION naming the key),
  // opens the block store (reconciling catalog and files) and starts the
  // reaper of expired leases and idle contexts.
  static absl::StatusOr<std::unique_ptr<Runtime>> Create(const Config& config);
  // Stops the reaper and the prefetcher, closes every context, closes the
  // store, removes shm files.
  ~Runtime();

  const Config& config() const { return config_; }
  const gpu::DeviceProbe& device_probe() const { return probe_; }
  // "cuda:0 ..." or "shm-arena".
  const std::string& device_backend() const { return device_backend_; }
  uint64_t uptime_s() const;
  BlockStore* store() const { return store_.get(); }
  Summarizer* summarizer() const { return summarizer_.get(); }
  ContextManager* contexts() const { return contexts_.get(); }
  Prefetcher* prefetcher() const { return prefetcher_.get(); }
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

  const Config config_;
  int lock_fd_ = -1;  // flock'ed <data_dir>/kvtierd.lock, held for life
  gpu::DeviceProbe probe_;
  std::string device_backend_;
  const std::chrono::steady_clock::time_point started_;
  std::unique_ptr<gpu::DeviceOps> device_ops_;
  std::unique_ptr<Summarizer> summarizer_;
  std::unique_ptr<BlockStore> store_;
  std::unique_ptr<ContextManager> contexts_;
  std::unique_ptr<Prefetcher> prefetcher_;
  index::SelectorOptions selector_options_;
  index::ScorerKind default_scorer_ = index::ScorerKind::kKeyKey;
  uint32_t stability_scorers_ = 0;

  std::mutex reaper_mu_;
  std::condition_variable reaper_cv_;
  bool stopping_ = false;  // guarded by reaper_mu_
  std::thread reaper_;
};

// Reaper period: how late an expired lease or idle context may be reclaimed.
inline constexpr std::chrono::milliseconds kReaperPeriod{100};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_RUNTIME_H_
