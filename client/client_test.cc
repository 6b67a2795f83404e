#include "client/client.h"

#include <grpcpp/grpcpp.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

using ::kvtier::testing::StatusIs;

namespace kvtier {
namespace {

// The same table as the Python package's test_package.py.
TEST(NormalizeTargetTest, AgreesWithThePythonPackage) {
  std::ifstream table(std::string(KVTIER_SOURCE_DIR) + "/client/testdata/normalize_target.txt");
  ASSERT_TRUE(table.is_open());
  const std::string cwd = std::filesystem::current_path().string();
  std::string line;
  int cases = 0;
  while (std::getline(table, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t tab = line.find('\t');
    ASSERT_NE(tab, std::string::npos) << line;
    const std::string given = line.substr(0, tab);
    std::string want = line.substr(tab + 1);
    if (size_t at = want.find("$CWD"); at != std::string::npos) want.replace(at, 4, cwd);
    EXPECT_EQ(NormalizeTarget(given), want) << given;
    ++cases;
  }
  EXPECT_GE(cases, 10);
}

TEST(ClientTest, EmptyTargetIsInvalid) {
  auto client = Client::Connect("");
  EXPECT_THAT(client.status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ClientTest, NoDaemonIsUnavailable) {
  ClientOptions options;
  options.call_timeout = std::chrono::milliseconds(500);
  auto client = Client::Connect("/nonexistent/kvtier.sock", options);
  ASSERT_OK(client);
  auto health = (*client)->Health();
  ASSERT_FALSE(health.ok());
  EXPECT_TRUE(health.status().code() == absl::StatusCode::kUnavailable ||
              health.status().code() == absl::StatusCode::kDeadlineExceeded)
      << health.status();
}

TEST(ClientTest, TokensThatCannotBeMetadataAreRefused) {
  for (const std::string& token : {std::string("a b"), std::string("a\nb"), std::string("\x80"),
                                   std::string(kMaxTokenBytes + 1, 'x')}) {
    ClientOptions options;
    options.token = token;
    auto client = Client::Connect("/run/kvtier.sock", options);
    EXPECT_THAT(client.status(), StatusIs(absl::StatusCode::kInvalidArgument)) << token;
    EXPECT_NE(client.status().message().find("options.token"), std::string::npos);
  }
  ClientOptions options;
  options.token = std::string(kMaxTokenBytes, 'x');
  EXPECT_OK(Client::Connect("/run/kvtier.sock", options));
}

TEST(ClientTest, SharedFileSourcesFollowTheResponse) {
  ClientOptions options;
  options.token = "tok";
  auto client = *Client::Connect("/run/kvtier.sock", options);
  v1::OpenArenaResponse by_path;
  by_path.set_shm_path("/dev/shm/arena");
  client::SharedFileSource a = client->ArenaSource(by_path);
  EXPECT_EQ(a.path, "/dev/shm/arena");
  EXPECT_TRUE(a.fd_socket_path.empty());
  EXPECT_TRUE(a.token.empty()) << "the token goes only to the fd socket";
  v1::ReserveSlotsResponse by_fd;
  by_fd.set_fd_socket_path("/run/kvtier/fd.sock");
  client::SharedFileSource s = client->StagingSource(by_fd);
  EXPECT_TRUE(s.path.empty());
  EXPECT_EQ(s.fd_socket_path, "/run/kvtier/fd.sock");
  EXPECT_EQ(s.token, "tok");
}

// Records the authorization metadata of every call it serves.
class MetadataLog {
 public:
  void Record(const grpc::ServerContext* ctx) {
    auto it = ctx->client_metadata().find("authorization");
    std::lock_guard<std::mutex> lock(mu_);
    seen_.push_back(it == ctx->client_metadata().end()
                        ? "<none>"
                        : std::string(it->second.data(), it->second.size()));
  }
  std::vector<std::string> seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> seen_;
};

class RecordingAdmin final : public v1::Admin::Service {
 public:
  explicit RecordingAdmin(MetadataLog* log) : log_(log) {}
  grpc::Status Stats(grpc::ServerContext* ctx, const v1::StatsRequest*,
                     v1::StatsResponse* resp) override {
    log_->Record(ctx);
    resp->set_version("fake");
    return grpc::Status::OK;
  }
  grpc::Status Drain(grpc::ServerContext* ctx, const v1::DrainRequest*,
                     grpc::ServerWriter<v1::DrainProgress>* writer) override {
    log_->Record(ctx);
    writer->Write(v1::DrainProgress());
    return grpc::Status::OK;
  }

 private:
  MetadataLog* const log_;
};

class RecordingKvTier final : public v1::KvTier::Service {
 public:
  explicit RecordingKvTier(MetadataLog* log) : log_(log) {}
  grpc::Status PutBlocks(grpc::ServerContext* ctx, grpc::ServerReader<v1::PutBlocksRequest>* r,
                         v1::PutBlocksResponse* resp) override {
    log_->Record(ctx);
    v1::PutBlocksRequest req;
    // Counted as the daemon does: the client checks it.
    while (r->Read(&req)) resp->set_messages_received(resp->messages_received() + 1);
    return grpc::Status::OK;
  }
  grpc::Status Select(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::SelectResponse, v1::SelectRequest>* stream) override {
    log_->Record(ctx);
    v1::SelectRequest req;
    while (stream->Read(&req)) {
      v1::SelectResponse resp;
      resp.set_request_id(req.request_id());
      stream->Write(resp);
    }
    return grpc::Status::OK;
  }

 private:
  MetadataLog* const log_;
};

// A gRPC server on a Unix socket in a fresh temp folder.
class FakeDaemon {
 public:
  FakeDaemon() : admin_(&log_), kvtier_(&log_) {
    path_ = dir_.File("kvtierd.sock");
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + path_, grpc::InsecureServerCredentials());
    builder.RegisterService(&admin_);
    builder.RegisterService(&kvtier_);
    server_ = builder.BuildAndStart();
  }
  ~FakeDaemon() { server_->Shutdown(); }
  const std::string& path() const { return path_; }
  MetadataLog& log() { return log_; }

 private:
  MetadataLog log_;
  RecordingAdmin admin_;
  RecordingKvTier kvtier_;
  ::kvtier::testing::ScopedTempDir dir_{"client-test"};
  std::string path_;
  std::unique_ptr<grpc::Server> server_;
};

// Unary, client-streaming, server-streaming and bidirectional calls, via the
// wrappers and via the raw stubs.
std::vector<std::string> MakeEveryKindOfCall(Client& client) {
  EXPECT_OK(client.Stats());
  EXPECT_OK(client.PutBlocks({v1::PutBlocksRequest()}));
  {
    grpc::ClientContext ctx;
    auto reader = client.admin_stub()->Drain(&ctx, v1::DrainRequest());
    v1::DrainProgress progress;
    while (reader->Read(&progress)) {
    }
    EXPECT_OK(reader->Finish());
  }
  {
    grpc::ClientContext ctx;
    auto stream = client.kvtier_stub()->Select(&ctx);
    v1::SelectRequest req;
    req.set_request_id(7);
    EXPECT_TRUE(stream->Write(req));
    v1::SelectResponse resp;
    EXPECT_TRUE(stream->Read(&resp));
    EXPECT_EQ(resp.request_id(), 7u);
    stream->WritesDone();
    EXPECT_OK(stream->Finish());
  }
  return {"Stats", "PutBlocks", "Drain", "Select"};
}

TEST(ClientTokenTest, EveryCallCarriesTheBearerToken) {
  FakeDaemon daemon;
  ClientOptions options;
  options.token = "s3cret-Token_1";
  auto client = *Client::Connect(daemon.path(), options);
  const std::vector<std::string> calls = MakeEveryKindOfCall(*client);
  const std::vector<std::string> seen = daemon.log().seen();
  ASSERT_EQ(seen.size(), calls.size());
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i], "Bearer s3cret-Token_1") << calls[i];
  }
}

TEST(ClientTokenTest, NoTokenSendsNoAuthorization) {
  FakeDaemon daemon;
  auto client = *Client::Connect(daemon.path());
  const std::vector<std::string> calls = MakeEveryKindOfCall(*client);
  const std::vector<std::string> seen = daemon.log().seen();
  ASSERT_EQ(seen.size(), calls.size());
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], "<none>") << calls[i];
}

}  // namespace
}  // namespace kvtier
