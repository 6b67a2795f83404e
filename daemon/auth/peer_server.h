// PeerServer: auth.peer_socket_path, the gRPC socket where a local engine
// needs no token. It accepts each connection itself (daemon/net/
// unix_acceptor.h: first bytes within server.connection_setup_ms, the
// per-uid and total connection caps), reads the peer's uid from the kernel
// (SO_PEERCRED) and closes the connection unless a tenant lists that uid
// (`uids` in the tenants file). An accepted connection is
// handed (grpc::AddInsecureChannelFromFd) to a gRPC server of its own uid,
// one per uid and created on first use, whose interceptor sets the call
// metadata `kvtier-peer-uid` (kPeerUidKey) to that uid, replacing whatever
// the client sent; CallerOf (daemon/tenant.h) maps it to the tenant at
// every call, so a reload that takes the uid away refuses the next call
// and cancels the open streams. The binding is by server, never by
// descriptor number, so a reused descriptor cannot carry one user's
// calls under another's uid.
//
// Thread safety: Start and Shutdown from one thread; the accept loop runs
// on a thread of its own; stats() from any thread.
#ifndef KVTIER_DAEMON_AUTH_PEER_SERVER_H_
#define KVTIER_DAEMON_AUTH_PEER_SERVER_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/service_type.h>
#include <grpcpp/support/server_interceptor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/auth/tenants.h"
#include "daemon/net/unix_acceptor.h"

namespace kvtier::daemon {

struct PeerServerOptions {
  std::string path;                         // the socket file (mode 0666)
  const TenantRegistry* tenants = nullptr;  // must outlive the server
  ConnectionGate* gate = nullptr;           // shared with the main socket; outlives the server
  std::chrono::milliseconds setup_timeout{2000};
  size_t max_pending = 256;
  // The services of one per-uid server (fresh instances: a service is
  // registered with one server only) and the builder settings they share
  // with the main server (message sizes, channel arguments).
  std::function<std::vector<std::unique_ptr<grpc::Service>>()> make_services;
  std::function<void(grpc::ServerBuilder&)> configure;
  // Interceptors besides the peer-uid one (e.g. metrics); may be empty.
  std::function<
      std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>()>
      make_interceptors;
};

struct PeerServerStats {
  uint64_t accepted = 0;  // connections handed to a per-uid server
  uint64_t refused = 0;   // connections of a uid no tenant lists
  uint64_t servers = 0;   // per-uid servers running
  UnixAcceptorStats acceptor;
};

class PeerServer {
 public:
  static absl::StatusOr<std::unique_ptr<PeerServer>> Start(PeerServerOptions options);
  ~PeerServer();  // Shutdown(now) if not done yet

  // Stops accepting, then shuts every per-uid server down (calls in flight
  // get until `deadline`, then are cancelled) and removes the socket file.
  // Idempotent.
  void Shutdown(std::chrono::system_clock::time_point deadline);

  const std::string& path() const { return options_.path; }
  PeerServerStats stats() const;

 private:
  struct UidServer {
    std::vector<std::unique_ptr<grpc::Service>> services;
    std::unique_ptr<grpc::Server> server;
  };
  explicit PeerServer(PeerServerOptions options) : options_(std::move(options)) {}
  bool Allowed(uint32_t uid);
  void Serve(int fd, uint32_t uid);
  grpc::Server* ServerOf(uint32_t uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PeerServerOptions options_;
  std::unique_ptr<UnixAcceptor> acceptor_;
  mutable absl::Mutex mu_;
  std::map<uint32_t, UidServer> servers_ ABSL_GUARDED_BY(mu_);
  uint64_t accepted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ = false;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_AUTH_PEER_SERVER_H_
