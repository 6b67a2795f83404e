#include "daemon/net/tcp_front.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <deque>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "daemon/net/unix_acceptor.h"
#include "storage/common/errno_status.h"
#include "storage/common/locked_stats.h"

namespace kvtier::daemon {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kAcceptBatch = 64;                        // connections taken per wake-up
constexpr size_t kPumpBudget = 16 * kRelayBufferBytes;  // per direction and turn
constexpr std::chrono::milliseconds kMaxWait(1000);

// The peer's address without its port: one key for every connection from
// one host (an IPv4-mapped IPv6 address is its IPv4 address).
std::string AddressKey(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(ss);
    return std::string(reinterpret_cast<const char*>(&in.sin_addr), sizeof(in.sin_addr));
  }
  if (ss.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(ss);
    const auto* b = reinterpret_cast<const char*>(&in6.sin6_addr);
    if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) return std::string(b + 12, 4);
    return std::string(b, sizeof(in6.sin6_addr));
  }
  return std::string();
}

}  // namespace

absl::StatusOr<OwnedFd> ListenTcp(const std::string& key, const std::string& address) {
  std::string host;
  std::string port;
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find("]:");
    if (close == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("key '", key, "': '", address, "' is not [V6]:PORT"));
    }
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("key '", key, "': '", address, "' is not HOST:PORT"));
    }
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("key '", key, "': '", address, "': ", ::gai_strerror(rc)));
  }
  // ":PORT" resolves to the IPv4 and IPv6 wildcards; the IPv6 one (dual
  // stack) is preferred when the host has IPv6.
  std::vector<addrinfo*> order;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (host.empty() && a->ai_family == AF_INET6)
      order.insert(order.begin(), a);
    else
      order.push_back(a);
  }
  absl::Status last = absl::UnavailableError(absl::StrCat("key '", key, "': no address"));
  OwnedFd bound;
  for (addrinfo* a : order) {
    OwnedFd fd(::socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid()) {
      last = ErrnoToStatus(errno, absl::StrCat("key '", key, "': socket"));
      continue;
    }
    const int on = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (a->ai_family == AF_INET6) {
      const int off = 0;
      ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
    }
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), SOMAXCONN) != 0) {
      last = ErrnoToStatus(errno, absl::StrCat("key '", key, "': cannot listen on ", address));
      continue;
    }
    bound = std::move(fd);
    break;
  }
  ::freeaddrinfo(found);
  if (!bound.valid()) return last;
  return bound;
}

int BoundPort(int listen_fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(ss).sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(ss).sin6_port);
  return 0;
}

// Everything the loop thread owns. Only stats_ is read by other threads.
class TcpFront::Loop {
 public:
  explicit Loop(TcpFrontOptions options) : options_(std::move(options)) {}

  absl::Status Init();
  void Run();
  // From any thread: what the loop does at its next wake-up.
  void Wake(bool stop) {
    (stop ? stop_ : stop_accepting_).store(true, std::memory_order_release);
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
  }
  TcpFrontStats stats() const;

 private:
  enum Kind : uint64_t { kListen = 1, kWake = 2, kPending = 3, kClient = 4, kUpstream = 5 };
  static uint64_t Tag(Kind kind, uint64_t id) { return (uint64_t{kind} << 56) | id; }

  struct Pending {
    OwnedFd fd;
    std::string address;
    Clock::time_point deadline;
  };
  // One direction of a relay: bytes read from one side, not yet written
  // to the other.
  struct Flow {
    std::unique_ptr<char[]> buf = std::make_unique<char[]>(kRelayBufferBytes);
    size_t off = 0;
    size_t len = 0;
    bool eof = false;   // its source closed (or shut down) its side
    bool shut = false;  // and its destination was told (SHUT_WR)
  };
  enum class Moved { kBlocked, kMore, kBroken };
  struct Pair {
    OwnedFd client;
    OwnedFd upstream;
    std::string address;
    Flow up;    // client -> upstream
    Flow down;  // upstream -> client
  };

