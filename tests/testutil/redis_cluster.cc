#include "tests/testutil/redis_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "storage/common/errno_status.h"
#include "storage/common/status_macros.h"

namespace kvtier::testing {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kSlots = 16384;
constexpr int kBusPortOffset = 10000;
constexpr int kMaxPort = 65535 - kBusPortOffset;
constexpr std::chrono::milliseconds kPollInterval{20};

struct ReplyDeleter {
  void operator()(redisReply* reply) const { freeReplyObject(reply); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

struct ContextDeleter {
  void operator()(redisContext* context) const { redisFree(context); }
};

std::string ReplyString(const redisReply& reply) {
  return reply.str == nullptr ? std::string() : std::string(reply.str, reply.len);
}

// One command on its own connection: 1 s to connect, 10 s per reply (MIGRATE
// and WAIT take a while). Error replies are returned as replies.
absl::StatusOr<ReplyPtr> RawCommand(const std::string& node, const std::vector<std::string>& argv) {
  const size_t colon = node.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(node.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(absl::StrCat("\"", node, "\" is not host:port"));
  }
  const std::string host = node.substr(0, colon);
  std::unique_ptr<redisContext, ContextDeleter> context(
      redisConnectWithTimeout(host.c_str(), port, timeval{1, 0}));
  if (context == nullptr) return absl::ResourceExhaustedError("hiredis: no context");
  if (context->err != 0) {
    return absl::UnavailableError(absl::StrCat(node, ": connect: ", context->errstr));
  }
  redisSetTimeout(context.get(), timeval{10, 0});
  std::vector<const char*> args;
  std::vector<size_t> lengths;
  for (const std::string& arg : argv) {
    args.push_back(arg.data());
    lengths.push_back(arg.size());
  }
  void* raw =
      redisCommandArgv(context.get(), static_cast<int>(args.size()), args.data(), lengths.data());
  if (raw == nullptr) {
    return absl::UnavailableError(
        absl::StrCat(node, ": ", argv.empty() ? "" : argv[0], ": ", context->errstr));
  }
  return ReplyPtr(static_cast<redisReply*>(raw));
}

absl::StatusOr<std::string> Render(const redisReply& reply, const std::string& node) {
  switch (reply.type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
      return ReplyString(reply);
    case REDIS_REPLY_INTEGER:
      return absl::StrCat(reply.integer);
    case REDIS_REPLY_NIL:
      return absl::NotFoundError(absl::StrCat(node, ": nil reply"));
    case REDIS_REPLY_ERROR:
      return absl::InternalError(absl::StrCat(node, ": ", ReplyString(reply)));
    case REDIS_REPLY_ARRAY: {
      std::vector<std::string> parts;
      for (size_t i = 0; i < reply.elements; ++i) {
        if (reply.element[i]->type == REDIS_REPLY_NIL) {
          parts.emplace_back();
          continue;
        }
        KVTIER_ASSIGN_OR_RETURN(std::string part, Render(*reply.element[i], node));
        parts.push_back(std::move(part));
      }
      return absl::StrJoin(parts, "\n");
    }
    default:
      return absl::InternalError(absl::StrCat(node, ": reply type ", reply.type));
  }
}

// CLUSTER INFO / INFO text as key -> value.
std::map<std::string, std::string> ParseInfo(const std::string& text) {
  std::map<std::string, std::string> fields;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::EndsWith(line, "\r")) line.remove_suffix(1);
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || absl::StartsWith(line, "#")) continue;
    fields[std::string(line.substr(0, colon))] = std::string(line.substr(colon + 1));
  }
  return fields;
}

absl::StatusOr<std::map<std::string, std::string>> Info(const std::string& node,
                                                        const std::vector<std::string>& argv) {
  KVTIER_ASSIGN_OR_RETURN(ReplyPtr reply, RawCommand(node, argv));
  KVTIER_ASSIGN_OR_RETURN(std::string text, Render(*reply, node));
  return ParseInfo(text);
}

struct SlotRange {
  int start = 0;
  int end = 0;
  std::vector<std::string> nodes;  // master first
};

