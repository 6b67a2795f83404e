// Issue 46, finding 1: one local process must not be able to stop the
// daemon accepting connections. kvtierd runs as a real process under a low
// descriptor limit (prlimit); an attacker process floods its sockets; then
// a new process (kvtierctl) must connect and be served within its 1 s
// deadline, and the daemon's descriptors stay within the stated caps.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/shm/fd_fetch.h"
#include "gmock/gmock.h"
#include "tests/integration/subprocess.h"
#include "tests/testutil/descriptor_flood.h"
#include "tests/testutil/http_get.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/tcp_connect.h"
#include "tests/testutil/temp_dir.h"
#include "tests/testutil/tls_certs.h"
#include "tests/testutil/unix_connect.h"

namespace kvtier::security {
namespace {

using ::testing::HasSubstr;

// The HTTP/2 client preface: what a gRPC client sends first.
constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
constexpr int kNofile = 1400;
constexpr int kPending = 64;  // server.max_pending_connections
constexpr int kPerUid = 64;   // server.max_connections_per_uid
// kvtierd keeps 1024 + 2 x kPending descriptors for itself: the rest may
// be connections (server.max_connections is lowered to this at start).
constexpr int kConnectionRoom = kNofile - 1024 - 2 * kPending;

int CountFds(pid_t pid) {
  int n = 0;
  std::error_code ec;
  for (const auto& e :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    (void)e;
    ++n;
  }
  return n;
}

// Opens one connection; -1 on failure.
using testing::Connector;
using testing::HeldConnections;

std::vector<Connector> UnixConnectors(const std::vector<std::string>& paths) {
  std::vector<Connector> out;
  out.reserve(paths.size());
  for (const std::string& path : paths)
    out.push_back([path] { return testing::ConnectUnix(path); });
  return out;
}

class ConnectionFloodTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = tmp_.path();
    std::filesystem::create_directories(root_ + "/run");
    // Another user may reach the sockets (the test of one uid's flood).
    ::chmod(root_.c_str(), 0755);
    ::chmod((root_ + "/run").c_str(), 0755);
    socket_ = root_ + "/run/kvtierd.sock";
    fd_socket_ = root_ + "/run/kvtierd.fd.sock";
  }
  void TearDown() override {
    if (daemon_) {
      daemon_->Signal(SIGTERM);
      daemon_->Wait(std::chrono::seconds(30));
    }
  }

  // `extra`: more --set arguments.
  void Start(const std::vector<std::string>& extra = {}) {
    notify_ = std::make_unique<testing::NotifySocket>(root_ + "/notify.sock");
    const std::string nofile =
        "--nofile=" + std::to_string(kNofile) + ":" + std::to_string(kNofile);
    std::vector<std::string> argv{"/usr/bin/prlimit",
                                  nofile,
                                  KVTIERD_PATH,
                                  "--data-dir",
                                  root_ + "/data",
                                  "--socket",
                                  socket_,
                                  "--set",
                                  "server.socket_mode=0666",
                                  "--set",
                                  "auth.fd_socket_path=" + fd_socket_,
                                  "--set",
                                  "server.max_pending_connections=" + std::to_string(kPending),
                                  "--set",
                                  "server.max_connections_per_uid=" + std::to_string(kPerUid),
                                  "--set",
                                  "tiers.host.capacity_bytes=16MiB",
                                  "--set",
                                  "tiers.device.capacity_bytes=4MiB",
                                  "--set",
                                  "tiers.host.staging_bytes=1MiB",
                                  "--set",
                                  "tiers.nvme.file_count=2",
                                  "--set",
                                  "tiers.nvme.file_size_bytes=4MiB",
                                  "--set",
                                  "metrics.listen_address=:0"};
    for (const std::string& kv : extra) {
      argv.push_back("--set");
      argv.push_back(kv);
    }
    daemon_ = std::make_unique<testing::ChildProcess>(
        argv, std::vector<std::string>{"NOTIFY_SOCKET=" + notify_->path()}, root_ + "/log");
    ASSERT_TRUE(notify_->WaitFor("READY=1", std::chrono::seconds(20))) << Log();
  }

