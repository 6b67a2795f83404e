#include "daemon/auth/peer_server.h"

#include <grpcpp/server_posix.h>
#include <grpcpp/support/server_interceptor.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/tenant.h"
#include "storage/common/errno_status.h"

namespace kvtier::daemon {
namespace {

// Sets kvtier-peer-uid on every call of its server, replacing any value
// the client sent.
class PeerUidInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit PeerUidInterceptor(const std::string* uid) : uid_(uid) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      std::multimap<grpc::string_ref, grpc::string_ref>* md = methods->GetRecvInitialMetadata();
      md->erase(grpc::string_ref(kPeerUidKey));
      md->emplace(grpc::string_ref(kPeerUidKey), grpc::string_ref(*uid_));
    }
    methods->Proceed();
  }

 private:
  const std::string* const uid_;  // the factory's, which the server owns
};

class PeerUidInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit PeerUidInterceptorFactory(uint32_t uid) : uid_(std::to_string(uid)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* /*info*/) override {
    return new PeerUidInterceptor(&uid_);
  }

 private:
  const std::string uid_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PeerServer>> PeerServer::Start(PeerServerOptions options) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (options.path.empty() || options.path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("auth.peer_socket_path: ", options.path,
                                                   " is empty or longer than 107 bytes"));
  }
  std::memcpy(addr.sun_path, options.path.data(), options.path.size());
  struct stat st;
  if (::lstat(options.path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("auth.peer_socket_path: ", options.path, " exists and is not a socket"));
    }
    ::unlink(options.path.c_str());
  }
  std::unique_ptr<PeerServer> server(new PeerServer(std::move(options)));
  const std::string& path = server->options_.path;
  server->listen_fd_ = OwnedFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!server->listen_fd_.valid()) return ErrnoToStatus(errno, "socket");
  // Any local user may connect: the uid the kernel reports decides.
  const mode_t old = ::umask(0);
  const int rc = ::bind(server->listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int bind_errno = errno;
  ::umask(old);
  if (rc != 0) return ErrnoToStatus(bind_errno, "bind " + path);
  if (::listen(server->listen_fd_.get(), 128) != 0) {
    absl::Status s = ErrnoToStatus(errno, "listen " + path);
    ::unlink(path.c_str());
    return s;
  }
  server->stop_fd_ = OwnedFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!server->stop_fd_.valid()) {
    absl::Status s = ErrnoToStatus(errno, "eventfd");
    ::unlink(path.c_str());
    return s;
  }
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

PeerServer::~PeerServer() { Shutdown(std::chrono::system_clock::now()); }

void PeerServer::AcceptLoop() {
  pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}};
  for (;;) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("peer socket: poll: {}", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    // gRPC polls the descriptor: it must not block.
    const int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        spdlog::warn("peer socket: accept: {}", std::strerror(errno));
      }
      continue;
    }
    Serve(fd);
  }
}

void PeerServer::Serve(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof(cred)) {
    ::close(fd);
    return;
  }
  absl::MutexLock lock(&mu_);
  if (options_.tenants->ByUid(cred.uid) == nullptr) {
    ++refused_;
    ::close(fd);  // no tenant lists this uid
    return;
  }
  grpc::Server* server = ServerOf(cred.uid);
  if (server == nullptr) {
    ::close(fd);
    return;
  }
  ++accepted_;
  grpc::AddInsecureChannelFromFd(server, fd);  // gRPC owns fd from here
}

grpc::Server* PeerServer::ServerOf(uint32_t uid) {
  auto it = servers_.find(uid);
  if (it != servers_.end()) return it->second.server.get();
  UidServer entry;
  entry.services = options_.make_services();
  grpc::ServerBuilder builder;
  options_.configure(builder);
  for (const auto& service : entry.services) builder.RegisterService(service.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  // First: the uid is in place before any other interceptor reads it.
  creators.push_back(std::make_unique<PeerUidInterceptorFactory>(uid));
  if (options_.make_interceptors) {
    for (auto& c : options_.make_interceptors()) creators.push_back(std::move(c));
  }
  builder.experimental().SetInterceptorCreators(std::move(creators));
  entry.server = builder.BuildAndStart();
  if (entry.server == nullptr) {
    spdlog::error("peer socket: cannot start the server of uid {}", uid);
    return nullptr;
  }
  grpc::Server* server = entry.server.get();
  servers_.emplace(uid, std::move(entry));
  return server;
}

void PeerServer::Shutdown(std::chrono::system_clock::time_point deadline) {
  if (shut_down_) return;
  shut_down_ = true;
  if (accept_thread_.joinable()) {
    uint64_t one = 1;
    (void)!::write(stop_fd_.get(), &one, sizeof(one));
    accept_thread_.join();
  }
  ::unlink(options_.path.c_str());
  absl::MutexLock lock(&mu_);
  for (auto& [uid, entry] : servers_) entry.server->Shutdown(deadline);
  for (auto& [uid, entry] : servers_) entry.server->Wait();
  servers_.clear();
}

PeerServerStats PeerServer::stats() const {
  absl::MutexLock lock(&mu_);
  return PeerServerStats{accepted_, refused_, servers_.size()};
}

}  // namespace kvtier::daemon
