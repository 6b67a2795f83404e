// The daemon in-process: real gRPC over a Unix socket, real client library.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "client/client.h"
#include "daemon/config.h"
#include "daemon/server.h"
#include "gmock/gmock.h"
#include "gpu/device_probe.h"
#include "gtest/gtest.h"
#include "tests/integration/test_daemon.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

namespace kvtier {
namespace {

using ::testing::HasSubstr;
using testing::IsOk;
using testing::StartTestDaemon;
using testing::StatusIs;

// Small tiers so that each daemon starts fast.
const std::vector<std::string> kSmallTiers = {
    "tiers.device.capacity_bytes=1MiB", "tiers.host.capacity_bytes=4MiB",
    "tiers.host.staging_bytes=1MiB", "tiers.nvme.file_size_bytes=4MiB"};

// kSmallTiers and then `more`.
std::vector<std::string> SmallTiers(std::vector<std::string> more = {}) {
  more.insert(more.begin(), kSmallTiers.begin(), kSmallTiers.end());
  return more;
}

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = StartTestDaemon(dir_, SmallTiers());
    ASSERT_OK(daemon);
    config_ = daemon->config;
    server_ = std::move(daemon->server);
    client_ = std::move(daemon->client);
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
  }

  ::kvtier::testing::ScopedTempDir tmp_{"dt"};
  const std::string dir_ = tmp_.path();
  daemon::Config config_;
  std::unique_ptr<daemon::Server> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(DaemonTest, HealthIsServing) {
  auto health = client_->Health();
  ASSERT_OK(health);
  EXPECT_EQ(*health, ServingStatus::kServing);
}

TEST_F(DaemonTest, SocketHasConfiguredMode) {
  struct stat st;
  ASSERT_EQ(::stat(server_->socket_path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);
}

TEST_F(DaemonTest, StatsReportsEveryTier) {
  auto stats = client_->Stats();
  ASSERT_OK(stats);
  EXPECT_EQ(stats->version(), "0.1.0");
  ASSERT_EQ(stats->tiers_size(), 3);
  EXPECT_EQ(stats->tiers(0).tier(), v1::TIER_DEVICE);
  EXPECT_EQ(stats->tiers(0).capacity_bytes(), config_.device.capacity_bytes);
  EXPECT_EQ(stats->tiers(1).tier(), v1::TIER_HOST);
  EXPECT_EQ(stats->tiers(1).capacity_bytes(), config_.host.capacity_bytes);
  EXPECT_EQ(stats->tiers(2).tier(), v1::TIER_NVME);
  EXPECT_EQ(stats->tiers(2).capacity_bytes(), config_.nvme_capacity_bytes());
  EXPECT_EQ(stats->config().at("server.data_dir"), dir_);
}

TEST_F(DaemonTest, SecondDaemonOnSameSocketIsRefused) {
  auto second = StartTestDaemon(dir_, SmallTiers());
  EXPECT_THAT(second,
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("server.socket_path")));
  // The first daemon still answers.
  EXPECT_THAT(client_->Health(), IsOk());
}

TEST_F(DaemonTest, SecondDaemonOnSameDataDirIsRefused) {
  auto second = StartTestDaemon(dir_, SmallTiers({"server.socket_path=" + dir_ + "/other.sock"}));
  EXPECT_THAT(second,
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("server.data_dir")));
  // The first daemon and its arena are untouched.
  auto stats = client_->Stats();
  ASSERT_OK(stats);
  EXPECT_TRUE(std::filesystem::exists(stats->tiers(0).location()));
}

TEST_F(DaemonTest, CudaBackendWithoutDeviceIsRefusedNamingTheKey) {
  if (gpu::ProbeDevices().device_count > 0) GTEST_SKIP() << "a CUDA device is present";
  auto config =
      testing::TestDaemonConfig(dir_ + "-cuda", SmallTiers({"tiers.device.backend=cuda"}));
  ASSERT_OK(config);
  auto server = StartTestDaemon(dir_ + "-cuda", SmallTiers({"tiers.device.backend=cuda"}));
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("tiers.device.backend"));
  std::filesystem::remove_all(dir_ + "-cuda");
}

TEST_F(DaemonTest, StaleSocketFileIsReplaced) {
  std::string path = server_->socket_path();
  server_->Shutdown();
  // Leave a socket file nobody listens on, as a crashed daemon would.
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ::close(fd);
  ASSERT_TRUE(std::filesystem::exists(path));
  auto daemon = StartTestDaemon(dir_, SmallTiers());
  ASSERT_OK(daemon);
  EXPECT_EQ(daemon->server->socket_path(), path);
  EXPECT_THAT(daemon->client->Health(), IsOk());
}

TEST_F(DaemonTest, SelectOfAnUnknownContextFailsOnlyThatEntry) {
  grpc::ClientContext ctx;
  auto stream = client_->kvtier_stub()->Select(&ctx);
  v1::SelectRequest req;
  req.set_request_id(7);
  req.add_contexts()->set_context_id(12345);
  ASSERT_TRUE(stream->Write(req));
  v1::SelectResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  EXPECT_EQ(resp.request_id(), 7u);
  ASSERT_EQ(resp.contexts_size(), 1);
  EXPECT_EQ(resp.contexts(0).status().code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(resp.contexts(0).status().message(), HasSubstr("contexts[0].context_id"));
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_FALSE(stream->Read(&resp));
  EXPECT_OK(stream->Finish());
}

TEST_F(DaemonTest, ShutdownRemovesSocketAndStopsServing) {
  std::string path = server_->socket_path();
  server_->Shutdown();
  EXPECT_FALSE(std::filesystem::exists(path));
  ClientOptions options;
  options.call_timeout = std::chrono::milliseconds(300);
  auto client = Client::Connect(path, options);
  ASSERT_OK(client);
  EXPECT_FALSE((*client)->Health().ok());
}

// TCP (served only with TLS) is tested in tests/security/tls_test.cc.

}  // namespace
}  // namespace kvtier
