// Finding 6: the fd socket answers every connection on its own, so a peer
// that sends its request a byte at a time (slowloris, no token needed) or
// holds many idle connections delays no other tenant, and each connection
// has one deadline for its whole request (daemon/auth/fd_server.h).
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "client/shm/fd_fetch.h"
#include "daemon/auth/fd_server.h"
#include "tests/security/security_fixture.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::security {
namespace {

using Clock = std::chrono::steady_clock;

int Connect(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// True when the daemon closed fd within `within` (recv sees end of stream).
bool ClosedWithin(int fd, std::chrono::milliseconds within) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(within.count())) <= 0) return false;
  char c;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

class FdSocketTest : public SecurityTest {
 protected:
  void SetUp() override {
    StartDaemon();
    b_ = As("b");
    pb_ = Register(b_.get());
    auto slots = b_->ReserveSlots(pb_, 1);
    ASSERT_OK(slots);
    path_ = slots->fd_socket_path();
  }

  // Tenant b's staging descriptor, timed.
  std::chrono::milliseconds TimedFetch() {
    const auto t0 = Clock::now();
    client::FetchedFd fd =
        client::FetchSharedFd(path_, client::SharedFileKind::kStaging, tokens_["b"], 10000);
    EXPECT_OK(fd) << fd.ToString();
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  }

  std::unique_ptr<Client> b_;
  uint64_t pb_ = 0;
  std::string path_;
};

// The attack as found: a peer sends its request line a byte at a time
// (here every 100 ms, never a newline). Another tenant's fetch is answered
// at once meanwhile, and the slow peer is closed at the request deadline,
// not minutes later.
TEST_F(FdSocketTest, ASlowPeerDelaysNoOneAndIsClosedAtTheDeadline) {
  const int slow = Connect(path_);
  ASSERT_GE(slow, 0);
  const auto opened = Clock::now();
  std::atomic<bool> stop{false};
  std::atomic<bool> closed{false};
  std::thread attacker([&] {
    const char* line = "staging not-a-token-just-slow";
    for (size_t i = 0; !stop && line[i] != '\0'; i = (i + 1) % std::strlen(line)) {
      if (::send(slow, &line[i], 1, MSG_NOSIGNAL) != 1) {
        closed = true;
        return;
      }
      if (ClosedWithin(slow, std::chrono::milliseconds(100))) {
        closed = true;
        return;
      }
    }
  });
  for (int i = 0; i < 5; ++i) {
    EXPECT_LT(TimedFetch().count(), 500) << "fetch " << i << " waited for the slow peer";
  }
  attacker.join();  // ends when the daemon closes the slow connection
  stop = true;
  const auto held = Clock::now() - opened;
  EXPECT_TRUE(closed.load());
  EXPECT_LT(held, std::chrono::milliseconds(daemon::kRequestTimeoutMs + 1500))
      << "the slow peer was held past the whole-request deadline";
  ::close(slow);
}

// Many connections that never send: beyond the cap the oldest are closed,
// and a tenant's fetch is still answered at once.
TEST_F(FdSocketTest, IdleConnectionsAreCappedAndStarveNoOne) {
  std::vector<int> idle;
  for (size_t i = 0; i < daemon::kMaxPendingConnections + 100; ++i) {
    const int fd = Connect(path_);
    if (fd >= 0) idle.push_back(fd);
  }
  ASSERT_GT(idle.size(), daemon::kMaxPendingConnections);
  EXPECT_LT(TimedFetch().count(), 500);
  // Every idle connection is gone by its deadline (the oldest over the cap
  // sooner); none is held open.
  int closed = 0;
  for (int fd : idle) {
    closed += ClosedWithin(fd, std::chrono::milliseconds(daemon::kRequestTimeoutMs + 1500));
    ::close(fd);
  }
  EXPECT_EQ(closed, static_cast<int>(idle.size()));
  EXPECT_LT(TimedFetch().count(), 500);
}

}  // namespace
}  // namespace kvtier::security
