#include "daemon/net/unix_acceptor.h"

#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "storage/common/errno_status.h"

namespace kvtier::daemon {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kAcceptBatch = 64;  // connections taken per wake-up
constexpr std::chrono::seconds kSweepInterval(1);
constexpr std::chrono::seconds kLogInterval(10);

int MillisUntil(Clock::time_point t, Clock::time_point now) {
  if (t <= now) return 0;
  return static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(t - now).count()) +
         1;
}

}  // namespace

bool ShedIfExhausted(int err, int listen_fd, OwnedFd* spare) {
  if (err != EMFILE && err != ENFILE && err != ENOBUFS && err != ENOMEM) return false;
  spare->Reset();
  const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd >= 0) ::close(fd);
  spare->Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  return true;
}

AfterAcceptError HandleAcceptError(int err, const AcceptLoopRef& loop) {
  if (err == EINTR || err == ECONNABORTED || err == EPROTO) return AfterAcceptError::kRetry;
  if (ShedIfExhausted(err, loop.listen_fd, loop.spare)) {
    const uint64_t n = loop.count_exhausted();
    if (n == 1 || n % 1000 == 0) {
      spdlog::warn(
          "{}: accept: {} ({} times so far); shed one connection, retrying in {} ms (see {})",
          loop.name, std::strerror(err), n, kEmfileBackoff.count(), loop.limit_key);
    }
    return AfterAcceptError::kBackOff;
  }
  if (err != EAGAIN && err != EWOULDBLOCK) {
    spdlog::warn("{}: accept: {}", loop.name, std::strerror(err));
  }
  return AfterAcceptError::kDone;
}

absl::StatusOr<OwnedFd> ListenUnix(const std::string& key, const std::string& path, mode_t mode) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": ", path, " is empty or longer than 107 bytes"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  OwnedFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat(key, ": socket"));
  // bind() creates the file with 0777 & ~umask: it never exists with wider
  // permissions than `mode`, not even before a chmod.
  const mode_t old = ::umask(static_cast<mode_t>(~mode & 0777));
  const int rc = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int bind_errno = errno;
  ::umask(old);
  if (rc != 0) return ErrnoToStatus(bind_errno, absl::StrCat(key, ": bind ", path));
  if (::listen(fd.get(), SOMAXCONN) != 0) {
    absl::Status s = ErrnoToStatus(errno, absl::StrCat(key, ": listen ", path));
    ::unlink(path.c_str());
    return s;
  }
  return fd;
}

absl::StatusOr<std::unique_ptr<UnixAcceptor>> UnixAcceptor::Start(UnixAcceptorOptions options) {
  if (options.gate == nullptr || !options.hand_off || !options.listen_fd.valid() ||
      options.max_pending == 0) {
    return absl::InvalidArgumentError("UnixAcceptor: gate, hand_off, listen_fd and max_pending");
  }
  std::unique_ptr<UnixAcceptor> acceptor(new UnixAcceptor(std::move(options)));
  acceptor->wake_fd_ = OwnedFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!acceptor->wake_fd_.valid()) return ErrnoToStatus(errno, "eventfd");
  acceptor->spare_fd_ = OwnedFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!acceptor->spare_fd_.valid()) return ErrnoToStatus(errno, "open /dev/null");
  acceptor->pending_.reserve(acceptor->options_.max_pending);
  acceptor->thread_ = std::thread([a = acceptor.get()] { a->Loop(); });
  return acceptor;
}

UnixAcceptor::~UnixAcceptor() { Stop(); }

void UnixAcceptor::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (thread_.joinable()) {
    uint64_t one = 1;
    (void)!::write(wake_fd_.get(), &one, sizeof(one));
    thread_.join();
  }
  for (const Pending& c : pending_) ::close(c.fd);
  pending_.clear();
  options_.listen_fd.Reset();
}

