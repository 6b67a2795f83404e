#include "daemon/net/connection_gate.h"

#include <sys/stat.h>

namespace kvtier::daemon {
namespace {

// A full gate looks for closed connections at most this often, so that a
// flood of refused connections costs O(1) each, not a sweep each.
constexpr std::chrono::milliseconds kMinSweepInterval(20);

}  // namespace

bool ConnectionGate::Admit(int fd, uint32_t uid) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  absl::MutexLock lock(&mu_);
  // A descriptor number already counted was closed and is reused now.
  if (auto stale = open_.find(fd); stale != open_.end()) Forget(stale);
  if (FullLocked(uid) && std::chrono::steady_clock::now() - last_sweep_ >= kMinSweepInterval) {
    SweepLocked();
  }
  if (open_.size() >= limits_.max_total) {
    ++refused_total_;
    return false;
  }
  uint64_t& of_uid = per_uid_[uid];
  if (of_uid >= limits_.max_per_uid) {
    ++refused_uid_;
    return false;
  }
  ++of_uid;
  ++admitted_;
  open_[fd] = Entry{st.st_dev, st.st_ino, uid};
  return true;
}

bool ConnectionGate::FullLocked(uint32_t uid) const {
  if (open_.size() >= limits_.max_total) return true;
  auto it = per_uid_.find(uid);
  return it != per_uid_.end() && it->second >= limits_.max_per_uid;
}

void ConnectionGate::Sweep() {
  absl::MutexLock lock(&mu_);
  SweepLocked();
}

void ConnectionGate::SweepLocked() {
  last_sweep_ = std::chrono::steady_clock::now();
  for (auto it = open_.begin(); it != open_.end();) {
    struct stat st {};
    const bool same =
        ::fstat(it->first, &st) == 0 && st.st_dev == it->second.dev && st.st_ino == it->second.ino;
    if (same) {
      ++it;
    } else {
      auto gone = it++;
      Forget(gone);
    }
  }
}

void ConnectionGate::Forget(absl::flat_hash_map<int, Entry>::iterator it) {
  auto uid = per_uid_.find(it->second.uid);
  if (uid != per_uid_.end() && --uid->second == 0) per_uid_.erase(uid);
  open_.erase(it);
}

uint64_t ConnectionGate::OpenOf(uint32_t uid) const {
  absl::MutexLock lock(&mu_);
  auto it = per_uid_.find(uid);
  return it == per_uid_.end() ? 0 : it->second;
}

ConnectionGateStats ConnectionGate::stats() const {
  absl::MutexLock lock(&mu_);
  return ConnectionGateStats{open_.size(), admitted_, refused_uid_, refused_total_};
}

}  // namespace kvtier::daemon