// CLUSTER SLOTS as `node` sees it; an empty endpoint means node's host.
absl::StatusOr<std::vector<SlotRange>> ClusterSlots(const std::string& node) {
  KVTIER_ASSIGN_OR_RETURN(ReplyPtr reply, RawCommand(node, {"CLUSTER", "SLOTS"}));
  if (reply->type == REDIS_REPLY_ERROR) {
    return absl::InternalError(absl::StrCat(node, ": CLUSTER SLOTS: ", ReplyString(*reply)));
  }
  if (reply->type != REDIS_REPLY_ARRAY) {
    return absl::InternalError(absl::StrCat(node, ": CLUSTER SLOTS: not an array"));
  }
  const std::string host = node.substr(0, node.rfind(':'));
  std::vector<SlotRange> ranges;
  for (size_t i = 0; i < reply->elements; ++i) {
    const redisReply& entry = *reply->element[i];
    if (entry.type != REDIS_REPLY_ARRAY || entry.elements < 3) {
      return absl::InternalError(absl::StrCat(node, ": CLUSTER SLOTS: malformed range"));
    }
    SlotRange range;
    range.start = static_cast<int>(entry.element[0]->integer);
    range.end = static_cast<int>(entry.element[1]->integer);
    for (size_t n = 2; n < entry.elements; ++n) {
      const redisReply& who = *entry.element[n];
      if (who.type != REDIS_REPLY_ARRAY || who.elements < 2) {
        return absl::InternalError(absl::StrCat(node, ": CLUSTER SLOTS: malformed node"));
      }
      std::string ip = ReplyString(*who.element[0]);
      if (ip.empty() || ip == "?") ip = host;
      range.nodes.push_back(absl::StrCat(ip, ":", who.element[1]->integer));
    }
    ranges.push_back(std::move(range));
  }
  return ranges;
}

// The master of `slot` in `ranges`, or "" when no range covers it.
std::string OwnerIn(const std::vector<SlotRange>& ranges, uint16_t slot) {
  for (const SlotRange& range : ranges) {
    if (slot >= range.start && slot <= range.end) return range.nodes.front();
  }
  return std::string();
}

// A port P <= kMaxPort on 127.0.0.1 where P and P + 10000 are both free now
// and P is not in `taken`. Ports are found by binding port 0.
absl::StatusOr<int> PickPortPair(const std::set<int>& taken) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return ErrnoToStatus(errno, "socket");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoToStatus(err, "bind 127.0.0.1:0");
    }
    const int port = ntohs(addr.sin_port);
    bool ok = port <= kMaxPort && !taken.contains(port) && !taken.contains(port + kBusPortOffset);
    if (ok) {
      // The bus port must be bindable as well (held while we check).
      const int bus = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in bus_addr = addr;
      bus_addr.sin_port = htons(static_cast<uint16_t>(port + kBusPortOffset));
      ok = bus >= 0 && ::bind(bus, reinterpret_cast<sockaddr*>(&bus_addr), sizeof(bus_addr)) == 0;
      if (bus >= 0) ::close(bus);
    }
    ::close(fd);
    if (ok) return port;
  }
  return absl::ResourceExhaustedError("no free 127.0.0.1 port pair (P, P + 10000) after 200 tries");
}

