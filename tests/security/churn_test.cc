// Clients that die: 1000 client processes each open a context, Select
// (pinning blocks), take a handle lease and staging slots, and are
// SIGKILLed. Once their leases' TTLs pass, the tenant's contexts, leases,
// pins and slots are back to what they were before.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <map>
#include <thread>

#include "tests/security/security_fixture.h"
#include "tests/testutil/status_matchers.h"

extern char** environ;

namespace kvtier::security {
namespace {

struct Child {
  pid_t pid = -1;
  int out = -1;  // read end of its stdout
};

Child Spawn(const std::vector<std::string>& argv) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return {};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  Child c;
  if (::posix_spawn(&c.pid, args[0], &actions, nullptr, args.data(), environ) != 0) c.pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  c.out = fds[0];
  return c;
}

// Waits (up to timeout) for the child's "ready" line; false on EOF/timeout.
bool WaitReady(const Child& c, int timeout_ms) {
  std::string got;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (got.find('\n') == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{c.out, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    char buf[64];
    const ssize_t n = ::read(c.out, buf, sizeof(buf));
    if (n <= 0) return false;
    got.append(buf, static_cast<size_t>(n));
  }
  return got.rfind("ready", 0) == 0;
}

// Kills and reaps the child; returns its exit code when it had already
// exited on its own (a failed step of kvtier_churn_client), else -1.
int Kill(Child& c) {
  ::kill(c.pid, SIGKILL);
  int status = 0;
  ::waitpid(c.pid, &status, 0);
  ::close(c.out);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class ChurnTest : public SecurityTest {};

TEST_F(ChurnTest, KilledClientsLeaveNothingBehind) {
  // Killed clients hold their staging slots until the 500 ms TTL ends:
  // the staging area fits every client one TTL can spawn (2 slots each).
  StartDaemon({"leases.default_ttl_ms=500", "tiers.device.capacity_bytes=4MiB",
               "auth.tenant_staging_bytes=8MiB"});
  auto a = As("a");
  const uint64_t p = Register(a.get());
  Put(a.get(), p, Ids("churn", 8), 1);
  ASSERT_OK(a->OpenArena());  // the tenant's one arena exists from here on
  auto ops = As("ops");
  auto usage = [&] {
    auto stats = ops->Stats();
    EXPECT_OK(stats);
    for (const auto& t : stats->tenants()) {
      if (t.name() == "a") return t;
    }
    return v1::TenantStats();
  };
  const v1::TenantStats before = usage();

  constexpr int kCycles = 1000, kInFlight = 8;
  const std::vector<std::string> argv = {
      KVTIER_CHURN_CLIENT, server_->socket_path(), tokens_["a"], std::to_string(p), "churn", "8"};
  std::deque<Child> live;
  int ready = 0;
  std::map<int, int> exit_codes;
  uint64_t max_contexts = 0;
  for (int i = 0; i < kCycles; ++i) {
    Child c = Spawn(argv);
    ASSERT_GT(c.pid, 0);
    if (WaitReady(c, 20000)) ++ready;
    live.push_back(c);
    if (static_cast<int>(live.size()) >= kInFlight) {
      if (int code = Kill(live.front()); code >= 0) ++exit_codes[code];
      live.pop_front();
    }
    if (i % 100 == 99) max_contexts = std::max<uint64_t>(max_contexts, usage().contexts());
  }
  for (Child& c : live) {
    if (int code = Kill(c); code >= 0) ++exit_codes[code];
  }
  std::string failed;
  for (const auto& [code, count] : exit_codes) {
    failed += " exit " + std::to_string(code) + ": " + std::to_string(count) + ";";
  }
  EXPECT_EQ(ready, kCycles) << "every client got its resources before it was killed"
                            << " (clients that failed, by kvtier_churn_client exit code:" << failed
                            << ")";
  EXPECT_GT(max_contexts, 0u) << "the clients' contexts were seen while they lived";

  // Everything returns within the TTLs (500 ms) plus reaper rounds.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  v1::TenantStats now = usage();
  while (std::chrono::steady_clock::now() < deadline &&
         (now.contexts() != before.contexts() || now.leases() != before.leases() ||
          now.pinned_bytes() != before.pinned_bytes() ||
          now.staging_slots() != before.staging_slots())) {
    std::this_thread::yield();
    now = usage();
  }
  EXPECT_EQ(now.contexts(), before.contexts());
  EXPECT_EQ(now.leases(), before.leases());
  EXPECT_EQ(now.pinned_bytes(), before.pinned_bytes());
  EXPECT_EQ(now.staging_slots(), before.staging_slots());
  EXPECT_EQ(now.arena_bytes(), before.arena_bytes()) << "one arena per tenant, not per client";
  auto stats = ops->Stats();
  ASSERT_OK(stats);
  EXPECT_EQ(stats->open_contexts(), 0u);
  EXPECT_EQ(stats->active_leases(), 0u);
  EXPECT_EQ(stats->staging_slots(), 0u);
}

}  // namespace
}  // namespace kvtier::security
