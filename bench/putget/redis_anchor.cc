#include "bench/putget/redis_anchor.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "storage/common/errno_status.h"

namespace kvtier::bench {
namespace {

// A loopback port nobody listens on right now (bind port 0, read it back).
absl::StatusOr<int> FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoToStatus(errno, "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoToStatus(err, "bind 127.0.0.1:0");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Waits up to timeout for the child to exit, without reaping it. True when
// it exited.
bool WaitExit(pid_t pid, std::chrono::milliseconds timeout) {
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    int rc;
    do {
      rc = ::poll(&p, 1, static_cast<int>(timeout.count()));
    } while (rc < 0 && errno == EINTR);
    ::close(pidfd);
    return rc > 0;
  }
  // Kernels without pidfd_open: check every 5 ms until the deadline.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    siginfo_t info{};
    if (::waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid) {
      return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    ::usleep(5000);
  }
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("signal ", WTERMSIG(status));
  return "unknown status";
}

using ReplyPtr = std::unique_ptr<redisReply, void (*)(void*)>;

}  // namespace

// ---- RedisServer ------------------------------------------------------------

absl::StatusOr<std::unique_ptr<RedisServer>> RedisServer::Start(
    const std::string& binary, const std::string& dir, std::chrono::milliseconds ready_timeout) {
  const std::string unix_socket = dir + "/redis.sock";
  const std::string log_path = dir + "/redis.log";
  absl::Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto port = FreeLoopbackPort();
    if (!port.ok()) return port.status();
    // Everything the child needs is built before fork: after it, only
    // async-signal-safe calls.
    std::vector<std::string> args = {binary,
                                     "--port",
                                     std::to_string(*port),
                                     "--bind",
                                     "127.0.0.1",
                                     "--unixsocket",
                                     unix_socket,
                                     "--unixsocketperm",
                                     "700",
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--daemonize",
                                     "no",
                                     "--dir",
                                     dir,
                                     "--logfile",
                                     ""};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) return ErrnoToStatus(errno, "fork redis-server");
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(127);
      const int out = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      const int in = ::open("/dev/null", O_RDONLY);
      if (out < 0 || in < 0) ::_exit(126);
      ::dup2(in, 0);
      ::dup2(out, 1);
      ::dup2(out, 2);
      ::execv(binary.c_str(), argv.data());
      ::_exit(127);
    }
    std::unique_ptr<RedisServer> server(new RedisServer(pid, *port, unix_socket, log_path));
    last = server->WaitReady(ready_timeout);
    if (last.ok()) return server;
    if (server->pid_ > 0) return last;  // still running but not answering: give up
    // It exited (e.g. the port was taken meanwhile): try another port.
  }
  return last;
}

absl::Status RedisServer::WaitReady(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::UnavailableError(absl::StrCat("redis-server exited (", DescribeExit(status),
                                                 ") before answering PING; log: ", LogTail()));
    }
    timeval tv{0, 200000};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
    if (c != nullptr && c->err == 0) {
      ReplyPtr reply(static_cast<redisReply*>(redisCommand(c, "PING")), freeReplyObject);
      const bool pong = reply != nullptr && reply->type == REDIS_REPLY_STATUS &&
                        std::string(reply->str, reply->len) == "PONG";
      if (pong) {
        ReplyPtr info(static_cast<redisReply*>(redisCommand(c, "INFO server")), freeReplyObject);
        if (info != nullptr && info->type == REDIS_REPLY_STRING) {
          std::istringstream lines(std::string(info->str, info->len));
          for (std::string line; std::getline(lines, line);) {
            if (line.rfind("redis_version:", 0) == 0) {
              version_ = line.substr(14);
              version_.erase(version_.find_last_not_of("\r\n") + 1);
            }
          }
        }
        redisFree(c);
        return absl::OkStatus();
      }
    }
    if (c != nullptr) redisFree(c);
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("redis-server did not answer PING on 127.0.0.1:", port_, " within ",
                       timeout.count(), " ms; log: ", LogTail()));
    }
    // Back off briefly between attempts; wakes at once if the child exits.
    WaitExit(pid_, std::min<std::chrono::milliseconds>(
                       std::chrono::milliseconds(10),
                       std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now)));
  }
}

absl::Status RedisServer::Stop() {
  if (pid_ < 0) return absl::OkStatus();
  ::kill(pid_, SIGTERM);
  bool exited = WaitExit(pid_, std::chrono::milliseconds(5000));
  if (!exited) ::kill(pid_, SIGKILL);
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, 0);
  } while (r < 0 && errno == EINTR);
  pid_ = -1;
  if (!exited) return absl::DeadlineExceededError("redis-server ignored SIGTERM for 5 s; killed");
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("redis-server stopped with ", DescribeExit(status), "; log: ", LogTail()));
}