// fork + exec `args` with stdout and stderr to log_path, stdin from
// /dev/null, no inherited descriptors, and SIGKILL when the forking thread
// dies.
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& args, const std::string& log_path) {
  // Everything the child needs is built before fork: after it, only
  // async-signal-safe calls.
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (std::string& arg : copy) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return ErrnoToStatus(errno, absl::StrCat("fork ", args.front()));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    const int out = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    const int in = ::open("/dev/null", O_RDONLY);
    if (out < 0 || in < 0) ::_exit(126);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(out, 2);
    // Sockets the test holds (hiredis does not set CLOEXEC) must not live
    // on in a node.
#ifdef SYS_close_range
    if (::syscall(SYS_close_range, 3, ~0U, 0) != 0)
#endif
    {
      for (int fd = 3; fd < 4096; ++fd) ::close(fd);
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

// True (and *status set) once the child has exited; reaps it.
bool Reap(pid_t pid, bool wait, int* status) {
  pid_t r;
  do {
    r = ::waitpid(pid, status, wait ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  return r == pid;
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("signal ", WTERMSIG(status));
  return "unknown status";
}

std::string Tail(const std::string& path, size_t bytes) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > bytes) text = text.substr(text.size() - bytes);
  return text.empty() ? "(empty)" : text;
}

bool Ping(const std::string& node) {
  absl::StatusOr<ReplyPtr> reply = RawCommand(node, {"PING"});
  return reply.ok() && (*reply)->type == REDIS_REPLY_STATUS && ReplyString(**reply) == "PONG";
}

}  // namespace

// ---- Start ---------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<RedisClusterFixture>> RedisClusterFixture::Start(
    const RedisClusterFixtureOptions& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("dir: required");
  if (options.masters < 3 || options.masters > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("masters: must be 3..16 (redis-cli --cluster create), got ", options.masters));
  }
  if (options.replicas_per_master < 0 || options.replicas_per_master > 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicas_per_master: must be 0..4, got ", options.replicas_per_master));
  }
  if (options.node_timeout_ms == 0)
    return absl::InvalidArgumentError("node_timeout_ms: must be > 0");
  for (const std::string* binary : {&options.redis_server, &options.redis_cli}) {
    if (::access(binary->c_str(), X_OK) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(*binary, " is not executable"));
    }
  }
  std::unique_ptr<RedisClusterFixture> fixture(new RedisClusterFixture(options));
  KVTIER_RETURN_IF_ERROR(fixture->StartNodes());
  KVTIER_RETURN_IF_ERROR(fixture->CreateCluster());
  const Clock::time_point deadline = Clock::now() + options.ready_timeout;
  while (true) {
    const std::string reason = fixture->NotReadyReason();
    if (reason.empty()) return fixture;
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("redis cluster not ready within ",
                                                      options.ready_timeout.count(),
                                                      " ms: ", reason, "\n", fixture->LogTails()));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

