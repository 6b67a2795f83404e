// Running a process out of file descriptors, for the tests of accept loops
// (daemon/net): a lowered RLIMIT_NOFILE in this process, and connections
// held open by a child process, which has descriptors of its own.
// Header-only; objects are not thread-safe.
#ifndef KVTIER_TESTS_TESTUTIL_DESCRIPTOR_FLOOD_H_
#define KVTIER_TESTS_TESTUTIL_DESCRIPTOR_FLOOD_H_

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
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
  void Restore() {
    if (ok_ && ::setrlimit(RLIMIT_NOFILE, &old_) != 0) ADD_FAILURE() << "setrlimit (restore)";
    ok_ = false;
  }

 private:
  rlimit old_{};
  bool ok_ = false;
};

// Opens a connection and returns its descriptor (< 0 on failure).
using Connector = std::function<int()>;

// A child process that opens `count` connections with each connector
// (sending `speak` first on each when it is not empty), as user `uid` when
// it is >= 0, with its soft RLIMIT_NOFILE raised to the hard limit. The
// constructor returns once the child has opened them (opened() says how
// many); the child holds them until Release() or destruction, which then
// waits for it to exit.
class HeldConnections {
 public:
  HeldConnections(const std::vector<Connector>& connectors, int count,
                  const std::string& speak = "", int uid = -1) {
    int ready[2], go[2];
    if (::pipe(ready) != 0) {
      ADD_FAILURE() << "pipe";
      return;
    }
    if (::pipe(go) != 0) {
      ADD_FAILURE() << "pipe";
      ::close(ready[0]);
      ::close(ready[1]);
      return;
    }
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(ready[0]);
      ::close(go[1]);
      rlimit lim{};
      ::getrlimit(RLIMIT_NOFILE, &lim);
      lim.rlim_cur = lim.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &lim);
      if (uid >= 0 && (::setgid(uid) != 0 || ::setuid(uid) != 0)) ::_exit(2);
      int opened = 0;
      for (const Connector& connect : connectors) {
        for (int i = 0; i < count; ++i) {
          const int fd = connect();
          if (fd < 0) continue;
          if (!speak.empty()) (void)!::send(fd, speak.data(), speak.size(), MSG_NOSIGNAL);
          ++opened;
        }
      }
      (void)!::write(ready[1], &opened, sizeof(opened));
      char c;
      (void)!::read(go[0], &c, 1);  // hold them until the parent is done
      ::_exit(0);
    }
    ::close(ready[1]);
    ::close(go[0]);
    if (pid_ < 0) {
      ADD_FAILURE() << "fork";
      ::close(ready[0]);
      ::close(go[1]);
      return;
    }
    go_ = go[1];
    if (::read(ready[0], &opened_, sizeof(opened_)) != sizeof(opened_)) opened_ = -1;
    ::close(ready[0]);
  }
  ~HeldConnections() { Release(); }
  HeldConnections(const HeldConnections&) = delete;
  HeldConnections& operator=(const HeldConnections&) = delete;

  // Connections the child opened; -1 when it did not report.
  int opened() const { return opened_; }
  // The child closes its connections and exits; returns once it has.
  void Release() {
    if (pid_ <= 0) return;
    (void)!::write(go_, "x", 1);
    ::close(go_);
    go_ = -1;
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int go_ = -1;
  int opened_ = 0;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTUTIL_DESCRIPTOR_FLOOD_H_
