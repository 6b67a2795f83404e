// kvtierd: the kvtier daemon. See README.md and deploy/kvtierd.toml.
#include <malloc.h>
#include <signal.h>
#include <systemd/sd-daemon.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "daemon/config.h"
#include "daemon/logging.h"
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
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  spdlog::info("kvtierd {} starting config={}", kvtier::kVersion,
               config_path.empty() ? "<embedded defaults>" : config_path);
  auto server = kvtier::daemon::Server::Start(*config);
  if (!server.ok()) {
    spdlog::critical("start failed: {}", std::string(server.status().message()));
    return 1;
  }
  sd_notify(0, "READY=1\nSTATUS=serving");

  int sig = 0;
  sigwait(&stop_signals, &sig);
  spdlog::info("signal {} received, shutting down (grace {} ms)", sig,
               config->server.shutdown_grace_ms);
  sd_notify(0, "STOPPING=1");
  (*server)->Shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
