#include "daemon/auth/peer_server.h"

#include <grpcpp/server_posix.h>
#include <grpcpp/support/server_interceptor.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/tenant.h"
#include "storage/common/status_macros.h"

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
  struct stat st;
  if (::lstat(options.path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("auth.peer_socket_path: ", options.path, " exists and is not a socket"));
    }
    ::unlink(options.path.c_str());
  }
  if (options.gate == nullptr) return absl::InvalidArgumentError("PeerServer: no gate");
  std::unique_ptr<PeerServer> server(new PeerServer(std::move(options)));
  // Any local user may connect: the uid the kernel reports decides.
  KVTIER_ASSIGN_OR_RETURN(OwnedFd listen_fd,
                          ListenUnix("auth.peer_socket_path", server->options_.path, 0666));
  UnixAcceptorOptions accept;
  accept.name = "peer socket";
  accept.listen_fd = std::move(listen_fd);
  accept.gate = server->options_.gate;
  accept.setup_timeout = server->options_.setup_timeout;
  accept.max_pending = server->options_.max_pending;
  PeerServer* s = server.get();
  accept.allow_uid = [s](uint32_t uid) { return s->Allowed(uid); };
  accept.hand_off = [s](int fd, uint32_t uid) { s->Serve(fd, uid); };
  absl::StatusOr<std::unique_ptr<UnixAcceptor>> acceptor = UnixAcceptor::Start(std::move(accept));
  if (!acceptor.ok()) {
    ::unlink(server->options_.path.c_str());
    return acceptor.status();
  }
  server->acceptor_ = std::move(*acceptor);
  return server;
}

PeerServer::~PeerServer() { Shutdown(std::chrono::system_clock::now()); }

bool PeerServer::Allowed(uint32_t uid) {
  if (options_.tenants->ByUid(uid) != nullptr) return true;
  absl::MutexLock lock(&mu_);
  ++refused_;  // no tenant lists this uid
  return false;
}

void PeerServer::Serve(int fd, uint32_t uid) {
  absl::MutexLock lock(&mu_);
  grpc::Server* server = ServerOf(uid);
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
  if (acceptor_ != nullptr) acceptor_->Stop();
  ::unlink(options_.path.c_str());
  absl::MutexLock lock(&mu_);
  for (auto& [uid, entry] : servers_) entry.server->Shutdown(deadline);
  for (auto& [uid, entry] : servers_) entry.server->Wait();
  servers_.clear();
}

PeerServerStats PeerServer::stats() const {
  UnixAcceptorStats acceptor = acceptor_ != nullptr ? acceptor_->stats() : UnixAcceptorStats{};
  absl::MutexLock lock(&mu_);
  return PeerServerStats{accepted_, refused_, servers_.size(), acceptor};
}

}  // namespace kvtier::daemon
