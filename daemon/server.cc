#include "daemon/server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_posix.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "daemon/admin_service.h"
#include "daemon/auth/auth_processor.h"
#include "daemon/auth/peer_server.h"
#include "daemon/health_service.h"
#include "daemon/kvtier_service.h"
#include "daemon/net/connection_metrics.h"
#include "daemon/net/fd_limit.h"
#include "daemon/net/tcp_front.h"
#include "daemon/reflection_service.h"
#include "storage/common/errno_status.h"
#include "storage/common/status_macros.h"

namespace kvtier::daemon {
namespace {

// True when some process accepts connections on the socket at path.
bool SocketAnswers(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  bool answers = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return answers;
}

absl::Status PrepareSocketPath(const std::string& path) {
  std::error_code ec;
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty() && !std::filesystem::is_directory(parent, ec)) {
    // 0750: clients in the daemon's group may reach the socket, nobody
    // else may list the folder.
    std::filesystem::create_directories(parent, ec);
    if (!ec) {
      std::filesystem::permissions(parent, std::filesystem::perms(0750),
                                   std::filesystem::perm_options::replace, ec);
    }
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create socket directory ", parent.string(), ": ", ec.message()));
    }
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return absl::OkStatus();
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("key 'server.socket_path': ", path, " exists and is not a socket"));
  }
  if (SocketAnswers(path)) {
    return absl::FailedPreconditionError(
        absl::StrCat("key 'server.socket_path': another process is listening on ", path));
  }
  if (::unlink(path.c_str()) != 0) return ErrnoToStatus(errno, "unlink stale socket " + path);
  return absl::OkStatus();
}

// The private socket gRPC's TLS listener takes when TCP is on
// (<data_dir>/private/tcp.sock): its folder is 0700, so only the daemon's
// user reaches it past the TCP front's caps. A stale socket is removed.
absl::StatusOr<std::string> PrepareTcpUpstream(const std::string& data_dir) {
  std::error_code ec;
  const std::filesystem::path dir =
      std::filesystem::absolute(data_dir, ec).lexically_normal() / "private";
  if (!ec) std::filesystem::create_directories(dir, ec);
  if (!ec) {
    std::filesystem::permissions(dir, std::filesystem::perms(0700),
                                 std::filesystem::perm_options::replace, ec);
  }
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("key 'server.data_dir': cannot create ", dir.string(), ": ", ec.message()));
  }
  const std::string path = (dir / "tcp.sock").string();
  if (path.size() > 107) {
    return absl::InvalidArgumentError(
        absl::StrCat("key 'server.data_dir': ", path,
                     " (the TCP listener's private socket) is longer than 107 bytes"));
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("key 'server.data_dir': ", path, " exists and is not a socket"));
    }
    if (::unlink(path.c_str()) != 0) return ErrnoToStatus(errno, "unlink stale socket " + path);
  }
  return path;
}

// What reflection's list_services names: the daemon's services.
std::vector<std::string> ServiceNames() {
  return {v1::KvTier::service_full_name(), v1::Admin::service_full_name(),
          grpc::health::v1::Health::service_full_name()};
}

absl::StatusOr<std::string> ReadPem(const std::string& key, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("key '", key, "': cannot read ", path));
  std::stringstream buf;
  buf << in.rdbuf();
  if (buf.str().find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("key '", key, "': ", path, " is not PEM"));
  }
  return buf.str();
}

