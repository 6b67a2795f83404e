// Server: owns the gRPC server, its listeners and the services.
//
//   auto server = Server::Start(config);   // listening when this returns
//   ...
//   server->Shutdown();                    // drains, then stops
//
// Thread safety: Start and Shutdown are called from one thread (main);
// accessors are safe from any thread.
#ifndef KVTIER_DAEMON_SERVER_H_
#define KVTIER_DAEMON_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/config.h"
#include "daemon/metrics/http_listener.h"
#include "daemon/net/connection_gate.h"
#include "daemon/net/tcp_front.h"
#include "daemon/net/unix_acceptor.h"
#include "daemon/runtime.h"
#include "storage/env/env.h"

namespace kvtier::daemon {

class AdminService;
class HealthBoard;
class HealthService;
class PeerServer;
class ReflectionService;
class KvTierService;

class Server {
 public:
  // Creates data_dir, removes a stale socket file (refuses with
  // FAILED_PRECONDITION when another process still answers on it), listens
  // on the Unix socket (mode server.socket_mode; the daemon accepts its
  // connections itself, under the connection caps of daemon/net/) and, when
  // configured, on TCP; health reports SERVING once this returns OK.
  // `env` is the block store's Env (nullptr: Env::Default()); tests pass a
  // FaultInjectionEnv to make disk I/O fail or wait. It must outlive the
  // server.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const Config& config, Env* env = nullptr);

  ~Server();  // Shutdown() if not done yet.

  // Health goes NOT_SERVING, new calls are refused, in-flight calls get
  // server.shutdown_grace_ms to finish and are then cancelled; the socket
  // file is removed. Idempotent.
  void Shutdown();

  const std::string& socket_path() const { return socket_path_; }
  int tcp_port() const { return tcp_port_; }  // 0 when TCP is off
  // The tokenless socket of local users (auth.peer_socket_path); null when off.
  PeerServer* peer_server() { return peer_server_.get(); }
  // The metrics endpoint's port; 0 when metrics.listen_address is unset.
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  Runtime* runtime() { return runtime_.get(); }
  // The connection caps every Unix socket shares, and the main socket's
  // accept loop.
  const ConnectionGate& connections() const { return *gate_; }
  UnixAcceptorStats acceptor_stats() const { return acceptor_->stats(); }
  // The TCP listener (tcp_front.h); null when TCP is off.
  const TcpFront* tcp_front() const { return tcp_front_.get(); }
  HealthBoard* health() { return health_.get(); }

 private:
  Server() = default;
  absl::Status StartGrpc(const Config& config);
  absl::Status StartListeners(const Config& config);

  std::unique_ptr<Runtime> runtime_;
  std::unique_ptr<KvTierService> kvtier_service_;
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<HealthBoard> health_;  // outlives every server's HealthService
  std::unique_ptr<HealthService> health_service_;
  std::unique_ptr<ReflectionService> reflection_service_;  // server.reflection
  std::unique_ptr<ConnectionGate> gate_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<UnixAcceptor> acceptor_;   // hands connections to grpc_server_
  std::unique_ptr<PeerServer> peer_server_;  // auth.peer_socket_path; before the runtime goes
  std::unique_ptr<TcpFront> tcp_front_;      // relays TCP to grpc_server_'s private socket
  std::string tcp_upstream_path_;            // that socket; "" when TCP is off
  std::unique_ptr<metrics::HttpListener> metrics_;  // stops before runtime_ goes
  std::string socket_path_;
  int tcp_port_ = 0;           // the TCP front's
  int tcp_upstream_port_ = 0;  // gRPC's on tcp_upstream_path_: non-zero once bound
  uint64_t shutdown_grace_ms_ = 0;
  bool shut_down_ = false;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_SERVER_H_