  // kvtierctl status as a new process, every call with a 1 s deadline.
  testing::CommandResult NewClient() {
    return testing::RunCommand(
        {KVTIERCTL_PATH, "--socket", socket_, "--timeout-ms", "1000", "status", "--json"});
  }

  std::string Log() { return testing::ReadFile(root_ + "/log"); }

  // One sample of the daemon's /metrics page (the port from its log); -1
  // when absent.
  double Metric(const std::string& series) {
    const std::string log = Log();
    const std::string key = "metrics at http://127.0.0.1:";
    const size_t at = log.find(key);
    if (at == std::string::npos) return -1;
    const int port = std::atoi(log.c_str() + at + key.size());
    const testing::HttpResponse page = testing::HttpGet(port, "/metrics");
    const size_t line = page.body.find("\n" + series + " ");
    if (line == std::string::npos) return -1;
    return std::atof(page.body.c_str() + line + series.size() + 2);
  }

  ::kvtier::testing::ScopedTempDir tmp_{"flood"};
  std::string root_, socket_, fd_socket_;
  std::unique_ptr<testing::NotifySocket> notify_;
  std::unique_ptr<testing::ChildProcess> daemon_;
};

TEST_F(ConnectionFloodTest, ASilentFloodKeepsNoOneOut) {
  Start();
  EXPECT_THAT(Log(), HasSubstr("server.max_connections = 4096 lowered to " +
                               std::to_string(kConnectionRoom)));
  const int before = CountFds(daemon_->pid());
  // Four times the daemon's descriptor limit, on the gRPC socket and the
  // descriptor socket, sending nothing.
  HeldConnections flood(UnixConnectors({socket_, fd_socket_}), 3 * kNofile, /*speak=*/"",
                        /*uid=*/-1);
  ASSERT_GT(flood.opened(), 2 * kNofile) << "the flood did not reach the daemon's limit";

  const auto t0 = std::chrono::steady_clock::now();
  testing::CommandResult status = NewClient();
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(status.exit_code, 0) << status.err << Log();
  EXPECT_THAT(status.out, HasSubstr("\"version\""));
  std::cout << "new client served in "
            << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
            << " ms during the flood\n";
  // The descriptor socket serves too (authentication off: token "-").
  client::FetchedFd staging =
      client::FetchSharedFd(fd_socket_, client::SharedFileKind::kStaging, "-", 1000);
  EXPECT_OK(staging) << staging.ToString();
  // What the flood holds in the daemon: its pending lists, no more.
  EXPECT_LE(CountFds(daemon_->pid()) - before, 2 * kPending + 128 + 8);

  // The metrics count what the flood cost: evictions (the pending list
  // was full) and the connections handed to gRPC.
  EXPECT_GE(Metric("kvtier_connections_closed_total{reason=\"evicted\"}"), 2 * kNofile);
  EXPECT_GE(Metric("kvtier_connections_served_total"), 1);
  flood.Release();
  EXPECT_EQ(NewClient().exit_code, 0) << Log();
}

TEST_F(ConnectionFloodTest, OneUsersConnectionsFillOnlyItsOwnShare) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to flood as another user (setuid)";
  Start();
  const int before = CountFds(daemon_->pid());
  // Connections that speak (each is handed to gRPC) from user 65534: at
  // most kPerUid of them are kept, the rest closed at once.
  HeldConnections flood(UnixConnectors({socket_}), 2 * kNofile, kPreface, /*uid=*/65534);
  ASSERT_GT(flood.opened(), kNofile);
  testing::CommandResult status = NewClient();
  EXPECT_EQ(status.exit_code, 0) << status.err << Log();
  EXPECT_LE(CountFds(daemon_->pid()) - before, kPerUid + kPending + 8);
  EXPECT_THAT(Log(), HasSubstr("connection of uid 65534 refused"));
  EXPECT_GE(Metric("kvtier_connections_closed_total{reason=\"cap\"}"), kNofile - kPerUid);
  EXPECT_LE(Metric("kvtier_connections_open"), kPerUid + 2);
  flood.Release();
  EXPECT_EQ(NewClient().exit_code, 0) << Log();
}

