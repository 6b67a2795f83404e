// ResourceSampler: what kvtierd holds, once per period while the load runs,
// and the "flat" check over those samples.
//
// A sample reads /proc/<pid>/status (VmRSS, RssAnon, RssShmem, Threads)
// and /proc/<pid>/stat (CPU time), counts /proc/<pid>/fd, and calls Admin Stats (tier use and
// pinned bytes, leases, contexts, staging slots, evicted blocks). Sampling runs on a thread of its
// own that waits on a timer (a condition with a timeout), so Stop returns at once rather than at
// the end of a period.
//
// Flat: after a warm-up, a resource may not grow between the start window
// (the first W samples after warm-up) and the end window (the last W),
// W = max(kMinWindowSamples, a tenth of the samples after warm-up):
// median(end) <= median(start) + allowance. See FlatLimits for the
// allowances and README.md for why these.
//
// Thread safety: Start/Stop/samples() from one controlling thread; the
// client handed in must be usable from the sampler's thread (kvtier::Client
// is thread-safe) and outlive Stop.
#ifndef KVTIER_TESTS_LOAD_RESOURCE_SAMPLER_H_
#define KVTIER_TESTS_LOAD_RESOURCE_SAMPLER_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "tests/load/op_stats.h"

namespace kvtier::load {

struct ResourceSample {
  double t_s = 0;  // since Start
  // /proc/<pid>: false when the process could not be read (it exited).
  bool proc_ok = false;
  uint64_t rss_bytes = 0, rss_anon_bytes = 0, rss_shmem_bytes = 0;
  uint64_t threads = 0, fds = 0;
  double cpu_s = 0;  // user + system CPU time since the daemon started
  // Admin Stats: false when the call failed (the error is in the log).
  bool stats_ok = false;
  uint64_t pinned_bytes = 0;         // summed over tiers
  uint64_t device_pinned_bytes = 0;  // the device tier's alone
  uint64_t device_used_bytes = 0, host_used_bytes = 0, nvme_used_bytes = 0;
  uint64_t device_blocks = 0, host_blocks = 0, nvme_blocks = 0;
  uint64_t active_leases = 0, open_contexts = 0, staging_slots = 0;
  uint64_t evicted_blocks = 0;  // since the daemon started
};

// Reads /proc/<pid> into *s (proc_ok) and calls Stats (stats_ok); *error
// gets why a part failed ("" when both worked).
void TakeSample(pid_t pid, Client* client, ResourceSample* s, std::string* error);

class ResourceSampler {
 public:
  ResourceSampler(pid_t pid, Client* client, std::chrono::milliseconds period);
  ~ResourceSampler();  // Stops

  // Takes a sample now and then every period.
  void Start();
  // Stops sampling and joins (the sample in progress completes).
  void Stop();
  // After Stop.
  const std::vector<ResourceSample>& samples() const { return samples_; }
  std::vector<std::string> errors() const;
  OpStats& stats_latency() { return latency_; }

 private:
  void Run();
  void SampleOnce();

  const pid_t pid_;
  Client* const client_;
  const std::chrono::milliseconds period_;
  std::chrono::steady_clock::time_point start_;
  std::thread thread_;
  std::vector<ResourceSample> samples_;  // written by thread_ only, read after Stop
  OpStats latency_;                      // likewise

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> errors_ ABSL_GUARDED_BY(mu_);
};

// The allowances of the flat check; see README.md.
struct FlatLimits {
  double warmup_s = 2;
  uint64_t rss_slack_bytes = 32ull << 20;  // RSS may grow by max(this,
  double rss_slack_fraction = 0.20;        //   this * start)
  uint64_t fd_slack = 8;
  uint64_t thread_slack = 8;
  uint64_t pinned_slack_bytes = 0;  // device pinned bytes may grow by this
};
inline constexpr size_t kMinWindowSamples = 3;

struct FlatCheck {
  std::string what;  // "rss_bytes", ...
  double start = 0, end = 0, limit = 0;
  bool ok = true;
};

// The flat checks over samples taken while the load ran (t_s <= load_end_s);
// empty, with *error set, when fewer than 2 * kMinWindowSamples samples follow
// the warm-up.
std::vector<FlatCheck> CheckFlat(const std::vector<ResourceSample>& samples, double load_end_s,
                                 const FlatLimits& limits, std::string* error);

}  // namespace kvtier::load

#endif  // KVTIER_TESTS_LOAD_RESOURCE_SAMPLER_H_
