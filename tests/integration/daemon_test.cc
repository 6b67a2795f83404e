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
#include "gpu/device_probe.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier {
namespace {

using ::testing::HasSubstr;

// Small tiers so that each daemon starts fast.
std::vector<std::string> SmallConfig(const std::string& dir) {
  return {"server.data_dir=" + dir,          "log.level=warn",
          "server.shutdown_grace_ms=1000",   "tiers.device.capacity_bytes=1MiB",
          "tiers.host.capacity_bytes=4MiB",  "tiers.host.staging_bytes=1MiB",
          "tiers.nvme.file_count=1",         "tiers.nvme.file_size_bytes=4MiB",
          "tiers.nvme.io_threads=1"};
}

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = "/tmp/kvtier-dt-" + std::to_string(::getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    auto config = daemon::LoadConfig("", SmallConfig(dir_));
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    auto server = daemon::Server::Start(config_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    auto client = Client::Connect(server_->socket_path());
    ASSERT_TRUE(client.ok());
    client_ = std::move(*client);
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::string dir_;
  daemon::Config config_;
  std::unique_ptr<daemon::Server> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(DaemonTest, HealthIsServing) {
  auto health = client_->Health();
  ASSERT_TRUE(health.ok()) << health.status();
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
  ASSERT_TRUE(stats.ok()) << stats.status();
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
  auto second = daemon::Server::Start(config_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("server.socket_path"));
  // The first daemon still answers.
  EXPECT_TRUE(client_->Health().ok());
}

TEST_F(DaemonTest, SecondDaemonOnSameDataDirIsRefused) {
  daemon::Config other = config_;
  other.server.socket_path = dir_ + "/other.sock";
  auto second = daemon::Server::Start(other);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("server.data_dir"));
  // The first daemon and its arena are untouched.
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_TRUE(std::filesystem::exists(stats->tiers(0).location()));
}

TEST_F(DaemonTest, CudaBackendWithoutDeviceIsRefusedNamingTheKey) {
  if (gpu::ProbeDevices().device_count > 0) GTEST_SKIP() << "a CUDA device is present";
  auto overrides = SmallConfig(dir_ + "-cuda");
  overrides.push_back("tiers.device.backend=cuda");
  auto config = daemon::LoadConfig("", overrides);
  ASSERT_TRUE(config.ok());
  auto server = daemon::Server::Start(*config);
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
  auto server = daemon::Server::Start(config_);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = Client::Connect(path);
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE((*client)->Health().ok());
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
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(DaemonTest, ShutdownRemovesSocketAndStopsServing) {
  std::string path = server_->socket_path();
  server_->Shutdown();
  EXPECT_FALSE(std::filesystem::exists(path));
  ClientOptions options;
  options.call_timeout = std::chrono::milliseconds(300);
  auto client = Client::Connect(path, options);
  ASSERT_TRUE(client.ok());
  EXPECT_FALSE((*client)->Health().ok());
}

// TCP (served only with TLS) is tested in tests/security/tls_test.cc.

}  // namespace
}  // namespace kvtier
