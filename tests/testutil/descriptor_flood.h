// Running a process out of file descriptors, for the tests of accept loops
// (daemon/net): a lowered RLIMIT_NOFILE in this process, and connections
// held open by a child process, which has descriptors of its own.
// Header-only; objects are not thread-safe.
#ifndef KVTIER_TESTS_TESTUTIL_DESCRIPTOR_FLOOD_H_
#define KVTIER_TESTS_TESTUTIL_DESCRIPTOR_FLOOD_H_

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier::testing {

// Lowers this process's soft RLIMIT_NOFILE to the descriptors open now
// plus `headroom`; Restore() (or destruction) puts the old limit back.
// lowered() is false (with a test failure) when the limits could not be
// read or set.
class LowDescriptorLimit {
 public:
  explicit LowDescriptorLimit(size_t headroom) {
    if (::getrlimit(RLIMIT_NOFILE, &old_) != 0) {
      ADD_FAILURE() << "getrlimit";
      return;
    }
    size_t open_now = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
      (void)e;
      ++open_now;
    }
    rlimit low = old_;
    low.rlim_cur = open_now + headroom;
    ok_ = ::setrlimit(RLIMIT_NOFILE, &low) == 0;
    if (!ok_) ADD_FAILURE() << "setrlimit";
  }
  ~LowDescriptorLimit() { Restore(); }
  LowDescriptorLimit(const LowDescriptorLimit&) = delete;
  LowDescriptorLimit& operator=(const LowDescriptorLimit&) = delete;

  bool lowered() const { return ok_; }
  // The limit before this object lowered it.
  const rlimit& old() const { return old_; }
  void Restore() {
    if (ok_ && ::setrlimit(RLIMIT_NOFILE, &old_) != 0) ADD_FAILURE() << "setrlimit (restore)";
    ok_ = false;
  }

 private:
  rlimit old_{};
  bool ok_ = false;
};

// A child process that opens `count` connections with `connect` (called
// in the child, under `child_limit`) and holds them until Release() or
// destruction, which then waits for it.
class HeldConnections {
 public:
  HeldConnections(int count, const std::function<int()>& connect, const rlimit& child_limit) {
    int go[2];
    if (::pipe(go) != 0) {
      ADD_FAILURE() << "pipe";
      return;
    }
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setrlimit(RLIMIT_NOFILE, &child_limit);
      std::vector<int> fds;
      fds.reserve(static_cast<size_t>(count));
      for (int i = 0; i < count; ++i) fds.push_back(connect());
      char c;
      (void)!::read(go[0], &c, 1);  // hold them until the parent is done
      ::_exit(0);
    }
    ::close(go[0]);
    if (pid_ < 0) {
      ADD_FAILURE() << "fork";
      ::close(go[1]);
      return;
    }
    go_ = go[1];
  }
  ~HeldConnections() { Release(); }
  HeldConnections(const HeldConnections&) = delete;
  HeldConnections& operator=(const HeldConnections&) = delete;

  // The child closes its connections and exits; returns once it has.
  void Release() {
    if (go_ >= 0) {
      (void)!::write(go_, "x", 1);
      ::close(go_);
      go_ = -1;
    }
    if (pid_ > 0) {
      int status = 0;
      ::waitpid(pid_, &status, 0);
      pid_ = -1;
    }
  }

 private:
  pid_t pid_ = -1;
  int go_ = -1;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTUTIL_DESCRIPTOR_FLOOD_H_