absl::Status RedisClusterFixture::StartNodes() {
  const int count = options_.masters * (1 + options_.replicas_per_master);
  const Clock::time_point deadline = Clock::now() + options_.ready_timeout;
  std::set<int> taken;
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < count; ++i) {
    Node node;
    // Absolute: redis-server changes into --dir before it opens nodes.conf.
    node.dir = absl::StrCat(std::filesystem::absolute(options_.dir).string(), "/node-", i);
    if (::mkdir(node.dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoToStatus(errno, absl::StrCat("mkdir ", node.dir));
    }
    node.log_path = node.dir + "/redis.log";
    absl::Status last;
    for (int attempt = 0; attempt < 3; ++attempt) {
      KVTIER_ASSIGN_OR_RETURN(node.port, PickPortPair(taken));
      taken.insert(node.port);
      taken.insert(node.port + kBusPortOffset);
      node.address = absl::StrCat("127.0.0.1:", node.port);
      // clang-format off
      const std::vector<std::string> args = {
          options_.redis_server,
          "--port", absl::StrCat(node.port),
          "--bind", "127.0.0.1",
          "--protected-mode", "no",
          "--daemonize", "no",
          "--dir", node.dir,
          "--logfile", "",
          "--save", "",
          "--appendonly", "no",
          "--cluster-enabled", "yes",
          "--cluster-config-file", node.dir + "/nodes.conf",
          "--cluster-node-timeout", absl::StrCat(options_.node_timeout_ms),
          "--cluster-require-full-coverage", options_.require_full_coverage ? "yes" : "no",
          // Fast, deterministic failover and initial sync for tests: any
          // replica may take over, and full syncs start at once.
          "--cluster-replica-validity-factor", "0",
          "--repl-diskless-sync", "yes",
          "--repl-diskless-sync-delay", "0",
          // CLUSTER SLOTS lists a replica only once its replication offset
          // is non-zero, which an idle master's PINGs bring about: every
          // second instead of every ten.
          "--repl-ping-replica-period", "1"};
      // clang-format on
      KVTIER_ASSIGN_OR_RETURN(node.pid, Spawn(args, node.log_path));
      // Until it answers PING, or exits (the port was taken meanwhile).
      while (true) {
        int status = 0;
        if (Reap(node.pid, /*wait=*/false, &status)) {
          node.pid = -1;
          last = absl::UnavailableError(absl::StrCat("redis-server on ", node.address, " exited (",
                                                     DescribeExit(status),
                                                     "); log: ", Tail(node.log_path, 600)));
          break;
        }
        if (Ping(node.address)) {
          last = absl::OkStatus();
          break;
        }
        if (Clock::now() >= deadline) {
          nodes_.push_back(node);  // the destructor kills it
          return absl::DeadlineExceededError(
              absl::StrCat("redis-server on ", node.address,
                           " did not answer PING; log: ", Tail(node.log_path, 600)));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (last.ok()) break;
    }
    if (!last.ok()) return last;
    nodes_.push_back(node);
  }
  return absl::OkStatus();
}

absl::Status RedisClusterFixture::CreateCluster() {
  std::vector<std::string> args = {options_.redis_cli, "--cluster", "create"};
  for (const std::string& seed : Seeds()) args.push_back(seed);
  args.insert(args.end(),
              {"--cluster-replicas", absl::StrCat(options_.replicas_per_master), "--cluster-yes"});
  const std::string log_path = options_.dir + "/cluster-create.log";
  KVTIER_ASSIGN_OR_RETURN(const pid_t pid, Spawn(args, log_path));
  const Clock::time_point deadline = Clock::now() + options_.ready_timeout;
  int status = 0;
  while (!Reap(pid, /*wait=*/false, &status)) {
    if (Clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      Reap(pid, /*wait=*/true, &status);
      return absl::DeadlineExceededError(
          absl::StrCat("redis-cli --cluster create did not finish within ",
                       options_.ready_timeout.count(), " ms; log: ", Tail(log_path, 2000)));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("redis-cli --cluster create failed (",
                                            DescribeExit(status),
                                            "); log: ", Tail(log_path, 2000)));
  }
  return absl::OkStatus();
}

std::string RedisClusterFixture::NotReadyReason() {
  const std::vector<std::string> live = LiveNodes();
  const size_t per_range = 1 + static_cast<size_t>(options_.replicas_per_master);
  for (const std::string& node : live) {
    absl::StatusOr<std::map<std::string, std::string>> info = Info(node, {"CLUSTER", "INFO"});
    if (!info.ok()) return std::string(info.status().message());
    if ((*info)["cluster_state"] != "ok" || (*info)["cluster_slots_ok"] != "16384" ||
        (*info)["cluster_known_nodes"] != absl::StrCat(live.size())) {
      return absl::StrCat(node, ": cluster_state:", (*info)["cluster_state"],
                          " cluster_slots_ok:", (*info)["cluster_slots_ok"],
                          " cluster_known_nodes:", (*info)["cluster_known_nodes"]);
    }
    absl::StatusOr<std::vector<SlotRange>> ranges = ClusterSlots(node);
    if (!ranges.ok()) return std::string(ranges.status().message());
    int covered = 0;
    for (const SlotRange& range : *ranges) {
      covered += range.end - range.start + 1;
      if (range.nodes.size() != per_range) {
        return absl::StrCat(node, ": slots ", range.start, "-", range.end, " have ",
                            range.nodes.size(), " nodes, not ", per_range);
      }
    }
    if (covered != kSlots) return absl::StrCat(node, ": CLUSTER SLOTS covers ", covered, " slots");
    absl::StatusOr<std::map<std::string, std::string>> replication =
        Info(node, {"INFO", "replication"});
    if (!replication.ok()) return std::string(replication.status().message());
    if ((*replication)["role"] == "slave" && (*replication)["master_link_status"] != "up") {
      return absl::StrCat(node, ": replica link to its master is ",
                          (*replication)["master_link_status"]);
    }
  }
  return std::string();
}

RedisClusterFixture::~RedisClusterFixture() {
  absl::MutexLock lock(&mu_);
  for (Node& node : nodes_) {
    if (node.pid <= 0) continue;
    ::kill(node.pid, SIGKILL);
  }
  for (Node& node : nodes_) {
    if (node.pid <= 0) continue;
    int status = 0;
    Reap(node.pid, /*wait=*/true, &status);
    node.pid = -1;
  }
}

// ---- Queries -------------------------------------------------------------------

std::vector<std::string> RedisClusterFixture::Seeds() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> seeds;
  for (const Node& node : nodes_) seeds.push_back(node.address);
  return seeds;
}

std::vector<std::string> RedisClusterFixture::LiveNodes() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> live;
  for (const Node& node : nodes_) {
    if (node.pid > 0) live.push_back(node.address);
  }
  return live;
}

