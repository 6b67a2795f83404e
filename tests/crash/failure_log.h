// FailureLog: the broken promises one crash-loop run found, each a line
// naming the cycle, the actor and (where there is one) the block id in hex.
//
// Thread safety: all methods may be called concurrently.
#ifndef KVTIER_TESTS_CRASH_FAILURE_LOG_H_
#define KVTIER_TESTS_CRASH_FAILURE_LOG_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace kvtier::crash {

class FailureLog {
 public:
  // Keeps the first kMaxKept lines and counts the rest.
  static constexpr size_t kMaxKept = 40;

  void Add(std::string line) {
    absl::MutexLock lock(&mu_);
    if (lines_.size() < kMaxKept) lines_.push_back(std::move(line));
    ++count_;
  }
  size_t count() const {
    absl::MutexLock lock(&mu_);
    return count_;
  }
  bool empty() const { return count() == 0; }
  // The kept lines, one per line, and how many more there were.
  std::string Text() const {
    absl::MutexLock lock(&mu_);
    std::string out;
    for (const std::string& line : lines_) out += line + "\n";
    if (count_ > lines_.size()) {
      out += "... and " + std::to_string(count_ - lines_.size()) + " more\n";
    }
    return out;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
  size_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier::crash

#endif  // KVTIER_TESTS_CRASH_FAILURE_LOG_H_
