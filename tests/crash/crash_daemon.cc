#include "tests/crash/crash_daemon.h"

#include <signal.h>

#include <sstream>

namespace kvtier::crash {

CrashDaemon::CrashDaemon(CrashDaemonOptions options) : options_(std::move(options)) {}

CrashDaemon::~CrashDaemon() = default;  // ~ChildProcess SIGKILLs and reaps

std::string CrashDaemon::log_path(int life) const {
  return options_.dir + "/log-" + std::to_string(life);
}

bool CrashDaemon::Start(std::chrono::milliseconds timeout, std::string* error) {
  ++life_;
  testing::NotifySocket notify(options_.dir + "/notify.sock");
  std::vector<std::string> argv = {options_.binary, "--data-dir", data_dir(), "--socket",
                                   socket_path()};
  for (const std::string& s : options_.settings) {
    argv.push_back("--set");
    argv.push_back(s);
  }
  child_ = std::make_unique<testing::ChildProcess>(
      argv, std::vector<std::string>{"NOTIFY_SOCKET=" + notify.path()}, log_path(life_));
  reaped_ = false;
  // Waits in slices so that a daemon that exits at start-up (a failed
  // recovery, a bad option) is reported at once, not after the timeout.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (Running() && std::chrono::steady_clock::now() < deadline) {
    if (notify.WaitFor("READY=1", std::chrono::milliseconds(200))) return true;
  }
  *error = "kvtierd (life " + std::to_string(life_) + ") not ready within " +
           std::to_string(timeout.count()) + " ms" + (Running() ? "" : " (it exited)") +
           "; log:\n" + testing::ReadFile(log_path(life_));
  return false;
}

bool CrashDaemon::Running() {
  if (reaped_) return false;
  std::optional<int> code = child_->Wait(std::chrono::milliseconds(0));
  if (!code.has_value()) return true;
  reaped_ = true;
  return false;
}

bool CrashDaemon::Kill(std::string* error) {
  if (!Running()) {
    *error = "kvtierd (life " + std::to_string(life_) + ") exited before it was killed; log:\n" +
             testing::ReadFile(log_path(life_));
    return false;
  }
  child_->Signal(SIGKILL);
  if (!child_->Wait(std::chrono::seconds(10)).has_value()) {
    *error = "kvtierd did not die within 10 s of SIGKILL";
    return false;
  }
  reaped_ = true;
  return true;
}

std::optional<int> CrashDaemon::Stop(std::chrono::milliseconds timeout) {
  if (reaped_) return std::nullopt;
  child_->Signal(SIGTERM);
  std::optional<int> code = child_->Wait(timeout);
  if (code.has_value()) reaped_ = true;
  return code;
}

std::vector<std::string> CrashDaemon::LogLines(int life, const std::string& needle) const {
  std::istringstream in(testing::ReadFile(log_path(life)));
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    if (line.find(needle) != std::string::npos) out.push_back(line);
  }
  return out;
}

}  // namespace kvtier::crash