std::string RedisClusterFixture::LogTails() const {
  absl::MutexLock lock(&mu_);
  std::string out =
      absl::StrCat("--- cluster-create.log:\n", Tail(options_.dir + "/cluster-create.log", 1500));
  for (const Node& node : nodes_) {
    absl::StrAppend(&out, "\n--- ", node.address, " ", node.log_path, ":\n",
                    Tail(node.log_path, 500));
  }
  return out;
}

absl::StatusOr<std::string> RedisClusterFixture::Command(const std::string& node,
                                                         const std::vector<std::string>& argv) {
  if (argv.empty()) return absl::InvalidArgumentError("argv: empty");
  KVTIER_ASSIGN_OR_RETURN(ReplyPtr reply, RawCommand(node, argv));
  return Render(*reply, node);
}

absl::StatusOr<std::string> RedisClusterFixture::NodeId(const std::string& node) {
  return Command(node, {"CLUSTER", "MYID"});
}

absl::StatusOr<std::string> RedisClusterFixture::MasterOf(uint16_t slot) {
  std::vector<std::string> failures;
  for (const std::string& node : LiveNodes()) {
    absl::StatusOr<std::vector<SlotRange>> ranges = ClusterSlots(node);
    if (!ranges.ok()) {
      failures.push_back(std::string(ranges.status().message()));
      continue;
    }
    std::string owner = OwnerIn(*ranges, slot);
    if (owner.empty()) {
      return absl::NotFoundError(absl::StrCat(node, ": no master serves slot ", slot));
    }
    return owner;
  }
  return absl::UnavailableError(
      absl::StrCat("no live node answered CLUSTER SLOTS: ", absl::StrJoin(failures, "; ")));
}

absl::StatusOr<std::vector<std::string>> RedisClusterFixture::Masters() {
  std::vector<std::string> failures;
  for (const std::string& node : LiveNodes()) {
    absl::StatusOr<std::vector<SlotRange>> ranges = ClusterSlots(node);
    if (!ranges.ok()) {
      failures.push_back(std::string(ranges.status().message()));
      continue;
    }
    std::set<std::string> masters;
    for (const SlotRange& range : *ranges) masters.insert(range.nodes.front());
    return std::vector<std::string>(masters.begin(), masters.end());
  }
  return absl::UnavailableError(
      absl::StrCat("no live node answered CLUSTER SLOTS: ", absl::StrJoin(failures, "; ")));
}

// ---- Faults and slot moves -----------------------------------------------------

absl::Status RedisClusterFixture::Kill(const std::string& node) {
  absl::MutexLock lock(&mu_);
  for (Node& n : nodes_) {
    if (n.address != node || n.pid <= 0) continue;
    if (::kill(n.pid, SIGKILL) != 0) return ErrnoToStatus(errno, absl::StrCat("kill ", node));
    int status = 0;
    Reap(n.pid, /*wait=*/true, &status);
    n.pid = -1;
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat(node, " is not a running node of this cluster"));
}

