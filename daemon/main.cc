// kvtierd: the kvtier daemon. See README.md and deploy/kvtierd.toml.
#include <malloc.h>
#include <signal.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>

#include <time.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include "daemon/config.h"
#include "daemon/logging.h"
#include "daemon/net/fd_limit.h"
#include "daemon/server.h"
#include "daemon/version.h"

namespace {

int Run(int argc, char** argv) {
  CLI::App app{"kvtierd: tiered KV-cache block store for LLM serving"};
  std::string config_path;
  std::vector<std::string> overrides;
  std::string data_dir, socket, tcp, log_level;
  bool print_defaults = false, check_only = false, version = false;
  app.add_option("-c,--config", config_path, "TOML configuration file (default: embedded)");
  app.add_option("--set", overrides, "Override a key: section.key=value (repeatable)");
  app.add_option("--data-dir", data_dir, "Same as --set server.data_dir=DIR");
  app.add_option("--socket", socket, "Same as --set server.socket_path=PATH");
  app.add_option("--tcp", tcp, "Same as --set server.tcp_address=HOST:PORT");
  app.add_option("--log-level", log_level, "Same as --set log.level=LEVEL");
  app.add_flag("--print-default-config", print_defaults, "Print the embedded defaults and exit");
  app.add_flag("--check-config", check_only, "Validate the configuration and exit");
  app.add_flag("--version", version, "Print the version and exit");
  CLI11_PARSE(app, argc, argv);

  if (version) {
    std::cout << "kvtierd " << kvtier::kVersion << "\n";
    return 0;
  }
  if (print_defaults) {
    std::cout << kvtier::daemon::DefaultConfigToml();
    return 0;
  }
  if (!data_dir.empty()) overrides.push_back("server.data_dir=" + data_dir);
  if (!socket.empty()) overrides.push_back("server.socket_path=" + socket);
  if (!tcp.empty()) overrides.push_back("server.tcp_address=" + tcp);
  if (!log_level.empty()) overrides.push_back("log.level=" + log_level);

  auto config = kvtier::daemon::LoadConfig(config_path, overrides);
  if (!config.ok()) {
    std::fprintf(stderr, "kvtierd: configuration error: %s\n",
                 std::string(config.status().message()).c_str());
    return 2;
  }
  if (check_only) {
    std::cout << "configuration OK\n";
    return 0;
  }
  kvtier::daemon::InitLogging(config->log.level, config->log.format);
  // Message buffers and block strings are megabytes each: keep glibc from
  // mapping and unmapping them per message (the kernel zeroes every fresh
  // page), while bounding what it may keep.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);

  // Block the stop signals before any thread exists so that every thread
  // inherits the mask and only sigwait() below sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);  // reload auth.tenants_file
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Connections are capped below this (daemon/net/fd_limit.h).
  const uint64_t nofile = kvtier::daemon::RaiseFdLimit();

  spdlog::info("kvtierd {} starting config={} RLIMIT_NOFILE={}", kvtier::kVersion,
               config_path.empty() ? "<embedded defaults>" : config_path, nofile);
  auto server = kvtier::daemon::Server::Start(*config);
  if (!server.ok()) {
    spdlog::critical("start failed: {}", std::string(server.status().message()));
    return 1;
  }
  sd_notify(0, "READY=1\nSTATUS=serving");

  // The signal loop doubles as the watchdog's: with WatchdogSec set it
  // pings at half the interval, and only while the runtime's reaper keeps
  // completing rounds (a wedged store lock stops the pings and systemd
  // restarts the daemon).
  uint64_t watchdog_usec = 0;
  const bool watchdog = sd_watchdog_enabled(0, &watchdog_usec) > 0 && watchdog_usec > 0;
  const auto ping_every = std::chrono::microseconds(watchdog ? watchdog_usec / 2 : 0);
  kvtier::daemon::Runtime* runtime = (*server)->runtime();
  int sig = 0;
  while (true) {
    if (watchdog) {
      timespec timeout{static_cast<time_t>(ping_every.count() / 1000000),
                       static_cast<long>(ping_every.count() % 1000000) * 1000};
      sig = sigtimedwait(&stop_signals, nullptr, &timeout);
      if (sig < 0) {
        if (runtime->Responsive(
                std::chrono::duration_cast<std::chrono::milliseconds>(ping_every))) {
          sd_notify(0, "WATCHDOG=1");
        } else {
          spdlog::warn("watchdog: the reaper has not completed a round in {} ms; not pinging",
                       std::chrono::duration_cast<std::chrono::milliseconds>(ping_every).count());
        }
        continue;
      }
    } else if (sigwait(&stop_signals, &sig) != 0) {
      continue;
    }
    if (sig != SIGHUP) break;
    sd_notify(0, "RELOADING=1");
    absl::Status reloaded = runtime->ReloadTenants();
    if (reloaded.ok()) {
      spdlog::info("SIGHUP: tenants reloaded from {}", config->auth.tenants_file.empty()
                                                           ? "<authentication off>"
                                                           : config->auth.tenants_file);
    } else {
      spdlog::error("SIGHUP: tenants not reloaded (the previous table stays): {}",
                    std::string(reloaded.message()));
    }
    sd_notify(0, "READY=1\nSTATUS=serving");
  }
  spdlog::info("signal {} received, shutting down (grace {} ms)", sig,
               config->server.shutdown_grace_ms);
  sd_notify(0, "STOPPING=1");
  (*server)->Shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread starts: whatever the daemon or its libraries (RocksDB)
  // create is for the daemon's user alone; files meant for clients (the
  // sockets, the arena) get their modes explicitly.
  ::umask(0077);
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvtierd: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "kvtierd: unknown exception\n");
  }
  return 1;
}
