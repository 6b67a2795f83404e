// TCP is served only over TLS; with a client CA configured, mTLS: a
// verified client certificate's common name maps to a tenant. Certificates
// are made in the test (tests/testutil/tls_certs.h).
#include "gmock/gmock.h"
#include "tests/security/security_fixture.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"
#include "tests/testutil/tls_certs.h"

namespace kvtier::security {
namespace {

using testing::StatusIs;

class TlsTest : public SecurityTest {
 protected:
  void SetUp() override {
    ca_ = testing::MakeCa("kvtier test CA");
    server_cert_ = testing::IssueCert(ca_, "localhost");
    const std::string& d = certs_.path();
    ASSERT_TRUE(testing::WriteFile(d + "/ca.crt", ca_.cert));
    ASSERT_TRUE(testing::WriteFile(d + "/server.crt", server_cert_.cert));
    ASSERT_TRUE(testing::WriteFile(d + "/server.key", server_cert_.key));
    cert_dir_ = d;
  }
  void StartTls(bool mtls) {
    std::vector<std::string> extra = {"server.tcp_address=127.0.0.1:0",
                                      "server.tls_cert_file=" + cert_dir_ + "/server.crt",
                                      "server.tls_key_file=" + cert_dir_ + "/server.key"};
    if (mtls) extra.push_back("server.tls_client_ca_file=" + cert_dir_ + "/ca.crt");
    StartDaemon(extra);
    ASSERT_GT(server_->tcp_port(), 0);
  }
  // Health over TCP with the given client certificate (empty: none).
  absl::Status HealthOverTcp(const testing::PemPair& client, const std::string& token = "",
                             const std::string& roots = "") {
    ClientOptions options;
    options.call_timeout = std::chrono::milliseconds(3000);
    options.tls_root_certs_pem = roots.empty() ? ca_.cert : roots;
    options.tls_cert_chain_pem = client.cert;
    options.tls_private_key_pem = client.key;
    options.tls_server_name = "localhost";
    options.token = token;
    auto c = Client::Connect("127.0.0.1:" + std::to_string(server_->tcp_port()), options);
    if (!c.ok()) return c.status();
    return (*c)->Health().status();
  }
  std::unique_ptr<Client> TcpClient(const testing::PemPair& client) {
    ClientOptions options;
    options.tls_root_certs_pem = ca_.cert;
    options.tls_cert_chain_pem = client.cert;
    options.tls_private_key_pem = client.key;
    options.tls_server_name = "localhost";
    auto c = Client::Connect("127.0.0.1:" + std::to_string(server_->tcp_port()), options);
    EXPECT_OK(c);
    return std::move(*c);
  }
  testing::PemPair ca_, server_cert_;
  ::kvtier::testing::ScopedTempDir certs_{"tls"};
  std::string cert_dir_;
};

TEST_F(TlsTest, PlainTcpIsRefusedByTheConfig) {
  auto config = daemon::LoadConfig("", {"server.tcp_address=127.0.0.1:0"});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config, StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(TlsTest, TlsWithATokenServesAndRefusesWithout) {
  StartTls(/*mtls=*/false);
  EXPECT_OK(HealthOverTcp({}, tokens_["a"]));
  EXPECT_THAT(HealthOverTcp({}), StatusIs(absl::StatusCode::kUnauthenticated));
  // A client that does not trust the daemon's CA does not connect.
  testing::PemPair rogue = testing::MakeCa("rogue CA");
  EXPECT_FALSE(HealthOverTcp({}, tokens_["a"], rogue.cert).ok());
  // Plaintext against the TLS port fails.
  ClientOptions plain;
  plain.call_timeout = std::chrono::milliseconds(2000);
  plain.token = tokens_["a"];
  auto c = Client::Connect("127.0.0.1:" + std::to_string(server_->tcp_port()), plain);
  ASSERT_OK(c);
  EXPECT_FALSE((*c)->Health().ok());
}

TEST_F(TlsTest, ClientCertificatesMapToTenants) {
  StartTls(/*mtls=*/true);
  testing::PemPair cert_a = testing::IssueCert(ca_, "a");
  EXPECT_OK(HealthOverTcp(cert_a));
  // The certificate's tenant is "a": it sees what "a" stored over the socket.
  auto a = As("a");
  const uint64_t p = Register(a.get());
  auto ids = Ids("tls", 2);
  Put(a.get(), p, ids, 3);
  auto tcp = TcpClient(cert_a);
  v1::LookupRequest lookup;
  lookup.set_profile_id(p);
  for (const auto& id : ids) lookup.add_block_ids(id);
  auto seen = tcp->Lookup(lookup);
  ASSERT_OK(seen);
  for (const auto& e : seen->entries()) EXPECT_TRUE(e.present());
  // CN "b" is tenant b: a's profile is not b's, and under b's own profile
  // of the same definition a's blocks are not there.
  auto tcp_b = TcpClient(testing::IssueCert(ca_, "b"));
  EXPECT_THAT(tcp_b->Lookup(lookup), StatusIs(absl::StatusCode::kNotFound));
  v1::LookupRequest theirs = lookup;
  theirs.set_profile_id(Register(As("b").get()));
  auto as_b = tcp_b->Lookup(theirs);
  ASSERT_OK(as_b);
  for (const auto& e : as_b->entries()) EXPECT_FALSE(e.present());

  // Refused: no certificate, one from another CA, an expired one, one not
  // yet valid, and a valid one whose name no tenant lists.
  EXPECT_FALSE(HealthOverTcp({}).ok());
  testing::PemPair rogue = testing::MakeCa("rogue CA");
  EXPECT_FALSE(HealthOverTcp(testing::IssueCert(rogue, "a")).ok());
  EXPECT_FALSE(HealthOverTcp(testing::IssueCert(ca_, "a", -7200, -3600)).ok());
  EXPECT_FALSE(HealthOverTcp(testing::IssueCert(ca_, "a", 3600, 7200)).ok());
  auto unknown = HealthOverTcp(testing::IssueCert(ca_, "nobody"));
  EXPECT_THAT(unknown, StatusIs(absl::StatusCode::kUnauthenticated)) << unknown;
}

}  // namespace
}  // namespace kvtier::security