  void AcceptBatch(Clock::time_point now);
  void OnPendingReadable(uint64_t id);
  void Relay(uint64_t id, Pending pending);
  void Pump(uint64_t id);
  static Moved Move(int from, int to, Flow* f);
  void ExpirePending(Clock::time_point now);
  void ClosePending(uint64_t id);
  void ClosePair(uint64_t id);
  void Release(const std::string& address);
  void SetListening(bool on);
  void CloseAll();
  void CloseListener();  // and the pending connections
  void UpdateOpen() { stats_.Set(&TcpFrontStats::open, pending_.size() + pairs_.size()); }

  TcpFrontOptions options_;
  OwnedFd epoll_fd_;
  OwnedFd wake_fd_;
  OwnedFd spare_fd_;
  uint64_t next_id_ = 1;
  absl::flat_hash_map<uint64_t, Pending> pending_;
  std::deque<uint64_t> pending_order_;  // oldest first; may name closed ones
  absl::flat_hash_map<uint64_t, std::unique_ptr<Pair>> pairs_;
  absl::flat_hash_map<std::string, uint64_t> per_address_;  // pending + relayed
  std::vector<uint64_t> ready_;  // pairs with bytes left after their turn
  Clock::time_point backoff_until_{};
  bool listening_ = true;
  std::atomic<bool> stop_accepting_{false};
  std::atomic<bool> stop_{false};

  LockedStats<TcpFrontStats> stats_;
};

absl::Status TcpFront::Loop::Init() {
  epoll_fd_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd_.valid()) return ErrnoToStatus(errno, "tcp front: epoll_create1");
  wake_fd_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_.valid()) return ErrnoToStatus(errno, "tcp front: eventfd");
  spare_fd_.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = Tag(kWake, 0);
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, wake_fd_.get(), &ev) != 0) {
    return ErrnoToStatus(errno, "tcp front: epoll_ctl");
  }
  ev.data.u64 = Tag(kListen, 0);
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, options_.listen_fd.get(), &ev) != 0) {
    return ErrnoToStatus(errno, "tcp front: epoll_ctl");
  }
  return absl::OkStatus();
}

void TcpFront::Loop::Run() {
  std::array<epoll_event, 64> events;
  for (;;) {
    Clock::time_point now = Clock::now();
    auto wait = kMaxWait;
    if (!listening_)
      wait = std::min(wait, std::chrono::ceil<std::chrono::milliseconds>(backoff_until_ - now));
    if (!pending_order_.empty()) {
      auto it = pending_.find(pending_order_.front());
      if (it != pending_.end()) {
        wait =
            std::min(wait, std::chrono::ceil<std::chrono::milliseconds>(it->second.deadline - now));
      }
    }
    if (!ready_.empty()) wait = std::chrono::milliseconds(0);
    const int n = ::epoll_wait(epoll_fd_.get(), events.data(), static_cast<int>(events.size()),
                               static_cast<int>(std::max<int64_t>(wait.count(), 0)));
    if (n < 0 && errno != EINTR) {
      spdlog::error("tcp front: epoll_wait: {}", std::strerror(errno));
      return;
    }
    now = Clock::now();
    std::vector<uint64_t> again;
    again.swap(ready_);
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      const uint64_t id = tag & ((uint64_t{1} << 56) - 1);
      switch (static_cast<Kind>(tag >> 56)) {
        case kWake: {
          uint64_t count = 0;
          [[maybe_unused]] ssize_t r = ::read(wake_fd_.get(), &count, sizeof(count));
          if (stop_.load(std::memory_order_acquire)) {
            CloseAll();
            return;
          }
          if (stop_accepting_.load(std::memory_order_acquire)) CloseListener();
          break;
        }
        case kListen:
          AcceptBatch(now);
          break;
        case kPending:
          OnPendingReadable(id);
          break;
        case kClient:
        case kUpstream:
          Pump(id);
          break;
      }
    }
    for (uint64_t id : again) Pump(id);
    ExpirePending(now);
    if (!listening_ && now >= backoff_until_ && options_.listen_fd.valid()) SetListening(true);
  }
}

void TcpFront::Loop::CloseAll() {
  CloseListener();
  pairs_.clear();
  per_address_.clear();
  ready_.clear();
  UpdateOpen();
}

void TcpFront::Loop::CloseListener() {
  options_.listen_fd.Reset();
  listening_ = true;  // nothing to re-enable
  while (!pending_.empty()) ClosePending(pending_.begin()->first);
  pending_order_.clear();
}

