// LockedStats<Stats>: the counters a class reports, kept in the very struct
// it reports them in, behind one mutex. A class holds
//
//   LockedStats<UnixAcceptorStats> stats_;
//
// counts with stats_.Add(&UnixAcceptorStats::accepted) and answers
// stats() with stats_.Get(): no parallel list of atomics, no field-by-field
// copy that a new counter could miss, and every field of a snapshot is from
// the same moment (a relaxed atomic per counter gave fields from different
// moments).
//
// Stats is a copyable struct; the fields named are uint64_t. An uncontended
// lock costs about what the atomic add it replaces did; the counters here
// are bumped per connection, per I/O or per request, never per byte.
//
// Thread safety: every method may be called from any thread at any time.
#ifndef KVTIER_STORAGE_COMMON_LOCKED_STATS_H_
#define KVTIER_STORAGE_COMMON_LOCKED_STATS_H_

#include <cstdint>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kvtier {

template <typename Stats>
class LockedStats {
 public:
  using Field = uint64_t Stats::*;

  LockedStats() = default;
  LockedStats(const LockedStats&) = delete;
  LockedStats& operator=(const LockedStats&) = delete;

  // Adds n to one field; returns its new value.
  uint64_t Add(Field field, uint64_t n = 1) {
    absl::MutexLock lock(&mu_);
    return stats_.*field += n;
  }

  // Sets one field (a gauge: a count of what is open now).
  void Set(Field field, uint64_t value) {
    absl::MutexLock lock(&mu_);
    stats_.*field = value;
  }

  // Runs update(Stats&) under the lock, for changes that must land
  // together. `update` must not call back into this object.
  template <typename Update>
  void Change(Update&& update) {
    absl::MutexLock lock(&mu_);
    std::forward<Update>(update)(stats_);
  }

  // A copy of every field, all from one moment.
  Stats Get() const {
    absl::MutexLock lock(&mu_);
    return stats_;
  }

 private:
  mutable absl::Mutex mu_;
  Stats stats_ ABSL_GUARDED_BY(mu_){};
};

}  // namespace kvtier

#endif  // KVTIER_STORAGE_COMMON_LOCKED_STATS_H_