absl::Status RedisClusterFixture::WaitForFailover(uint16_t slot, const std::string& old_master,
                                                  std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  std::string observed;
  while (true) {
    const std::vector<std::string> live = LiveNodes();
    std::set<std::string> owners;
    observed.clear();
    for (const std::string& node : live) {
      absl::StatusOr<std::map<std::string, std::string>> info = Info(node, {"CLUSTER", "INFO"});
      absl::StatusOr<std::vector<SlotRange>> ranges = ClusterSlots(node);
      if (!info.ok() || !ranges.ok()) {
        absl::StrAppend(&observed, node, ": ",
                        !info.ok() ? info.status().message() : ranges.status().message(), "; ");
        owners.insert("?");
        continue;
      }
      const std::string owner = OwnerIn(*ranges, slot);
      absl::StrAppend(&observed, node, ": state ", (*info)["cluster_state"], ", slot ", slot,
                      " on ", owner.empty() ? "nobody" : owner, "; ");
      if ((*info)["cluster_state"] != "ok") owners.insert("?");
      owners.insert(owner);
    }
    if (owners.size() == 1) {
      const std::string& owner = *owners.begin();
      if (owner != old_master && std::find(live.begin(), live.end(), owner) != live.end()) {
        return absl::OkStatus();
      }
    }
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("slot ", slot, " did not fail over from ",
                                                      old_master, " within ", timeout.count(),
                                                      " ms; last seen: ", observed));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

absl::Status RedisClusterFixture::WaitForReplication(std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  std::map<std::string, int64_t> master_offsets;  // "host:port" -> offset at the start
  std::vector<std::string> replicas;
  for (const std::string& node : LiveNodes()) {
    KVTIER_ASSIGN_OR_RETURN(auto info, Info(node, {"INFO", "replication"}));
    if (info["role"] == "master") {
      int64_t offset = 0;
      if (!absl::SimpleAtoi(info["master_repl_offset"], &offset)) {
        return absl::InternalError(absl::StrCat(node, ": no master_repl_offset in INFO"));
      }
      master_offsets[node] = offset;
    } else {
      replicas.push_back(node);
    }
  }
  for (const std::string& replica : replicas) {
    while (true) {
      KVTIER_ASSIGN_OR_RETURN(auto info, Info(replica, {"INFO", "replication"}));
      const std::string master = absl::StrCat(info["master_host"], ":", info["master_port"]);
      int64_t applied = -1;
      if (!absl::SimpleAtoi(info["slave_repl_offset"], &applied)) applied = -1;
      const auto target = master_offsets.find(master);
      // A replica of a dead master has nothing more to wait for.
      if (target == master_offsets.end()) break;
      if (info["master_link_status"] == "up" && applied >= target->second) break;
      if (Clock::now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat(replica, " (replica of ", master, ", link ", info["master_link_status"],
                         ") applied offset ", applied, " < ", target->second, " after ",
                         timeout.count(), " ms"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return absl::OkStatus();
}

absl::Status RedisClusterFixture::MoveSlot(uint16_t slot, const std::string& to,
                                           std::chrono::milliseconds timeout) {
  const std::string slot_text = absl::StrCat(slot);
  KVTIER_ASSIGN_OR_RETURN(const std::string from, MasterOf(slot));
  if (from != to) {
    KVTIER_ASSIGN_OR_RETURN(const std::string from_id, NodeId(from));
    KVTIER_ASSIGN_OR_RETURN(const std::string to_id, NodeId(to));
    KVTIER_RETURN_IF_ERROR(
        Command(to, {"CLUSTER", "SETSLOT", slot_text, "IMPORTING", from_id}).status());
    KVTIER_RETURN_IF_ERROR(
        Command(from, {"CLUSTER", "SETSLOT", slot_text, "MIGRATING", to_id}).status());
    const size_t colon = to.rfind(':');
    while (true) {
      KVTIER_ASSIGN_OR_RETURN(ReplyPtr keys,
                              RawCommand(from, {"CLUSTER", "GETKEYSINSLOT", slot_text, "100"}));
      if (keys->type != REDIS_REPLY_ARRAY) {
        return absl::InternalError(
            absl::StrCat(from, ": CLUSTER GETKEYSINSLOT: ", ReplyString(*keys)));
      }
      if (keys->elements == 0) break;
      std::vector<std::string> migrate = {
          "MIGRATE", to.substr(0, colon), to.substr(colon + 1), "", "0", "5000", "KEYS"};
      for (size_t i = 0; i < keys->elements; ++i) migrate.push_back(ReplyString(*keys->element[i]));
      KVTIER_RETURN_IF_ERROR(Command(from, migrate).status());
    }
    // Target first, then source, then everyone else (as redis-cli does).
    KVTIER_ASSIGN_OR_RETURN(std::vector<std::string> masters, Masters());
    std::vector<std::string> order = {to, from};
    for (const std::string& m : masters) {
      if (m != to && m != from) order.push_back(m);
    }
    for (const std::string& m : order) {
      KVTIER_RETURN_IF_ERROR(Command(m, {"CLUSTER", "SETSLOT", slot_text, "NODE", to_id}).status());
    }
  }
  const Clock::time_point deadline = Clock::now() + timeout;
  while (true) {
    std::string disagree;
    for (const std::string& node : LiveNodes()) {
      absl::StatusOr<std::vector<SlotRange>> ranges = ClusterSlots(node);
      const std::string owner = ranges.ok() ? OwnerIn(*ranges, slot) : "?";
      if (owner != to) absl::StrAppend(&disagree, node, " says ", owner, "; ");
    }
    if (disagree.empty()) return absl::OkStatus();
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("slot ", slot, " not on ", to, " within ",
                                                      timeout.count(), " ms: ", disagree));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

}  // namespace kvtier::testing