// The same over TCP: a flood from one address (127.0.0.2) to three times
// the daemon's descriptor limit, half of it sending the first byte of a
// TLS handshake and stalling, half silent. A new client from another
// address (127.0.0.1) is served over TLS within 1 s, the daemon's
// descriptors stay within that address's share, and after the flood a
// client from the flooding address is served again.
TEST_F(ConnectionFloodTest, ATcpFloodFromOneAddressKeepsNoOneOut) {
  constexpr int kTcp = 48;         // server.max_tcp_connections
  constexpr int kPerAddress = 16;  // server.max_tcp_connections_per_address
  const testing::PemPair ca = testing::MakeCa("kvtier flood CA");
  const testing::PemPair cert = testing::IssueCert(ca, "localhost");
  ASSERT_TRUE(testing::WriteFile(root_ + "/server.crt", cert.cert));
  ASSERT_TRUE(testing::WriteFile(root_ + "/server.key", cert.key));
  Start({"server.tcp_address=127.0.0.1:0", "server.tls_cert_file=" + root_ + "/server.crt",
         "server.tls_key_file=" + root_ + "/server.key",
         "server.max_tcp_connections=" + std::to_string(kTcp),
         "server.max_tcp_connections_per_address=" + std::to_string(kPerAddress)});
  const std::string log = Log();
  const size_t at = log.find("(port ");
  ASSERT_NE(at, std::string::npos) << log;
  const int port = std::atoi(log.c_str() + at + 6);
  ASSERT_GT(port, 0);
  auto tls_health = [&](const char* what) {
    ClientOptions options;
    options.call_timeout = std::chrono::milliseconds(1000);
    options.tls_root_certs_pem = ca.cert;
    options.tls_server_name = "localhost";
    const auto t0 = std::chrono::steady_clock::now();
    auto c = Client::Connect("127.0.0.1:" + std::to_string(port), options);
    absl::Status st = c.ok() ? (*c)->Health().status() : c.status();
    std::cout << what << ": served in "
              << std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::steady_clock::now() - t0)
                     .count()
              << " ms\n";
    return st;
  };
  ASSERT_OK(tls_health("before the flood"));
  const int before = CountFds(daemon_->pid());
  const Connector from_other = [port] { return testing::ConnectTcpFrom(port, "127.0.0.2"); };
  HeldConnections stalled({from_other}, 3 * kNofile / 2, /*speak=*/"\x16", /*uid=*/-1);
  HeldConnections silent({from_other}, 3 * kNofile / 2, /*speak=*/"", /*uid=*/-1);
  ASSERT_GT(stalled.opened() + silent.opened(), 2 * kNofile);
  EXPECT_OK(tls_health("during the flood"));
  // The flood holds at most its address's share: one descriptor pending,
  // three relayed (the client's, the relay's and gRPC's).
  EXPECT_LE(CountFds(daemon_->pid()) - before, 3 * kPerAddress + 8);
  EXPECT_GE(Metric("kvtier_tcp_connections_closed_total{reason=\"cap\"}"), 2 * kNofile);
  EXPECT_LE(Metric("kvtier_tcp_connections_open"), kPerAddress + 2);
  stalled.Release();
  silent.Release();
  // The flooding address gets its share back once it closed its connections.
  const Connector again = [port] { return testing::ConnectTcpFrom(port, "127.0.0.2"); };
  const int fd = again();
  ASSERT_GE(fd, 0);
  ::close(fd);
  EXPECT_OK(tls_health("after the flood"));
  EXPECT_EQ(NewClient().exit_code, 0) << Log();
}

}  // namespace
}  // namespace kvtier::security
