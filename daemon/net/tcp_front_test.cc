// TcpFront on real sockets: bytes relayed unchanged both ways with closes
// passed on, caps per peer address and in total, silent connections go,
// and running out of descriptors never stops the accept loop. The upstream
// is a Unix socket served by the test (an echo, or a holder of
// connections), standing where gRPC's TLS listener stands in the daemon.
#include "daemon/net/tcp_front.h"

#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "daemon/net/unix_acceptor.h"
#include "gtest/gtest.h"
#include "tests/testutil/descriptor_flood.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/tcp_connect.h"
#include "tests/testutil/temp_dir.h"

namespace kvtier::daemon {
namespace {

using std::chrono::milliseconds;

using testing::ConnectTcpFrom;

// True when the other side closed fd within `timeout` (EOF or reset).
bool ClosedByPeer(int fd, milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return false;
  char c;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

// True when a byte sent on fd comes back within `timeout` (the echo).
bool Echoes(int fd, milliseconds timeout) {
  if (::send(fd, "e", 1, MSG_NOSIGNAL) != 1) return false;
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return false;
  char c = 0;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) == 1 && c == 'e';
}

class TcpFrontTest : public ::testing::Test {
 protected:
  void SetUp() override {
    upstream_path_ = tmp_.File("up.sock");
    auto up = ListenUnix("test", upstream_path_, 0600);
    ASSERT_OK(up);
    upstream_ = std::move(*up);
    // The upstream echoes every connection until it closes, each on a
    // thread of its own; a wake-up pipe ends the accept loop.
    ASSERT_EQ(::pipe(stop_), 0);
    server_ = std::thread([this] { Serve(); });
  }
  void TearDown() override {
    if (front_ != nullptr) front_->Stop();
    (void)!::write(stop_[1], "x", 1);
    server_.join();
    for (std::thread& t : echoes_) t.join();
    ::close(stop_[0]);
    ::close(stop_[1]);
  }
  void Serve() {
    for (;;) {
      pollfd p[2] = {{upstream_.get(), POLLIN, 0}, {stop_[0], POLLIN, 0}};
      if (::poll(p, 2, -1) < 0) continue;
      if (p[1].revents != 0) return;
      const int fd = ::accept4(upstream_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      echoes_.emplace_back([fd] {
        std::vector<char> buf(64 << 10);
        for (;;) {
          const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
          if (n <= 0) break;
          for (ssize_t at = 0; at < n;) {
            const ssize_t w = ::send(fd, buf.data() + at, n - at, MSG_NOSIGNAL);
            if (w <= 0) break;
            at += w;
          }
        }
        ::close(fd);  // the client's close reaches it, its own goes back
      });
    }
  }
  void Start(uint64_t max_total, uint64_t per_address, milliseconds setup, size_t max_pending) {
    auto listen = ListenTcp("test", "127.0.0.1:0");
    ASSERT_OK(listen);
    port_ = BoundPort(listen->get());
    ASSERT_GT(port_, 0);
    TcpFrontOptions o;
    o.listen_fd = std::move(*listen);
    o.upstream_path = upstream_path_;
    o.max_total = max_total;
    o.max_per_address = per_address;
    o.setup_timeout = setup;
    o.max_pending = max_pending;
    auto front = TcpFront::Start(std::move(o));
    ASSERT_OK(front);
    front_ = std::move(*front);
  }
  // Waits (polling the front's counters) until `done` holds; false after 10 s.
  template <typename F>
  bool WaitFor(F done) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done(front_->stats())) {
      if (std::chrono::steady_clock::now() > until) return false;
      pollfd none{-1, 0, 0};
      ::poll(&none, 0, 5);
    }
    return true;
  }

  ::kvtier::testing::ScopedTempDir tmp_{"tcpfront"};
  std::string upstream_path_;
  OwnedFd upstream_;
  int stop_[2] = {-1, -1};
  std::thread server_;
  std::vector<std::thread> echoes_;  // accept loop's thread only, until joined
  std::unique_ptr<TcpFront> front_;
  int port_ = 0;
};

TEST(ListenTcpTest, RefusesAnAddressWithoutAPortNamingTheKey) {
  auto bad = ListenTcp("server.tcp_address", "localhost");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("server.tcp_address"), std::string::npos);
  EXPECT_FALSE(ListenTcp("server.tcp_address", "[::1").ok());
}