RedisServer::~RedisServer() { Stop().IgnoreError(); }

std::string RedisServer::LogTail() const {
  std::ifstream in(log_path_);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > 600) text = text.substr(text.size() - 600);
  return text.empty() ? "(empty)" : text;
}

// ---- RedisClient ------------------------------------------------------------

absl::StatusOr<std::unique_ptr<RedisClient>> RedisClient::ConnectTcp(int port) {
  timeval tv{5, 0};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, tv);
  if (c == nullptr) return absl::ResourceExhaustedError("hiredis: cannot allocate a context");
  std::unique_ptr<RedisClient> client(new RedisClient(c));
  if (c->err != 0) return client->ContextError(absl::StrCat("connect 127.0.0.1:", port));
  timeval op{120, 0};
  redisSetTimeout(c, op);
  return client;
}

absl::StatusOr<std::unique_ptr<RedisClient>> RedisClient::ConnectUnix(const std::string& path) {
  timeval tv{5, 0};
  redisContext* c = redisConnectUnixWithTimeout(path.c_str(), tv);
  if (c == nullptr) return absl::ResourceExhaustedError("hiredis: cannot allocate a context");
  std::unique_ptr<RedisClient> client(new RedisClient(c));
  if (c->err != 0) return client->ContextError(absl::StrCat("connect unix:", path));
  timeval op{120, 0};
  redisSetTimeout(c, op);
  return client;
}

RedisClient::~RedisClient() { redisFree(c_); }

absl::Status RedisClient::ContextError(const std::string& what) const {
  return absl::UnavailableError(absl::StrCat("redis ", what, ": ", c_->errstr));
}

absl::Status RedisClient::SetBlocks(const WorkingSet& ws, const std::vector<std::string>& keys,
                                    uint32_t batch) {
  const uint64_t n = keys.size();
  const size_t size = ws.block_bytes();
  for (uint64_t first = 0; first < n; first += batch) {
    const uint64_t end = std::min<uint64_t>(n, first + batch);
    for (uint64_t i = first; i < end; ++i) {
      if (redisAppendCommand(c_, "SET %b %b", keys[i].data(), keys[i].size(), ws.src(i), size) !=
          REDIS_OK) {
        return ContextError("SET");
      }
    }
    for (uint64_t i = first; i < end; ++i) {
      void* raw = nullptr;
      if (redisGetReply(c_, &raw) != REDIS_OK) return ContextError("SET reply");
      ReplyPtr reply(static_cast<redisReply*>(raw), freeReplyObject);
      if (reply->type != REDIS_REPLY_STATUS || std::string(reply->str, reply->len) != "OK") {
        return absl::InternalError(
            absl::StrCat("redis SET of block ", i, " answered type ", reply->type, ": ",
                         reply->str ? std::string(reply->str, reply->len) : std::string()));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status RedisClient::GetBlocks(WorkingSet* ws, const std::vector<std::string>& keys,
                                    uint32_t batch) {
  const uint64_t n = keys.size();
  const size_t size = ws->block_bytes();
  for (uint64_t first = 0; first < n; first += batch) {
    const uint64_t end = std::min<uint64_t>(n, first + batch);
    for (uint64_t i = first; i < end; ++i) {
      if (redisAppendCommand(c_, "GET %b", keys[i].data(), keys[i].size()) != REDIS_OK) {
        return ContextError("GET");
      }
    }
    for (uint64_t i = first; i < end; ++i) {
      void* raw = nullptr;
      if (redisGetReply(c_, &raw) != REDIS_OK) return ContextError("GET reply");
      ReplyPtr reply(static_cast<redisReply*>(raw), freeReplyObject);
      if (reply->type != REDIS_REPLY_STRING || reply->len != size) {
        return absl::InternalError(absl::StrCat("redis GET of block ", i, " answered type ",
                                                reply->type, " with ", reply->len, " bytes"));
      }
      std::memcpy(ws->dst(i), reply->str, size);
    }
  }
  return absl::OkStatus();
}

absl::Status RedisClient::FlushAll() {
  ReplyPtr reply(static_cast<redisReply*>(redisCommand(c_, "FLUSHALL SYNC")), freeReplyObject);
  if (reply == nullptr) return ContextError("FLUSHALL");
  if (reply->type == REDIS_REPLY_ERROR) {
    return absl::InternalError(
        absl::StrCat("redis FLUSHALL: ", std::string(reply->str, reply->len)));
  }
  return absl::OkStatus();
}

}  // namespace kvtier::bench
