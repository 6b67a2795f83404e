// CrashDaemon: kvtierd as a child process on one data directory, started
// again after every kill ("lives" 0, 1, 2, ...). Each life logs to a file
// of its own, so the log of the life that was killed is kept.
//
// Thread safety: none; use from the test's main thread.
#ifndef KVTIER_TESTS_CRASH_CRASH_DAEMON_H_
#define KVTIER_TESTS_CRASH_CRASH_DAEMON_H_

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tests/integration/subprocess.h"

namespace kvtier::crash {

struct CrashDaemonOptions {
  std::string binary;                 // kvtierd
  std::string dir;                    // data dir, socket, notify socket, logs
  std::vector<std::string> settings;  // "section.key=value", passed as --set
};

class CrashDaemon {
 public:
  explicit CrashDaemon(CrashDaemonOptions options);
  ~CrashDaemon();  // SIGKILLs a life still running

  // Starts the next life and waits (up to `timeout`) for READY=1. On
  // failure returns false and *error holds why and the life's log.
  bool Start(std::chrono::milliseconds timeout, std::string* error);
  // True when the current life is still running (has not exited by itself).
  bool Running();
  // SIGKILLs the current life and reaps it. False (and *error) when it had
  // already exited by itself or does not die within 10 s.
  bool Kill(std::string* error);
  // SIGTERM; the exit code (-1: killed by a signal), nullopt on timeout.
  std::optional<int> Stop(std::chrono::milliseconds timeout);

  int life() const { return life_; }
  std::string socket_path() const { return options_.dir + "/kvtierd.sock"; }
  std::string data_dir() const { return options_.dir + "/data"; }
  std::string log_path(int life) const;
  // Lines of the life's log containing `needle`.
  std::vector<std::string> LogLines(int life, const std::string& needle) const;

 private:
  const CrashDaemonOptions options_;
  int life_ = -1;
  std::unique_ptr<testing::ChildProcess> child_;
  bool reaped_ = true;
};

}  // namespace kvtier::crash

#endif  // KVTIER_TESTS_CRASH_CRASH_DAEMON_H_