// TLS for the TCP listener; with tls_client_ca_file, client certificates
// are required and verified (mTLS).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TlsCredentials(
    const Config::Server& server) {
  grpc::SslServerCredentialsOptions options;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  KVTIER_ASSIGN_OR_RETURN(pair.cert_chain, ReadPem("server.tls_cert_file", server.tls_cert_file));
  KVTIER_ASSIGN_OR_RETURN(pair.private_key, ReadPem("server.tls_key_file", server.tls_key_file));
  options.pem_key_cert_pairs.push_back(std::move(pair));
  if (!server.tls_client_ca_file.empty()) {
    KVTIER_ASSIGN_OR_RETURN(options.pem_root_certs,
                            ReadPem("server.tls_client_ca_file", server.tls_client_ca_file));
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

// Message size, stream and connection limits of every gRPC server the
// daemon runs (the main one and the peer socket's per-uid servers).
void ConfigureBuilder(const Config::Server& server, grpc::ServerBuilder& b) {
  b.SetMaxReceiveMessageSize(static_cast<int>(server.max_message_bytes));
  b.SetMaxSendMessageSize(static_cast<int>(server.max_message_bytes));
  b.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                       static_cast<int>(server.max_concurrent_streams));
  if (server.connection_idle_ms > 0) {
    b.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                         static_cast<int>(server.connection_idle_ms));
  }
  // TCP (gRPC's own listener): a connection that has not finished its TLS
  // handshake in this time is closed.
  b.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                       static_cast<int>(server.connection_setup_ms));
}

// Marks a kvtier-peer-uid a client sent to the main server as claimed
// (kClaimedPeerUid), so that CallerOf refuses the call (UNAUTHENTICATED),
// token or not: only the peer socket's servers may set that key
// (daemon/auth/peer_server.h), and the main socket's connections come
// without a credentials processor (the daemon accepts them itself).
class MarkClaimedPeerUid final : public grpc::experimental::Interceptor {
 public:
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      std::multimap<grpc::string_ref, grpc::string_ref>* md = methods->GetRecvInitialMetadata();
      if (md->erase(grpc::string_ref(kPeerUidKey)) > 0) {
        md->emplace(grpc::string_ref(kPeerUidKey), grpc::string_ref(kClaimedPeerUid));
      }
    }
    methods->Proceed();
  }
};

class MarkClaimedPeerUidFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* /*info*/) override {
    return new MarkClaimedPeerUid();
  }
};

// auth.peer_socket_path: a server per uid a tenant lists, with the same
// services, limits and (when metrics are on) interceptors as the main one.
absl::StatusOr<std::unique_ptr<PeerServer>> StartPeerServer(const Config& config, Runtime* rt,
                                                            ConnectionGate* gate,
                                                            HealthBoard* health) {
  PeerServerOptions peer;
  peer.path = config.auth.peer_socket_path;
  peer.tenants = &rt->tenants();
  peer.gate = gate;
  peer.setup_timeout = std::chrono::milliseconds(config.server.connection_setup_ms);
  peer.max_pending = config.server.max_pending_connections;
  peer.make_services = [rt, health, reflection = config.server.reflection] {
    std::vector<std::unique_ptr<grpc::Service>> services;
    services.push_back(std::make_unique<KvTierService>(rt));
    services.push_back(std::make_unique<AdminService>(rt));
    services.push_back(std::make_unique<HealthService>(rt, health));
    if (reflection) services.push_back(std::make_unique<ReflectionService>(rt, ServiceNames()));
    return services;
  };
  peer.configure = [server_config = config.server](grpc::ServerBuilder& b) {
    ConfigureBuilder(server_config, b);
  };
  if (!config.metrics.listen_address.empty()) {
    peer.make_interceptors = [rt] {
      std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> c;
      c.push_back(rt->metrics()->InterceptorFactory());
      return c;
    };
  }
  return PeerServer::Start(std::move(peer));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const Config& config, Env* env) {
  std::unique_ptr<Server> server(new Server());
  // Mode 0700 when created here: tier files and catalogs hold tenants' data.
  if (absl::Status made = Env::Default()->CreateDir(config.server.data_dir, /*recursive=*/true);
      !made.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "key 'server.data_dir': cannot create ", config.server.data_dir, ": ", made.message()));
  }
  server->socket_path_ =
      std::filesystem::absolute(config.server.socket_path).lexically_normal().string();
  if (server->socket_path_.size() > 107) server->socket_path_ = config.server.socket_path;
  server->shutdown_grace_ms_ = config.server.shutdown_grace_ms;
  KVTIER_ASSIGN_OR_RETURN(ConnectionLimits limits, ConnectionLimitsFor(config.server));
  server->gate_ = std::make_unique<ConnectionGate>(limits);
  KVTIER_RETURN_IF_ERROR(PrepareSocketPath(server->socket_path_));
  KVTIER_ASSIGN_OR_RETURN(server->runtime_, Runtime::Create(config, env));
  server->health_ = std::make_unique<HealthBoard>();
  KVTIER_RETURN_IF_ERROR(server->StartGrpc(config));
  KVTIER_RETURN_IF_ERROR(server->StartListeners(config));
  server->health_->SetServing(true);
  spdlog::info("listening socket={} tcp={} device={} gpu=\"{}\" connections<={} (per uid {})",
               server->socket_path_,
               config.server.tcp_address.empty() ? "off" : config.server.tcp_address,
               server->runtime_->device_backend(), server->runtime_->device_probe().description,
               limits.max_total, limits.max_per_uid);
  if (server->runtime_->device_backend() == "shm-arena") {
    spdlog::info("the device tier uses the shared-memory arena (CPU)");
  }
  return server;
}

