#include "client/shm/fd_fetch.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>
#include <vector>

namespace kvtier::client {
namespace {

// The daemon's limit on a line (daemon/auth/fd_server.h).
constexpr size_t kMaxLineBytes = 512;
// Descriptors accepted in one recvmsg: the protocol sends one; room for a
// few more lets a misbehaving peer's extras be closed instead of leaked.
constexpr size_t kMaxFds = 4;

using Clock = std::chrono::steady_clock;

int MsLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

// The one place errno becomes a message in this file.
std::string ErrnoText(const char* what, const std::string& path, int err) {
  return std::string(what) + " " + path + ": " + std::strerror(err);
}

// Waits for `events` on fd until the deadline: 1 ready, 0 timed out, -1
// failed (errno set).
int WaitFor(int fd, short events, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, MsLeft(deadline));
    if (r < 0 && errno == EINTR) continue;
    return r;
  }
}

class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  const int fd_;
};

bool ValidToken(const std::string& token) {
  if (token.size() > kMaxLineBytes - 16) return false;
  for (char c : token) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

// Parses "ok <size>" / "error <code> <message>" with the fds that came with it.
FetchedFd ParseReply(const std::string& line, std::vector<int>* fds, const std::string& where) {
  auto close_all = [&] {
    for (int fd : *fds) ::close(fd);
    fds->clear();
  };
  if (line.rfind("ok ", 0) == 0) {
    const std::string digits = line.substr(3);
    uint64_t size = 0;
    bool valid = !digits.empty() && digits.size() <= 20;
    for (char c : digits) {
      if (c < '0' || c > '9' || size > (UINT64_MAX - (c - '0')) / 10) {
        valid = false;
        break;
      }
      size = size * 10 + static_cast<uint64_t>(c - '0');
    }
    if (!valid) {
      close_all();
      return FetchedFd::Error(kFdInternal, where + ": malformed size in reply '" + line + "'");
    }
    if (fds->size() != 1) {
      const size_t n = fds->size();
      close_all();
      return FetchedFd::Error(kFdInternal, where + ": reply 'ok' came with " + std::to_string(n) +
                                               " descriptors, expected 1");
    }
    const int fd = fds->front();
    fds->clear();
    return FetchedFd(fd, size);
  }
  close_all();
  if (line.rfind("error ", 0) == 0) {
    const std::string rest = line.substr(6);
    const size_t space = rest.find(' ');
    const std::string number = rest.substr(0, space);
    int code = 0;
    bool valid = !number.empty() && number.size() <= 2;
    for (char c : number) {
      if (c < '0' || c > '9') valid = false;
      code = code * 10 + (c - '0');
    }
    // An "error" line must not read as success, whatever its number says.
    if (!valid || code == kFdOk || code > 16) code = 2;  // UNKNOWN
    const std::string message = space == std::string::npos ? "" : rest.substr(space + 1);
    return FetchedFd::Error(code, where + ": " + message);
  }
  return FetchedFd::Error(kFdInternal, where + ": unexpected reply '" + line + "'");
}

}  // namespace

FetchedFd FetchedFd::Error(int code, std::string message) {
  FetchedFd out;
  out.code_ = code;
  out.message_ = std::move(message);
  return out;
}

FetchedFd::FetchedFd(FetchedFd&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      size_bytes_(other.size_bytes_),
      code_(other.code_),
      message_(std::move(other.message_)) {}

FetchedFd& FetchedFd::operator=(FetchedFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_bytes_ = other.size_bytes_;
    code_ = other.code_;
    message_ = std::move(other.message_);
  }
  return *this;
}

FetchedFd::~FetchedFd() {
  if (fd_ >= 0) ::close(fd_);
}

int FetchedFd::Release() { return std::exchange(fd_, -1); }

std::string FetchedFd::ToString() const {
  return ok() ? "OK" : StatusCodeName(code_) + ": " + message_;
}

const char* SharedFileKindName(SharedFileKind kind) {
  return kind == SharedFileKind::kArena ? "arena" : "staging";
}

std::string StatusCodeName(int code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  if (code >= 0 && code <= 16) return kNames[code];
  return "CODE_" + std::to_string(code);
}

FetchedFd FetchSharedFd(const std::string& socket_path, SharedFileKind kind,
                        const std::string& token, int timeout_ms) {
  const std::string where =
      std::string("fd socket ") + socket_path + " (" + SharedFileKindName(kind) + ")";
  sockaddr_un addr{};
  if (socket_path.empty() || socket_path.size() >= sizeof(addr.sun_path)) {
    return FetchedFd::Error(kFdInvalidArgument,
                            where + ": fd_socket_path is empty or longer than " +
                                std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  }
  if (!ValidToken(token)) {
    return FetchedFd::Error(kFdInvalidArgument,
                            where + ": token must be printable ASCII without spaces, at most " +
                                std::to_string(kMaxLineBytes - 16) + " bytes");
  }
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  ScopedFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (sock.get() < 0) return FetchedFd::Error(kFdUnavailable, ErrnoText("socket", where, errno));
  // A Unix-socket connect completes at once or fails (EAGAIN: backlog full).
  if (::connect(sock.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return FetchedFd::Error(kFdUnavailable, ErrnoText("connect to", where, errno));
  }

  const std::string request =
      std::string(SharedFileKindName(kind)) + " " + (token.empty() ? "-" : token) + "\n";
  size_t sent = 0;
  while (sent < request.size()) {
    const int ready = WaitFor(sock.get(), POLLOUT, deadline);
    if (ready == 0) return FetchedFd::Error(kFdDeadlineExceeded, where + ": send timed out");
    if (ready < 0) return FetchedFd::Error(kFdUnavailable, ErrnoText("poll", where, errno));
    const ssize_t n =
        ::send(sock.get(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return FetchedFd::Error(kFdUnavailable, ErrnoText("send to", where, errno));
    sent += static_cast<size_t>(n);
  }

  // The reply may arrive in pieces; the descriptor rides on one of them.
  std::string line;
  std::vector<int> fds;
  auto fail = [&](int code, std::string message) {
    for (int fd : fds) ::close(fd);
    return FetchedFd::Error(code, std::move(message));
  };
  while (true) {
    const int ready = WaitFor(sock.get(), POLLIN, deadline);
    if (ready == 0) {
      return fail(kFdDeadlineExceeded,
                  where + ": no reply within " + std::to_string(timeout_ms) + " ms");
    }
    if (ready < 0) return fail(kFdUnavailable, ErrnoText("poll", where, errno));
    char buf[kMaxLineBytes];
    iovec iov{buf, kMaxLineBytes - line.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(sock.get(), &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return fail(kFdUnavailable, ErrnoText("recvmsg from", where, errno));
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds.push_back(fd);
      }
    }
    if (msg.msg_flags & MSG_CTRUNC) {
      return fail(kFdInternal,
                  where + ": the daemon sent more descriptors than the protocol's one");
    }
    if (n == 0) {
      return fail(kFdUnavailable, where + ": the daemon closed the connection without a reply" +
                                      (line.empty() ? "" : " line (got '" + line + "')"));
    }
    line.append(buf, static_cast<size_t>(n));
    const size_t nl = line.find('\n');
    if (nl != std::string::npos) {
      line.resize(nl);
      return ParseReply(line, &fds, where);
    }
    if (line.size() >= kMaxLineBytes) {
      return fail(kFdInternal, where + ": reply longer than " + std::to_string(kMaxLineBytes) +
                                   " bytes without a newline");
    }
  }
}

}  // namespace kvtier::client
