// Test helpers to run kvtierd / kvtierctl as real child processes.
//
// Thread safety: none; use from the test's main thread.
#ifndef KVTIER_TESTS_INTEGRATION_SUBPROCESS_H_
#define KVTIER_TESTS_INTEGRATION_SUBPROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace kvtier::testing {

// Output and exit code of a finished command.
struct CommandResult {
  int exit_code = -1;  // -1 if killed by a signal
  std::string out;
  std::string err;
};

// Runs argv to completion (with extra environment entries "K=V"), capturing
// stdout and stderr. Aborts the test run if the command cannot be started.
CommandResult RunCommand(const std::vector<std::string>& argv,
                         const std::vector<std::string>& env = {});

// A unix datagram socket standing in for systemd's NOTIFY_SOCKET.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path);
  ~NotifySocket();
  const std::string& path() const { return path_; }
  // Waits for a datagram containing `needle` (e.g. "READY=1"); false on
  // timeout.
  bool WaitFor(const std::string& needle, std::chrono::milliseconds timeout);

 private:
  std::string path_;
  int fd_ = -1;
};

// A child process with stderr captured to a file.
class ChildProcess {
 public:
  ChildProcess(const std::vector<std::string>& argv, const std::vector<std::string>& env,
               const std::string& stderr_path);
  ~ChildProcess();  // SIGKILLs a child still running
  pid_t pid() const { return pid_; }
  void Signal(int sig);
  // Waits for exit up to timeout; the exit code, -1 for death by a signal,
  // nullopt on timeout.
  std::optional<int> Wait(std::chrono::milliseconds timeout);

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

std::string ReadFile(const std::string& path);

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_INTEGRATION_SUBPROCESS_H_
