#include "daemon/auth/fd_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/net/unix_acceptor.h"
#include "storage/common/errno_status.h"
#include "storage/common/status_macros.h"

namespace kvtier::daemon {
namespace {

constexpr size_t kMaxLineBytes = 512;
constexpr int kAcceptBatch = 16;

using Clock = std::chrono::steady_clock;

// A reply is one short line: it fits an empty socket buffer, so it is sent
// without waiting; a peer that does not read gets what fits.
void SendAll(int fd, const std::string& text) {
  size_t off = 0;
  while (off < text.size()) {
    ssize_t n = ::send(fd, text.data() + off, text.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

void SendError(int fd, const absl::Status& st) {
  std::string msg(st.message());
  for (char& c : msg) {
    if (c == '\n') c = ' ';
  }
  SendAll(fd, absl::StrCat("error ", static_cast<int>(st.code()), " ", msg, "\n"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<FdServer>> FdServer::Start(const std::string& path, uint32_t mode,
                                                          Resolver resolver) {
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(path, " exists and is not a socket"));
    }
    ::unlink(path.c_str());
  }
  KVTIER_ASSIGN_OR_RETURN(OwnedFd listen_fd,
                          ListenUnix("fd socket path", path, static_cast<mode_t>(mode)));
  OwnedFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  OwnedFd spare(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!wake.valid() || !spare.valid()) {
    absl::Status s = ErrnoToStatus(errno, "eventfd or /dev/null");
    ::unlink(path.c_str());
    return s;
  }
  std::unique_ptr<FdServer> server(
      new FdServer(path, listen_fd.Release(), wake.Release(), std::move(resolver)));
  server->spare_fd_ = std::move(spare);
  server->worker_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

FdServer::FdServer(std::string path, int listen_fd, int wake_fd, Resolver resolver)
    : path_(std::move(path)),
      listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      resolver_(std::move(resolver)) {}

FdServer::~FdServer() {
  uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  if (worker_.joinable()) worker_.join();
  ::close(listen_fd_);
  ::close(wake_fd_);
  ::unlink(path_.c_str());
}

void FdServer::Loop() {
  std::vector<pollfd> fds;
  while (true) {
    // Connections past their deadline are closed, whatever they sent.
    const Clock::time_point now = Clock::now();
    int timeout_ms = -1;
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->deadline <= now) {
        ::close(it->fd);
        ++timed_out_;
        it = pending_.erase(it);
        continue;
      }
      const int left = static_cast<int>(
          std::chrono::ceil<std::chrono::milliseconds>(it->deadline - now).count());
      timeout_ms = timeout_ms < 0 ? left : std::min(timeout_ms, left);
      ++it;
    }
    // Out of descriptors: no accepting for a while (poll skips fd -1).
    const bool backing_off = now < backoff_until_;
    if (backing_off) {
      const int left = static_cast<int>(
          std::chrono::ceil<std::chrono::milliseconds>(backoff_until_ - now).count());
      timeout_ms = timeout_ms < 0 ? left : std::min(timeout_ms, left);
    }
    fds.assign({{backing_off ? -1 : listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}});
    for (const Pending& c : pending_) fds.push_back({c.fd, POLLIN, 0});
    const int r = ::poll(fds.data(), fds.size(), timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 || (fds[1].revents & POLLIN)) break;
    // Requests first (they were waiting), then new connections.
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto it = std::find_if(pending_.begin(), pending_.end(),
                             [&](const Pending& c) { return c.fd == fds[i].fd; });
      if (it != pending_.end() && !ReadRequest(&*it)) {
        ::close(it->fd);
        pending_.erase(it);
      }
    }
    if (fds[0].revents & POLLIN) Accept();
  }
  for (const Pending& c : pending_) ::close(c.fd);
  pending_.clear();
}

void FdServer::Accept() {
  // A bounded batch per round: connections accepted earlier have their
  // bytes read before more are taken in.
  for (int taken = 0; taken < kAcceptBatch; ++taken) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // EAGAIN: none left. Out of descriptors: shed one, retry later.
      if (ShedIfExhausted(errno, listen_fd_, &spare_fd_)) {
        backoff_until_ = Clock::now() + kEmfileBackoff;
        ++fd_exhausted_;
      }
      return;
    }
    if (pending_.size() >= kMaxPendingConnections) {
      // Over the cap the oldest waiting connection goes: it has used most
      // of its deadline without a request, where a client's request
      // arrives with its connection; so holding sockets open starves no
      // one.
      ::close(pending_.front().fd);
      pending_.erase(pending_.begin());
      ++refused_;
    }
    pending_.push_back({fd, Clock::now() + std::chrono::milliseconds(kRequestTimeoutMs), {}});
  }
}

bool FdServer::ReadRequest(Pending* c) {
  char buf[kMaxLineBytes];
  const ssize_t n = ::recv(c->fd, buf, kMaxLineBytes - c->line.size(), 0);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
  if (n <= 0) return false;
  c->line.append(buf, static_cast<size_t>(n));
  const size_t nl = c->line.find('\n');
  if (nl == std::string::npos) return c->line.size() < kMaxLineBytes;
  c->line.resize(nl);
  Serve(c->fd, c->line);
  return false;  // answered: close
}

void FdServer::Serve(int fd, const std::string& line) {
  std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(' ', 1));
  if (parts.size() != 2 || (parts[0] != "arena" && parts[0] != "staging")) {
    SendError(fd, absl::InvalidArgumentError("request must be '<arena|staging> <token>'"));
    return;
  }
  const SharedFile kind = parts[0] == "arena" ? SharedFile::kArena : SharedFile::kStaging;
  absl::StatusOr<SharedFileRef> ref = resolver_(parts[1], kind);
  if (!ref.ok()) {
    SendError(fd, ref.status());
    return;
  }
  if (!ref->fd.valid()) {
    ref->fd.Reset(::open(ref->path.c_str(), (kind == SharedFile::kArena ? O_RDONLY : O_RDWR) |
                                                O_CLOEXEC | O_NOFOLLOW));
  }
  if (!ref->fd.valid()) {
    SendError(fd, ErrnoToStatus(errno, "open the shared file"));
    return;
  }
  const int file = ref->fd.get();
  const std::string reply = absl::StrCat("ok ", ref->size_bytes, "\n");
  iovec iov{const_cast<char*>(reply.data()), reply.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &file, sizeof(int));
  if (::sendmsg(fd, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(reply.size())) ++served_;
}

}  // namespace kvtier::daemon
