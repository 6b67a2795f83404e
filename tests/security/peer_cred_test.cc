// Finding 11 of the tenant-abuse review: a local engine reaches its tenant
// without a token through auth.peer_socket_path, by the uid the kernel
// reports (SO_PEERCRED); the uid cannot be claimed by metadata, a uid no
// tenant lists is refused, and a reload that removes the uid ends its
// streams.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include "daemon/auth/peer_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtier/v1/kvtier.grpc.pb.h"
#include "tests/security/security_fixture.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::security {
namespace {

using ::testing::HasSubstr;
using testing::StatusIs;

constexpr uint32_t kOtherUid = 4242;  // listed for tenant b; no process runs as it

class PeerCredTest : public SecurityTest {
 protected:
  void SetUp() override {
    uid_ = ::getuid();
    StartDaemon({"auth.peer_socket_path=/tmp/kvtier-peer-" + std::to_string(::getpid()) + ".sock"},
                LocalTenant(true));
    peer_path_ = config_.auth.peer_socket_path;
  }

  // Tenant "local" with this process's uid (and b's extra uid), or
  // without it.
  std::string LocalTenant(bool with_uid) const {
    std::string t = "[[tenants]]\nname = \"local\"\nrole = \"data\"\nuids = [" +
                    (with_uid ? std::to_string(uid_) : std::string("7")) + "]\n";
    t += "[[tenants]]\nname = \"other\"\nrole = \"data\"\nuids = [" + std::to_string(kOtherUid) +
         "]\n";
    return t;
  }

  std::unique_ptr<Client> Peer() {
    auto c = Client::Connect(peer_path_, ClientOptions{});
    EXPECT_OK(c);
    return c.ok() ? std::move(*c) : nullptr;
  }

  std::unique_ptr<v1::KvTier::Stub> RawStub(const std::string& path) {
    return v1::KvTier::NewStub(
        grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials()));
  }

  uint32_t uid_ = 0;
  std::string peer_path_;
};

TEST_F(PeerCredTest, ALocalUserIsItsTenantWithoutAToken) {
  auto local = Peer();
  const uint64_t profile = Register(local.get());
  ASSERT_NE(profile, 0u);
  const std::vector<std::string> ids = Ids("peer", 3);
  EXPECT_EQ(Put(local.get(), profile, ids, 11), std::vector<int>(3, 0));
  EXPECT_GT(server_->runtime()->store()->UsageOf("local").host_bytes, 0u);
  // Another tenant (with its token) does not see them.
  auto a = As("a");
  v1::LookupRequest lookup;
  lookup.set_profile_id(Register(a.get()));
  for (const auto& id : ids) lookup.add_block_ids(id);
  auto seen = a->Lookup(lookup);
  ASSERT_OK(seen);
  for (const auto& e : seen->entries()) EXPECT_FALSE(e.present());
  EXPECT_EQ(server_->peer_server()->stats().accepted, 1u);
}

TEST_F(PeerCredTest, TheUidCannotBeClaimedByMetadata) {
  // On the peer socket a claimed uid is replaced by the real one: the put
  // lands with "local", not with "other" (the claimed uid's tenant).
  auto stub = RawStub(peer_path_);
  auto local = Peer();
  const uint64_t profile = Register(local.get());
  grpc::ClientContext ctx;
  ctx.AddMetadata("kvtier-peer-uid", std::to_string(kOtherUid));
  v1::PutBlocksResponse put_response;
  auto put = stub->PutBlocks(&ctx, &put_response);
  v1::PutBlocksRequest put_req;
  put_req.set_profile_id(profile);
  v1::BlockPut* b = put_req.add_blocks();
  b->set_block_id(BlockIdOf("claimed", 0));
  b->set_data(Payload(5));
  ASSERT_TRUE(put->Write(put_req));
  put->WritesDone();
  grpc::Status st = put->Finish();
  ASSERT_OK(st) << st.error_message();
  ASSERT_EQ(put_response.results_size(), 1);
  EXPECT_EQ(put_response.results(0).status().code(), 0);
  EXPECT_GT(server_->runtime()->store()->UsageOf("local").host_bytes, 0u);
  EXPECT_EQ(server_->runtime()->store()->UsageOf("other").host_bytes, 0u);
  v1::RegisterProfileRequest req;
  *req.mutable_profile() = Profile();

  // On the main socket the key is refused, with a token or without.
  auto main_stub = RawStub(server_->socket_path());
  for (bool with_token : {false, true}) {
    grpc::ClientContext c;
    c.AddMetadata("kvtier-peer-uid", std::to_string(uid_));
    if (with_token) c.AddMetadata("authorization", "Bearer " + tokens_["a"]);
    v1::RegisterProfileResponse r;
    grpc::Status s = main_stub->RegisterProfile(&c, req, &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << with_token;
    EXPECT_THAT(s.error_message(), HasSubstr("kvtier-peer-uid")) << with_token;
  }
}

TEST_F(PeerCredTest, AUidNoTenantListsIsClosedAtOnce) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to connect as another user (setuid)";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, peer_path_.data(), peer_path_.size());
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) ::_exit(3);
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10000) != 1) ::_exit(4);  // never closed
    char c;
    ::_exit(::read(fd, &c, 1) == 0 ? 0 : 5);  // EOF: the daemon closed it
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "user 65534 got a connection no tenant lists";
  EXPECT_EQ(server_->peer_server()->stats().refused, 1u);
}

TEST_F(PeerCredTest, AReloadThatRemovesTheUidEndsItsStreamsAndCalls) {
  auto stub = RawStub(peer_path_);
  grpc::ClientContext ctx;
  auto stream = stub->Select(&ctx);
  v1::SelectRequest req;
  req.set_request_id(1);
  v1::SelectResponse resp;
  ASSERT_TRUE(stream->Write(req) && stream->Read(&resp));

  WriteTenants(LocalTenant(false));
  ASSERT_OK(server_->runtime()->ReloadTenants());
  EXPECT_FALSE(stream->Read(&resp));
  grpc::Status st = stream->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();

  // The open connection's next call is refused by the mapping itself.
  grpc::ClientContext c2;
  v1::RegisterProfileRequest reg;
  *reg.mutable_profile() = Profile();
  v1::RegisterProfileResponse r;
  st = stub->RegisterProfile(&c2, reg, &r);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("uids"));
}

TEST_F(PeerCredTest, BadUidListsAreRefusedWithTheFieldNamed) {
  for (const std::string& bad : {std::string("uids = [-1]"), std::string("uids = [\"1000\"]"),
                                 std::string("uids = [4294967295]")}) {
    std::ofstream(tenants_file_, std::ios::trunc) << "[[tenants]]\nname = \"x\"\nrole = \"data\"\n"
                                                  << bad << "\n";
    absl::Status st = server_->runtime()->ReloadTenants();
    EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
    EXPECT_THAT(st.message(), HasSubstr("uids")) << bad;
  }
  std::ofstream(tenants_file_, std::ios::trunc)
      << "[[tenants]]\nname = \"x\"\nrole = \"data\"\nuids = [5]\n"
      << "[[tenants]]\nname = \"y\"\nrole = \"data\"\nuids = [5]\n";
  absl::Status st = server_->runtime()->ReloadTenants();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(st.message(), HasSubstr("uid 5 is listed under two tenants"));
  // The table in force stays: this process is still "local".
  EXPECT_OK(Peer()->Health());
}

}  // namespace
}  // namespace kvtier::security