void UnixAcceptor::Loop() {
  std::vector<pollfd> fds;
  std::vector<bool> done;
  Clock::time_point last_sweep = Clock::now();
  for (;;) {
    Clock::time_point now = Clock::now();
    // Connections that sent nothing in time go (the oldest expire first).
    // Counted before the close: whoever sees the close sees the count.
    while (!pending_.empty() && pending_.front().deadline <= now) {
      stats_.Add(&UnixAcceptorStats::setup_timeouts);
      ::close(pending_.front().fd);
      pending_.erase(pending_.begin());
    }
    int timeout_ms = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(kSweepInterval).count());
    if (!pending_.empty())
      timeout_ms = std::min(timeout_ms, MillisUntil(pending_.front().deadline, now));
    const bool backing_off = now < backoff_until_;
    if (backing_off) timeout_ms = std::min(timeout_ms, MillisUntil(backoff_until_, now));
    fds.clear();
    fds.push_back({wake_fd_.get(), POLLIN, 0});
    // A negative descriptor is skipped by poll: no accepting while backing off.
    fds.push_back({backing_off ? -1 : options_.listen_fd.get(), POLLIN, 0});
    for (const Pending& c : pending_) fds.push_back({c.fd, POLLIN, 0});
    const int r = ::poll(fds.data(), fds.size(), timeout_ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      spdlog::warn("{}: poll: {}", options_.name, std::strerror(errno));
      backoff_until_ = Clock::now() + kEmfileBackoff;
      continue;
    }
    if (fds[0].revents != 0) return;
    now = Clock::now();
    done.assign(pending_.size(), false);
    for (size_t i = 0; i < pending_.size(); ++i) {
      if (fds[i + 2].revents != 0) done[i] = OnReadable(pending_[i]);
    }
    size_t kept = 0;
    for (size_t i = 0; i < pending_.size(); ++i) {
      if (!done[i]) pending_[kept++] = pending_[i];
    }
    pending_.resize(kept);
    if (fds[1].revents != 0) AcceptBatch(now);
    if (now - last_sweep >= kSweepInterval) {
      options_.gate->Sweep();
      last_sweep = now;
    }
  }
}

void UnixAcceptor::AcceptBatch(Clock::time_point now) {
  for (int taken = 0; taken < kAcceptBatch; ++taken) {
    // gRPC polls the descriptor itself: it must not block.
    const int fd =
        ::accept4(options_.listen_fd.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      const AfterAcceptError next =
          HandleAcceptError(errno, {options_.listen_fd.get(), &spare_fd_,
                                    [this] { return stats_.Add(&UnixAcceptorStats::fd_exhausted); },
                                    options_.name, "server.max_connections"});
      if (next == AfterAcceptError::kRetry) continue;
      if (next == AfterAcceptError::kBackOff) backoff_until_ = now + kEmfileBackoff;
      return;
    }
    stats_.Add(&UnixAcceptorStats::accepted);
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof(cred)) {
      ::close(fd);
      continue;
    }
    if (options_.allow_uid && !options_.allow_uid(cred.uid)) {
      stats_.Add(&UnixAcceptorStats::refused_uid);
      ::close(fd);
      continue;
    }
    if (pending_.size() >= options_.max_pending) {
      // The oldest has used most of its time without a byte; a client's
      // first bytes arrive with its connection.
      stats_.Add(&UnixAcceptorStats::evicted);
      ::close(pending_.front().fd);
      pending_.erase(pending_.begin());
    }
    pending_.push_back({fd, cred.uid, now + options_.setup_timeout});
  }
}

bool UnixAcceptor::OnReadable(const Pending& c) {
  char byte;
  const ssize_t n = ::recv(c.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
  if (n <= 0) {  // closed by the client, or an error
    ::close(c.fd);
    return true;
  }
  if (!options_.gate->Admit(c.fd, c.uid)) {
    const uint64_t n_refused = stats_.Add(&UnixAcceptorStats::refused_cap);
    if (n_refused == 1 || n_refused % 1000 == 0) {
      spdlog::warn(
          "{}: connection of uid {} refused: {} open for that uid (cap {}), {} in all "
          "(cap {}); {} refused so far",
          options_.name, c.uid, options_.gate->OpenOf(c.uid), options_.gate->limits().max_per_uid,
          options_.gate->stats().open, options_.gate->limits().max_total, n_refused);
    }
    ::close(c.fd);
    return true;
  }
  stats_.Add(&UnixAcceptorStats::handed_off);
  options_.hand_off(c.fd, c.uid);
  return true;
}

UnixAcceptorStats UnixAcceptor::stats() const { return stats_.Get(); }

}  // namespace kvtier::daemon