void TcpFront::Loop::SetListening(bool on) {
  epoll_event ev{};
  ev.events = on ? EPOLLIN : 0;
  ev.data.u64 = Tag(kListen, 0);
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, options_.listen_fd.get(), &ev);
  listening_ = on;
}

void TcpFront::Loop::AcceptBatch(Clock::time_point now) {
  for (int i = 0; i < kAcceptBatch; ++i) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    const int fd = ::accept4(options_.listen_fd.get(), reinterpret_cast<sockaddr*>(&ss), &len,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const AfterAcceptError next =
          HandleAcceptError(errno, {options_.listen_fd.get(), &spare_fd_,
                                    [this] { return stats_.Add(&TcpFrontStats::fd_exhausted); },
                                    "tcp", "server.max_tcp_connections"});
      if (next == AfterAcceptError::kRetry) continue;
      if (next == AfterAcceptError::kBackOff) {
        backoff_until_ = now + kEmfileBackoff;
        SetListening(false);
      }
      return;
    }
    OwnedFd conn(fd);
    stats_.Add(&TcpFrontStats::accepted);
    std::string address = AddressKey(ss);
    auto count = per_address_.find(address);
    const uint64_t of_address = count == per_address_.end() ? 0 : count->second;
    if (of_address >= options_.max_per_address ||
        pending_.size() + pairs_.size() >= options_.max_total) {
      stats_.Add(&TcpFrontStats::refused_cap);
      continue;  // conn closes
    }
    while (pending_.size() >= options_.max_pending && !pending_order_.empty()) {
      const uint64_t oldest = pending_order_.front();
      pending_order_.pop_front();
      if (pending_.contains(oldest)) {
        stats_.Add(&TcpFrontStats::evicted);
        ClosePending(oldest);
      }
    }
    const uint64_t id = next_id_++;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = Tag(kPending, id);
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, conn.get(), &ev) != 0) continue;
    ++per_address_[address];
    pending_.emplace(id,
                     Pending{std::move(conn), std::move(address), now + options_.setup_timeout});
    pending_order_.push_back(id);
    UpdateOpen();
  }
}

void TcpFront::Loop::OnPendingReadable(uint64_t id) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  char byte;
  const ssize_t n = ::recv(it->second.fd.get(), &byte, 1, MSG_PEEK);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0) {  // the client left before sending anything
    ClosePending(id);
    return;
  }
  Pending p = std::move(it->second);
  pending_.erase(it);
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, p.fd.get(), nullptr);
  Relay(id, std::move(p));
}

void TcpFront::Loop::Relay(uint64_t id, Pending pending) {
  auto pair = std::make_unique<Pair>();
  pair->client = std::move(pending.fd);
  // As gRPC sets on its own sockets: without it Nagle's algorithm holds the
  // relay's small writes for the client's delayed ACK (~40 ms stalls).
  const int on = 1;
  ::setsockopt(pair->client.get(), IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
  pair->address = std::move(pending.address);
  pair->upstream.Reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, options_.upstream_path.data(), options_.upstream_path.size());
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  bool ok = pair->upstream.valid() &&
            ::connect(pair->upstream.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  if (ok) {
    ev.data.u64 = Tag(kClient, id);
    ok = ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, pair->client.get(), &ev) == 0;
  }
  if (ok) {
    ev.data.u64 = Tag(kUpstream, id);
    ok = ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, pair->upstream.get(), &ev) == 0;
  }
  if (!ok) {
    const uint64_t k = stats_.Add(&TcpFrontStats::upstream_failed);
    if (k == 1 || k % 1000 == 0) {
      spdlog::warn("tcp: cannot reach gRPC's listener at {}: {} ({} times so far)",
                   options_.upstream_path, std::strerror(errno), k);
    }
    Release(pair->address);
    UpdateOpen();
    return;  // both descriptors close (and leave the epoll set)
  }
  stats_.Add(&TcpFrontStats::relayed);
  pairs_.emplace(id, std::move(pair));
  UpdateOpen();
  Pump(id);
}

