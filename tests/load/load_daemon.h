// kvtierd as a child process for the load suite (load_test.cc,
// fairness_test.cc): started once with --set settings, READY=1 awaited
// over a NOTIFY_SOCKET, SIGTERMed; its log kept in the test's folder.
//
// Thread safety: one thread drives a LoadDaemon.
#ifndef KVTIER_TESTS_LOAD_LOAD_DAEMON_H_
#define KVTIER_TESTS_LOAD_LOAD_DAEMON_H_

#include <signal.h>

#include <chrono>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "tests/integration/subprocess.h"

namespace kvtier::load {

// kvtierd as a child process: started once, READY=1 awaited, SIGTERMed.
class LoadDaemon {
 public:
  LoadDaemon(std::string binary, std::string dir, std::vector<std::string> settings)
      : binary_(std::move(binary)), dir_(std::move(dir)), settings_(std::move(settings)) {}
  std::string socket_path() const { return dir_ + "/kvtierd.sock"; }
  std::string log_path() const { return dir_ + "/kvtierd.log"; }
  pid_t pid() const { return child_->pid(); }

  // Waits for READY=1 while the daemon runs; false (and *error, with the
  // log) when it exits or does not get ready within `timeout`.
  bool Start(std::chrono::milliseconds timeout, std::string* error) {
    testing::NotifySocket notify(dir_ + "/notify.sock");
    std::vector<std::string> argv = {binary_, "--data-dir", dir_ + "/data", "--socket",
                                     socket_path()};
    for (const std::string& s : settings_) {
      argv.push_back("--set");
      argv.push_back(s);
    }
    child_ = std::make_unique<testing::ChildProcess>(
        argv, std::vector<std::string>{"NOTIFY_SOCKET=" + notify.path()}, log_path());
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (notify.WaitFor("READY=1", std::chrono::milliseconds(200))) return true;
      if (child_->Wait(std::chrono::milliseconds(0)).has_value()) break;  // exited
    }
    *error = "kvtierd not ready; log:\n" + testing::ReadFile(log_path());
    return false;
  }
  // SIGTERM; the exit code, nullopt when it does not exit within timeout.
  std::optional<int> Stop(std::chrono::milliseconds timeout) {
    child_->Signal(SIGTERM);
    return child_->Wait(timeout);
  }
  // Lines of the log at level warn or above ("<time> warn ...": the text
  // format), e.g. the block store's "store: " warnings.
  std::vector<std::string> WarningLines() const {
    std::istringstream in(testing::ReadFile(log_path()));
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) {
      std::istringstream fields(line);
      std::string time, level;
      fields >> time >> level;
      if (level == "warn" || level == "warning" || level == "error" || level == "critical") {
        out.push_back(line);
      }
    }
    return out;
  }

 private:
  const std::string binary_, dir_;
  const std::vector<std::string> settings_;
  std::unique_ptr<testing::ChildProcess> child_;  // ~ChildProcess SIGKILLs a live child
};

}  // namespace kvtier::load

#endif  // KVTIER_TESTS_LOAD_LOAD_DAEMON_H_
