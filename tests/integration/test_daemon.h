// An in-process daemon for integration and security tests: small tiers in a
// private data directory, real gRPC over its Unix socket. Every in-process
// test daemon starts here. Header-only; not thread-safe (one per test
// fixture).
#ifndef KVTIER_TESTS_INTEGRATION_TEST_DAEMON_H_
#define KVTIER_TESTS_INTEGRATION_TEST_DAEMON_H_

#include <unistd.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "daemon/config.h"
#include "daemon/server.h"
#include "gtest/gtest.h"
#include "storage/env/env.h"

namespace kvtier::testing {

// The settings every test daemon starts from: `dir` as data folder, 4 MiB
// device, 16 MiB host (256 KiB staging) and one 16 MiB NVMe file on one
// I/O thread.
inline std::vector<std::string> TestDaemonSettings(const std::string& dir) {
  return {"server.data_dir=" + dir,          "log.level=warn",
          "server.shutdown_grace_ms=1000",   "tiers.device.capacity_bytes=4MiB",
          "tiers.host.capacity_bytes=16MiB", "tiers.host.staging_bytes=256KiB",
          "tiers.nvme.file_count=1",         "tiers.nvme.file_size_bytes=16MiB",
          "tiers.nvme.io_threads=1"};
}

struct TestDaemonOptions {
  // "key=value" settings applied after TestDaemonSettings(dir); a key given
  // here replaces the default one (the last setting of a key wins).
  std::vector<std::string> overrides;
  // The block store's Env (Server::Start); nullptr: Env::Default(). Must
  // outlive the daemon.
  Env* env = nullptr;
  // Whether to open `client` on the daemon's Unix socket, with
  // `client_options` (a token when auth is on).
  bool connect = true;
  ClientOptions client_options;
};

struct TestDaemon {
  daemon::Config config;  // as the daemon was started with it
  std::unique_ptr<daemon::Server> server;
  std::unique_ptr<Client> client;  // null when TestDaemonOptions::connect is false
};

// The Config StartTestDaemon would start with: LoadConfig's error
// (INVALID_ARGUMENT naming the key) for a bad override.
inline absl::StatusOr<daemon::Config> TestDaemonConfig(const std::string& dir,
                                                       const std::vector<std::string>& overrides) {
  std::vector<std::string> settings = TestDaemonSettings(dir);
  settings.insert(settings.end(), overrides.begin(), overrides.end());
  return daemon::LoadConfig("", settings);
}

// Starts a daemon on `dir` (created if absent) with TestDaemonSettings(dir)
// then options.overrides, and connects a client to it. Returns the first
// error of LoadConfig, Server::Start or Client::Connect unchanged, so tests
// of a refused start can check its code and message.
inline absl::StatusOr<TestDaemon> StartTestDaemon(const std::string& dir,
                                                  const TestDaemonOptions& options) {
  auto config = TestDaemonConfig(dir, options.overrides);
  if (!config.ok()) return config.status();
  TestDaemon out;
  out.config = *std::move(config);
  auto server = daemon::Server::Start(out.config, options.env);
  if (!server.ok()) return server.status();
  out.server = std::move(*server);
  if (!options.connect) return out;
  auto client = Client::Connect(out.server->socket_path(), options.client_options);
  if (!client.ok()) return client.status();
  out.client = std::move(*client);
  return out;
}

inline absl::StatusOr<TestDaemon> StartTestDaemon(const std::string& dir,
                                                  const std::vector<std::string>& overrides) {
  TestDaemonOptions options;
  options.overrides = overrides;
  return StartTestDaemon(dir, options);
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_INTEGRATION_TEST_DAEMON_H_