// The gRPC server: services, limits, interceptors and, with TCP on, its
// TLS listener on a private Unix socket. Neither the Unix socket nor the
// TCP port is a gRPC listening port: the daemon accepts their connections
// itself (StartListeners) and hands or relays them to gRPC.
absl::Status Server::StartGrpc(const Config& config) {
  kvtier_service_ = std::make_unique<KvTierService>(runtime_.get());
  admin_service_ = std::make_unique<AdminService>(runtime_.get());
  health_service_ = std::make_unique<HealthService>(runtime_.get(), health_.get());
  grpc::ServerBuilder builder;
  ConfigureBuilder(config.server, builder);
  const TenantRegistry& tenants = runtime_->tenants();
  if (!config.server.tcp_address.empty()) {
    KVTIER_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> tls,
                            TlsCredentials(config.server));
    if (tenants.enabled()) {
      tls->SetAuthMetadataProcessor(std::make_shared<TenantAuthProcessor>(&tenants));
    }
    KVTIER_ASSIGN_OR_RETURN(tcp_upstream_path_, PrepareTcpUpstream(config.server.data_dir));
    builder.AddListeningPort("unix:" + tcp_upstream_path_, tls, &tcp_upstream_port_);
  }
  builder.RegisterService(kvtier_service_.get());
  builder.RegisterService(admin_service_.get());
  builder.RegisterService(health_service_.get());
  if (config.server.reflection) {
    reflection_service_ = std::make_unique<ReflectionService>(runtime_.get(), ServiceNames());
    builder.RegisterService(reflection_service_.get());
  }
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  creators.push_back(std::make_unique<MarkClaimedPeerUidFactory>());
  if (!config.metrics.listen_address.empty()) {
    // RPC counts and durations by method and code; only when scraped, so
    // that a daemon without metrics pays nothing per call for them.
    creators.push_back(runtime_->metrics()->InterceptorFactory());
  }
  builder.experimental().SetInterceptorCreators(std::move(creators));
  grpc_server_ = builder.BuildAndStart();
  if (grpc_server_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot start the gRPC server",
                     config.server.tcp_address.empty() ? "" : " on " + config.server.tcp_address,
                     " (see the gRPC error above)"));
  }
  if (!config.server.tcp_address.empty() && tcp_upstream_port_ == 0) {
    grpc_server_->Shutdown();
    return absl::UnavailableError(
        absl::StrCat("key 'server.data_dir': gRPC cannot listen on ", tcp_upstream_path_));
  }
  return absl::OkStatus();
}

