// Prefaulter: touches shared-memory regions (the host tier, the staging
// area, CPU device arenas) ahead of use, on a background thread, so the
// first requests after start do not pay for the kernel's first-touch work
// (allocating and zeroing each page, mapping it).
//
//   Prefaulter prefaulter;
//   prefaulter.Add(/*tier=*/1, host_region);  // returns at once
//   ... prefaulter.stats(1) -> {target_bytes, done_bytes}
//
// Each region is populated in chunks of kChunkBytes: madvise(
// MADV_POPULATE_WRITE) (Linux 5.14+; skipped where the kernel lacks it)
// allocates and maps the pages, then one atomic no-op write per page (an
// OR of 0 into its first word) makes the mapping writable and dirty. No
// byte ever changes, even while requests or clients write the region
// concurrently, so a region may be used while it is being populated. A
// chunk that fails (e.g. ENOMEM on a full tmpfs) ends that region's pass:
// the rest is counted in failed_bytes and the error kept as last_error;
// those pages are then faulted in by their first use, as without a
// prefaulter.
//
// Regions are queued in order and done one at a time by one thread at
// nice 19. A region must stay mapped
// until the Prefaulter is destroyed or it is done: owners destroy the
// Prefaulter (which stops after the chunk in progress) before unmapping.
//
// Thread safety: all methods are thread-safe.
#ifndef KVTIER_STORAGE_HOST_PREFAULTER_H_
#define KVTIER_STORAGE_HOST_PREFAULTER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kvtier {

struct PrefaultStats {
  uint64_t target_bytes = 0;  // bytes of every region added
  uint64_t done_bytes = 0;    // of those, populated
  uint64_t failed_bytes = 0;  // of those, given up after an error
  std::string last_error;     // empty when none
};

class Prefaulter {
 public:
  static constexpr size_t kChunkBytes = size_t{2} << 20;
  static constexpr int kGroups = 4;  // stats are kept per group (a tier id)

  Prefaulter() = default;
  Prefaulter(const Prefaulter&) = delete;
  Prefaulter& operator=(const Prefaulter&) = delete;
  // Stops after the chunk in progress; regions not done stay as they are.
  ~Prefaulter();

  // Queues `region`, counted under `group` (0 .. kGroups-1; others are
  // ignored). The thread starts with the first region.
  void Add(int group, std::span<std::byte> region);
  PrefaultStats stats(int group) const;
  // Blocks until every region added so far is done or failed.
  void WaitIdle();

 private:
  struct Job {
    int group;
    std::span<std::byte> region;
  };
  void Loop();
  // Populates [begin, end) of a chunk; errno-style error text or empty.
  static std::string Populate(std::byte* begin, size_t bytes);

  mutable absl::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  PrefaultStats stats_[kGroups] ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // started by the first Add (under mu_); waits for more
};

}  // namespace kvtier

#endif  // KVTIER_STORAGE_HOST_PREFAULTER_H_
