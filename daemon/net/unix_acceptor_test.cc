// UnixAcceptor and ConnectionGate on real Unix sockets: silent connections
// go, caps hold per uid and in total, closed connections free their place,
// and running out of descriptors never stops the accept loop.
#include "daemon/net/unix_acceptor.h"

#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "tests/testutil/descriptor_flood.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"
#include "tests/testutil/unix_connect.h"

namespace kvtier::daemon {
namespace {

using std::chrono::milliseconds;

// Connects and sends one byte, as a gRPC client sends its preface.
int ConnectAndSend(const std::string& path) {
  const int fd = testing::ConnectUnix(path);
  if (fd >= 0 && ::send(fd, "P", 1, MSG_NOSIGNAL) != 1) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// True when the daemon side closed fd within `timeout` (EOF or reset).
bool ClosedByPeer(int fd, milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return false;
  char c;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

class UnixAcceptorTest : public ::testing::Test {
 protected:
  void SetUp() override { path_ = tmp_.File("s.sock"); }
  void TearDown() override {
    if (acceptor_ != nullptr) acceptor_->Stop();
    absl::MutexLock lock(&mu_);
    for (int fd : handed_) ::close(fd);
  }

  void Start(ConnectionLimits limits, milliseconds setup, size_t max_pending) {
    gate_ = std::make_unique<ConnectionGate>(limits);
    auto fd = ListenUnix("test", path_, 0600);
    ASSERT_OK(fd);
    UnixAcceptorOptions o;
    o.name = "test socket";
    o.listen_fd = std::move(*fd);
    o.gate = gate_.get();
    o.setup_timeout = setup;
    o.max_pending = max_pending;
    o.hand_off = [this](int fd, uint32_t /*uid*/) {
      absl::MutexLock lock(&mu_);
      handed_.push_back(fd);
    };
    auto acceptor = UnixAcceptor::Start(std::move(o));
    ASSERT_OK(acceptor);
    acceptor_ = std::move(*acceptor);
  }

  // Waits until `n` connections were handed off; false after `timeout`.
  bool WaitHanded(size_t n, milliseconds timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return handed_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::FromChrono(timeout));
  }
  size_t Handed() {
    absl::MutexLock lock(&mu_);
    return handed_.size();
  }
  // Closes the first handed-off connection (as gRPC does when its client
  // leaves).
  void CloseOneHanded() {
    absl::MutexLock lock(&mu_);
    ::close(handed_.front());
    handed_.erase(handed_.begin());
  }

  ::kvtier::testing::ScopedTempDir tmp_{"acceptor"};
  std::string path_;
  std::unique_ptr<ConnectionGate> gate_;
  std::unique_ptr<UnixAcceptor> acceptor_;
  absl::Mutex mu_;
  std::vector<int> handed_ ABSL_GUARDED_BY(mu_);
};

TEST_F(UnixAcceptorTest, SilentConnectionsGoAndDoNotKeepOthersOut) {
  Start({.max_total = 64, .max_per_uid = 64}, milliseconds(300), /*max_pending=*/8);
  std::vector<int> silent;
  silent.reserve(200);
  for (int i = 0; i < 200; ++i) {
    const int fd = testing::ConnectUnix(path_);
    ASSERT_GE(fd, 0) << i;
    silent.push_back(fd);
  }
  const int client = ConnectAndSend(path_);
  ASSERT_GE(client, 0);
  EXPECT_TRUE(WaitHanded(1, milliseconds(1000))) << "a client that speaks was not served";
  // Every silent one is closed: evicted (the list holds 8) or timed out.
  for (int fd : silent) {
    EXPECT_TRUE(ClosedByPeer(fd, milliseconds(3000)));
    ::close(fd);
  }
  const UnixAcceptorStats s = acceptor_->stats();
  EXPECT_EQ(s.handed_off, 1u);
  EXPECT_GE(s.evicted, 150u);
  EXPECT_EQ(s.evicted + s.setup_timeouts, 200u);
  EXPECT_EQ(gate_->stats().open, 1u);
  ::close(client);
}

TEST_F(UnixAcceptorTest, CapsHoldAndAClosedConnectionFreesItsPlace) {
  Start({.max_total = 3, .max_per_uid = 3}, milliseconds(2000), 16);
  const std::vector<int> clients = {ConnectAndSend(path_), ConnectAndSend(path_),
                                    ConnectAndSend(path_)};
  ASSERT_TRUE(WaitHanded(3, milliseconds(2000)));
  // Over the cap: closed at once, the open ones untouched.
  const int refused = ConnectAndSend(path_);
  ASSERT_GE(refused, 0);
  EXPECT_TRUE(ClosedByPeer(refused, milliseconds(2000)));
  ::close(refused);
  EXPECT_EQ(acceptor_->stats().refused_cap, 1u);
  EXPECT_EQ(gate_->OpenOf(::getuid()), 3u);
  // Its owner closes one: a client that retries (the gate looks again at
  // most every 20 ms when full) takes its place.
  CloseOneHanded();
  int next = -1;
  for (int attempt = 0; attempt < 20 && next < 0; ++attempt) {
    next = ConnectAndSend(path_);
    if (ClosedByPeer(next, milliseconds(200))) {
      ::close(next);
      next = -1;
      ::poll(nullptr, 0, 25);  // the client's reconnect backoff
    }
  }
  ASSERT_GE(next, 0) << "the closed connection's place was never given again";
  EXPECT_TRUE(WaitHanded(3, milliseconds(2000)));
  EXPECT_EQ(gate_->stats().open, 3u);
  EXPECT_EQ(gate_->OpenOf(::getuid()), 3u);
  for (int fd : clients) ::close(fd);
  ::close(next);
}

TEST(ConnectionGateTest, ADescriptorNumberReusedByAnotherFileIsAClosedConnection) {
  ConnectionGate gate({.max_total = 1, .max_per_uid = 1});
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  EXPECT_TRUE(gate.Admit(pair[0], 7));
  int other[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, other), 0);
  EXPECT_FALSE(gate.Admit(other[0], 8)) << "the total cap is 1";
  // pair[0]'s number now names another socket: the first one is gone.
  ASSERT_EQ(::dup2(other[1], pair[0]), pair[0]);
  gate.Sweep();
  EXPECT_EQ(gate.stats().open, 0u);
  EXPECT_TRUE(gate.Admit(other[0], 8));
  EXPECT_EQ(gate.OpenOf(7), 0u);
  EXPECT_EQ(gate.OpenOf(8), 1u);
  for (int fd : {pair[0], pair[1], other[0], other[1]}) ::close(fd);
}

// The process runs out of descriptors while connections keep coming: the
// loop backs off and sheds, and serves again once descriptors are free.
TEST_F(UnixAcceptorTest, RunningOutOfDescriptorsNeverStopsTheLoop) {
  Start({.max_total = 100000, .max_per_uid = 100000}, milliseconds(5000), 4096);
  // Room for about 30 more descriptors in this process; the clients are
  // another process, with descriptors of its own.
  testing::LowDescriptorLimit low(30);
  ASSERT_TRUE(low.lowered());
  testing::HeldConnections flood({[this] { return ConnectAndSend(path_); }}, 200);
  // Wait until the loop has met EMFILE.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (acceptor_->stats().fd_exhausted == 0 && std::chrono::steady_clock::now() < until) {
    pollfd none{-1, 0, 0};
    ::poll(&none, 0, 10);
  }
  const UnixAcceptorStats exhausted = acceptor_->stats();
  EXPECT_GT(exhausted.fd_exhausted, 0u);
  EXPECT_LT(exhausted.handed_off, 200u);
  // Descriptors come back: the owner closes what it was handed.
  {
    absl::MutexLock lock(&mu_);
    for (int fd : handed_) ::close(fd);
    handed_.clear();
  }
  low.Restore();
  const int client = ConnectAndSend(path_);
  ASSERT_GE(client, 0);
  EXPECT_TRUE(WaitHanded(1, milliseconds(5000))) << "the loop stopped accepting";
  flood.Release();
  ::close(client);
}

}  // namespace
}  // namespace kvtier::daemon