// 4 MiB of random bytes go up and come back unchanged, written and read
// by two threads at once (so both directions are full at times); the
// client's half-close reaches the upstream, whose close comes back.
TEST_F(TcpFrontTest, RelaysBytesUnchangedBothWaysAndPassesClosesOn) {
  Start(16, 16, milliseconds(5000), 16);
  const int fd = ConnectTcpFrom(port_);
  ASSERT_GE(fd, 0);
  std::vector<char> sent(4 << 20);
  std::mt19937 rng(7);
  for (char& c : sent) c = static_cast<char>(rng());
  std::thread writer([&] {
    for (size_t at = 0; at < sent.size();) {
      const ssize_t w =
          ::send(fd, sent.data() + at, std::min<size_t>(100000, sent.size() - at), MSG_NOSIGNAL);
      if (w <= 0) return;
      at += static_cast<size_t>(w);
    }
    ::shutdown(fd, SHUT_WR);
  });
  std::vector<char> got;
  got.reserve(sent.size());
  std::vector<char> buf(70000);
  for (;;) {
    const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
    if (n <= 0) break;  // EOF: the upstream closed after our half-close
    got.insert(got.end(), buf.data(), buf.data() + n);
  }
  writer.join();
  ::close(fd);
  ASSERT_EQ(got.size(), sent.size());
  EXPECT_TRUE(got == sent) << "bytes changed on the way";
  EXPECT_TRUE(WaitFor([](const TcpFrontStats& s) { return s.open == 0; }));
  EXPECT_EQ(front_->stats().relayed, 1u);
}

// One address holds at most its share, silent connections included;
// another address is served meanwhile; a closed connection frees its
// place; the total cap holds across addresses.
TEST_F(TcpFrontTest, CapsHoldPerAddressAndInTotal) {
  Start(/*max_total=*/6, /*per_address=*/4, milliseconds(5000), 16);
  std::vector<int> flood;
  for (int i = 0; i < 4; ++i) {
    flood.push_back(ConnectTcpFrom(port_, "127.0.0.2"));
    ASSERT_GE(flood.back(), 0);
    ASSERT_TRUE(Echoes(flood.back(), milliseconds(5000)));
  }
  std::vector<int> refused;
  refused.reserve(20);
  for (int i = 0; i < 20; ++i) refused.push_back(ConnectTcpFrom(port_, "127.0.0.2"));
  for (int fd : refused) {
    EXPECT_TRUE(ClosedByPeer(fd, milliseconds(5000))) << "over the address's cap yet kept";
    ::close(fd);
  }
  EXPECT_GE(front_->stats().refused_cap, 20u);
  // A silent connection of the flooding address counts too.
  ::close(flood.back());
  flood.pop_back();
  ASSERT_TRUE(WaitFor([](const TcpFrontStats& s) { return s.open == 3; }));
  const int silent = ConnectTcpFrom(port_, "127.0.0.2");
  ASSERT_TRUE(WaitFor([](const TcpFrontStats& s) { return s.open == 4; }));
  const int over = ConnectTcpFrom(port_, "127.0.0.2");
  EXPECT_TRUE(ClosedByPeer(over, milliseconds(5000)));
  ::close(over);
  // Another address is served while the first is at its cap.
  const int other = ConnectTcpFrom(port_, "127.0.0.1");
  EXPECT_TRUE(Echoes(other, milliseconds(5000)));
  const int other2 = ConnectTcpFrom(port_, "127.0.0.3");
  EXPECT_TRUE(Echoes(other2, milliseconds(5000)));
  // Six open: the total cap refuses a seventh from a fresh address.
  const int seventh = ConnectTcpFrom(port_, "127.0.0.4");
  EXPECT_TRUE(ClosedByPeer(seventh, milliseconds(5000))) << "over the total cap yet kept";
  ::close(seventh);
  for (int fd : flood) ::close(fd);
  ::close(silent);
  ::close(other);
  ::close(other2);
  EXPECT_TRUE(WaitFor([](const TcpFrontStats& s) { return s.open == 0; }));
}

TEST_F(TcpFrontTest, SilentConnectionsGoAfterTheSetupTimeout) {
  Start(16, 16, milliseconds(200), 16);
  const int silent = ConnectTcpFrom(port_);
  ASSERT_GE(silent, 0);
  EXPECT_TRUE(ClosedByPeer(silent, milliseconds(5000)));
  EXPECT_EQ(front_->stats().setup_timeouts, 1u);
  EXPECT_EQ(front_->stats().relayed, 0u);
  ::close(silent);
  const int speaks = ConnectTcpFrom(port_);
  EXPECT_TRUE(Echoes(speaks, milliseconds(5000)));
  ::close(speaks);
}

TEST_F(TcpFrontTest, RunningOutOfDescriptorsNeverStopsTheLoop) {
  Start(100000, 100000, milliseconds(5000), 4096);
  // Room for about 30 more descriptors in this process; the clients are
  // another process, with descriptors of its own.
  testing::LowDescriptorLimit low(30);
  ASSERT_TRUE(low.lowered());
  testing::HeldConnections flood({[this] { return ConnectTcpFrom(port_); }}, 200);
  EXPECT_TRUE(WaitFor([](const TcpFrontStats& s) { return s.fd_exhausted > 0; }));
  // The flood leaves; descriptors come back.
  flood.Release();
  low.Restore();
  ASSERT_TRUE(WaitFor([](const TcpFrontStats& s) { return s.open == 0; }));
  const int client = ConnectTcpFrom(port_);
  EXPECT_TRUE(Echoes(client, milliseconds(5000))) << "the loop stopped accepting";
  ::close(client);
}

}  // namespace
}  // namespace kvtier::daemon