// The Unix socket's accept loop, the metrics endpoint and the peer socket.
absl::Status Server::StartListeners(const Config& config) {
  absl::Status started = [&]() -> absl::Status {
    KVTIER_ASSIGN_OR_RETURN(OwnedFd listen_fd, ListenUnix("server.socket_path", socket_path_,
                                                          config.server.socket_mode));
    UnixAcceptorOptions accept;
    accept.name = "socket";
    accept.listen_fd = std::move(listen_fd);
    accept.gate = gate_.get();
    accept.setup_timeout = std::chrono::milliseconds(config.server.connection_setup_ms);
    accept.max_pending = config.server.max_pending_connections;
    grpc::Server* grpc_server = grpc_server_.get();
    accept.hand_off = [grpc_server](int fd, uint32_t /*uid*/) {
      grpc::AddInsecureChannelFromFd(grpc_server, fd);  // gRPC owns fd from here
    };
    KVTIER_ASSIGN_OR_RETURN(acceptor_, UnixAcceptor::Start(std::move(accept)));
    if (!config.server.tcp_address.empty()) {
      TcpFrontOptions tcp;
      KVTIER_ASSIGN_OR_RETURN(tcp.listen_fd,
                              ListenTcp("server.tcp_address", config.server.tcp_address));
      tcp_port_ = BoundPort(tcp.listen_fd.get());
      tcp.upstream_path = tcp_upstream_path_;
      tcp.max_total = config.server.max_tcp_connections;
      tcp.max_per_address = config.server.max_tcp_connections_per_address;
      tcp.max_pending = config.server.max_pending_connections;
      tcp.setup_timeout = std::chrono::milliseconds(config.server.connection_setup_ms);
      KVTIER_ASSIGN_OR_RETURN(tcp_front_, TcpFront::Start(std::move(tcp)));
      spdlog::info(
          "tcp at {} (port {}), relayed to gRPC's TLS listener at {}; connections<={} "
          "(per address {})",
          config.server.tcp_address, tcp_port_, tcp_upstream_path_,
          config.server.max_tcp_connections, config.server.max_tcp_connections_per_address);
    }
    if (!config.metrics.listen_address.empty()) {
      Runtime* rt = runtime_.get();
      KVTIER_ASSIGN_OR_RETURN(
          metrics_, metrics::HttpListener::Start(config.metrics.listen_address,
                                                 [rt] { return rt->metrics()->Render(); }));
      spdlog::info("metrics at http://{}/metrics", metrics_->address());
    }
    if (!config.auth.peer_socket_path.empty()) {
      KVTIER_ASSIGN_OR_RETURN(peer_server_,
                              StartPeerServer(config, runtime_.get(), gate_.get(), health_.get()));
    }
    if (metrics_ != nullptr) {
      // Read at scrape time; no scrape runs past Shutdown's metrics_.reset().
      runtime_->metrics()->registry()->AddCollector([this](metrics::Writer& w) {
        std::vector<UnixAcceptorStats> acceptors = {acceptor_->stats()};
        if (peer_server_ != nullptr) acceptors.push_back(peer_server_->stats().acceptor);
        WriteConnectionMetrics(*gate_, acceptors, w);
        if (tcp_front_ != nullptr) WriteTcpMetrics(tcp_front_->stats(), w);
      });
    }
    return absl::OkStatus();
  }();
  if (!started.ok()) {
    if (acceptor_ != nullptr) acceptor_->Stop();
    if (tcp_front_ != nullptr) tcp_front_->Stop();
    ::unlink(socket_path_.c_str());
    grpc_server_->Shutdown();
  }
  return started;
}

Server::~Server() { Shutdown(); }

void Server::Shutdown() {
  if (shut_down_ || grpc_server_ == nullptr) return;
  shut_down_ = true;
  // No new connection; health watchers are told and let go.
  if (acceptor_ != nullptr) acceptor_->Stop();
  if (tcp_front_ != nullptr) tcp_front_->StopAccepting();
  health_->Shutdown();
  auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(shutdown_grace_ms_);
  if (peer_server_ != nullptr) peer_server_->Shutdown(deadline);
  grpc_server_->Shutdown(deadline);
  grpc_server_->Wait();
  if (tcp_front_ != nullptr) tcp_front_->Stop();  // gRPC closed its ends
  metrics_.reset();  // no scrape reads the runtime or the listeners past this point
  peer_server_.reset();
  // No handler runs any more: the store can close (and release its lock).
  kvtier_service_.reset();
  admin_service_.reset();
  health_service_.reset();
  reflection_service_.reset();
  grpc_server_.reset();
  runtime_.reset();
  ::unlink(socket_path_.c_str());
  if (!tcp_upstream_path_.empty()) ::unlink(tcp_upstream_path_.c_str());
  spdlog::info("stopped");
}

}  // namespace kvtier::daemon