TcpFront::Loop::Moved TcpFront::Loop::Move(int from, int to, Flow* f) {
  size_t moved = 0;
  for (;;) {
    if (f->len > 0) {
      const ssize_t n = ::send(to, f->buf.get() + f->off, f->len, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK ? Moved::kBlocked : Moved::kBroken;
      }
      f->off += static_cast<size_t>(n);
      f->len -= static_cast<size_t>(n);
      moved += static_cast<size_t>(n);
      continue;
    }
    if (f->eof) {
      if (!f->shut) {
        ::shutdown(to, SHUT_WR);
        f->shut = true;
      }
      return Moved::kBlocked;
    }
    if (moved >= kPumpBudget) return Moved::kMore;  // the other relays get their turn
    const ssize_t n = ::recv(from, f->buf.get(), kRelayBufferBytes, 0);
    if (n > 0) {
      f->off = 0;
      f->len = static_cast<size_t>(n);
    } else if (n == 0) {
      f->eof = true;
    } else if (errno != EINTR) {
      return errno == EAGAIN || errno == EWOULDBLOCK ? Moved::kBlocked : Moved::kBroken;
    }
  }
}

void TcpFront::Loop::Pump(uint64_t id) {
  auto it = pairs_.find(id);
  if (it == pairs_.end()) return;
  Pair& p = *it->second;
  const Moved up = Move(p.client.get(), p.upstream.get(), &p.up);
  const Moved down = Move(p.upstream.get(), p.client.get(), &p.down);
  // gRPC closing its side (handshake deadline, idle timeout, shutdown) ends
  // the connection once its last bytes reached the client.
  if (up == Moved::kBroken || down == Moved::kBroken || p.down.shut) {
    ClosePair(id);
    return;
  }
  if (up == Moved::kMore || down == Moved::kMore) ready_.push_back(id);
}

void TcpFront::Loop::ExpirePending(Clock::time_point now) {
  while (!pending_order_.empty()) {
    auto it = pending_.find(pending_order_.front());
    if (it != pending_.end()) {
      if (it->second.deadline > now) return;
      stats_.Add(&TcpFrontStats::setup_timeouts);
      ClosePending(it->first);
    }
    pending_order_.pop_front();
  }
}

void TcpFront::Loop::ClosePending(uint64_t id) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  Release(it->second.address);
  pending_.erase(it);  // the descriptor closes and leaves the epoll set
  UpdateOpen();
}

void TcpFront::Loop::ClosePair(uint64_t id) {
  auto it = pairs_.find(id);
  if (it == pairs_.end()) return;
  Release(it->second->address);
  pairs_.erase(it);
  UpdateOpen();
}

void TcpFront::Loop::Release(const std::string& address) {
  auto it = per_address_.find(address);
  if (it == per_address_.end()) return;
  if (--it->second == 0) per_address_.erase(it);
}

TcpFrontStats TcpFront::Loop::stats() const { return stats_.Get(); }

absl::StatusOr<std::unique_ptr<TcpFront>> TcpFront::Start(TcpFrontOptions options) {
  if (!options.listen_fd.valid()) return absl::InvalidArgumentError("tcp front: no listen_fd");
  if (options.upstream_path.empty() ||
      options.upstream_path.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("tcp front: upstream path '",
                                                   options.upstream_path,
                                                   "' is empty or longer than 107 bytes"));
  }
  auto loop = std::make_unique<Loop>(std::move(options));
  if (absl::Status st = loop->Init(); !st.ok()) return st;
  std::unique_ptr<TcpFront> front(new TcpFront(std::move(loop)));
  front->thread_ = std::thread([l = front->loop_.get()] { l->Run(); });
  return front;
}

TcpFront::TcpFront(std::unique_ptr<Loop> loop) : loop_(std::move(loop)) {}

TcpFront::~TcpFront() { Stop(); }

void TcpFront::StopAccepting() {
  if (!stopped_) loop_->Wake(/*stop=*/false);
}

void TcpFront::Stop() {
  if (stopped_) return;
  stopped_ = true;
  loop_->Wake(/*stop=*/true);
  // The loop closes the listener and every pending and relayed connection
  // before it returns.
  if (thread_.joinable()) thread_.join();
}

TcpFrontStats TcpFront::stats() const { return loop_->stats(); }

}  // namespace kvtier::daemon
