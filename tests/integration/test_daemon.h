// An in-process daemon for integration tests: small tiers in a private data
// directory, real gRPC over its Unix socket. Header-only; not thread-safe
// (one per test fixture).
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

namespace kvtier::testing {

// "/tmp/kvtier-<tag>-<pid>-<test name>": unique per test and process.
inline std::string TestDataDir(const std::string& tag) {
  return "/tmp/kvtier-" + tag + "-" + std::to_string(::getpid()) + "-" +
         ::testing::UnitTest::GetInstance()->current_test_info()->name();
}

struct TestDaemon {
  std::unique_ptr<daemon::Server> server;
  std::unique_ptr<Client> client;
};

// Starts a daemon on `dir` with 4 MiB device, 16 MiB host (256 KiB staging)
// and one 16 MiB NVMe file on one I/O thread; `overrides` ("key=value")
// come after these and may replace them.
inline absl::StatusOr<TestDaemon> StartTestDaemon(const std::string& dir,
                                                  const std::vector<std::string>& overrides) {
  std::vector<std::string> settings = {
      "server.data_dir=" + dir,           "log.level=warn",
      "server.shutdown_grace_ms=1000",    "tiers.device.capacity_bytes=4MiB",
      "tiers.host.capacity_bytes=16MiB",  "tiers.host.staging_bytes=256KiB",
      "tiers.nvme.file_count=1",          "tiers.nvme.file_size_bytes=16MiB",
      "tiers.nvme.io_threads=1"};
  settings.insert(settings.end(), overrides.begin(), overrides.end());
  auto config = daemon::LoadConfig("", settings);
  if (!config.ok()) return config.status();
  auto server = daemon::Server::Start(*config);
  if (!server.ok()) return server.status();
  TestDaemon out;
  out.server = std::move(*server);
  auto client = Client::Connect(out.server->socket_path());
  if (!client.ok()) return client.status();
  out.client = std::move(*client);
  return out;
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_INTEGRATION_TEST_DAEMON_H_
