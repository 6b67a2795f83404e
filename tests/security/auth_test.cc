// Authentication and roles: every RPC of both services refuses a caller
// without valid credentials, the Admin service refuses the data role, the
// descriptor socket refuses bad tokens, and a reload (SIGHUP's path) takes
// a rotated token away at once.
#include <fcntl.h>
#include <sys/stat.h>

#include "client/shm/fd_fetch.h"
#include "gmock/gmock.h"
#include "tests/security/raw_call.h"
#include "tests/security/security_fixture.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::security {
namespace {

using ::testing::HasSubstr;
using testing::StatusIs;

class AuthTest : public SecurityTest {
 protected:
  void SetUp() override {
    StartDaemon();
    channel_ =
        grpc::CreateChannel("unix:" + server_->socket_path(), grpc::InsecureChannelCredentials());
  }
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(AuthTest, EveryRpcRefusesMissingOrBadCredentials) {
  std::vector<std::string> methods = MethodsOf("kvtier.v1.KvTier");
  const std::vector<std::string> admin = MethodsOf("kvtier.v1.Admin");
  ASSERT_GE(methods.size(), 13u);
  ASSERT_GE(admin.size(), 5u);
  methods.insert(methods.end(), admin.begin(), admin.end());
  methods.push_back("/grpc.health.v1.Health/Check");
  const std::string wrong = auth::NewToken();
  for (const std::string& m : methods) {
    const std::vector<std::string> bad = {std::string(),
                                          "Bearer " + wrong,
                                          "Bearer",
                                          "Basic " + tokens_["a"],
                                          "Bearer " + tokens_["a"] + "x",
                                          "Bearer " + std::string(300, 'z')};
    for (const std::string& auth : bad) {
      grpc::Status st = RawCall(channel_, m, auth);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << m << " with '" << auth.substr(0, 20) << "': " << st.error_message();
    }
  }
}

TEST_F(AuthTest, AdminServiceNeedsTheAdminRole) {
  for (const std::string& m : MethodsOf("kvtier.v1.Admin")) {
    grpc::Status st = RawCall(channel_, m, "Bearer " + tokens_["a"]);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << m << ": " << st.error_message();
  }
  auto ops = As("ops");
  auto stats = ops->Stats();
  ASSERT_OK(stats);
  std::vector<std::string> names;
  for (const auto& t : stats->tenants()) names.push_back(t.name());
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("a", "b", "q", "ops"));
  // A data tenant still uses the data plane, and health.
  auto a = As("a");
  EXPECT_OK(a->Health());
  EXPECT_NE(Register(a.get()), 0u);
}

TEST_F(AuthTest, DescriptorSocketChecksTheToken) {
  auto a = As("a");
  auto arena = a->OpenArena();
  ASSERT_OK(arena);
  EXPECT_TRUE(arena->shm_path().empty()) << "no path to another tenant's file is handed out";
  ASSERT_FALSE(arena->fd_socket_path().empty());
  for (const std::string& bad : {std::string(), auth::NewToken(), std::string("-")}) {
    client::FetchedFd fetched =
        client::FetchSharedFd(arena->fd_socket_path(), client::SharedFileKind::kArena, bad, 3000);
    EXPECT_FALSE(fetched.ok());
    EXPECT_EQ(fetched.code(), 16) << fetched.ToString();
  }
  client::FetchedFd good = client::FetchSharedFd(
      arena->fd_socket_path(), client::SharedFileKind::kArena, tokens_["a"], 3000);
  ASSERT_OK(good) << good.ToString();
  EXPECT_EQ(good.size_bytes(), arena->size_bytes());
  // The arena descriptor is read-only: the client can see, not write.
  EXPECT_EQ(::fcntl(good.fd(), F_GETFL) & O_ACCMODE, O_RDONLY);
}

TEST_F(AuthTest, ReloadTakesARotatedTokenAwayAtOnce) {
  auto a = As("a");
  ASSERT_OK(a->Health());
  const std::string old_token = tokens_["a"];
  tokens_["a"] = auth::NewToken();
  WriteTenants();
  ASSERT_OK(server_->runtime()->ReloadTenants());
  auto health = a->Health();
  EXPECT_THAT(health, StatusIs(absl::StatusCode::kUnauthenticated)) << health.status();
  EXPECT_OK(As("a")->Health());
  // A bad file is refused and the table in force stays.
  std::ofstream(tenants_file_, std::ios::trunc) << "[[tenants]]\nname = \"bad name!\"\n";
  auto reload = server_->runtime()->ReloadTenants();
  EXPECT_THAT(reload, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(reload.message(), HasSubstr("tenants[0]"));
  EXPECT_OK(As("a")->Health());
}

}  // namespace
}  // namespace kvtier::security
