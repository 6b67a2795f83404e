// EchoServer: the anchor of kvtier_select_rpc_bench. A gRPC server on a Unix
// socket, built with the same settings as kvtierd's (message size limits,
// max concurrent streams, insecure credentials, callback API), serving one
// bidirectional stream whose reactor is shaped like kvtierd's Select
// reactor (read, build the response, queue it, one write outstanding,
// read the next) but whose "work" is copying a prepared SelectResponse and
// setting its request_id.
//
// Thread safety: Start/Shutdown from one thread; SetResponse must not race
// with requests in flight (call it between measured phases).
#ifndef KVTIER_BENCH_ECHO_ECHO_SERVER_H_
#define KVTIER_BENCH_ECHO_ECHO_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "echo.grpc.pb.h"

namespace kvtier::bench {

class EchoServer {
 public:
  // Listens on unix:socket_path (an existing file there is replaced).
  static absl::StatusOr<std::unique_ptr<EchoServer>> Start(const std::string& socket_path,
                                                           uint64_t max_message_bytes,
                                                           uint64_t max_concurrent_streams);
  // Listens on any gRPC address ("unix:PATH", "127.0.0.1:0") with
  // `credentials`; *port gets the bound TCP port (0 for unix:).
  static absl::StatusOr<std::unique_ptr<EchoServer>> StartAt(
      const std::string& address, const std::shared_ptr<grpc::ServerCredentials>& credentials,
      uint64_t max_message_bytes, uint64_t max_concurrent_streams, int* port);
  ~EchoServer();

  // The response every request gets (request_id replaced).
  void SetResponse(const v1::SelectResponse& response);

  const std::string& socket_path() const { return socket_path_; }

 private:
  class Service;
  EchoServer() = default;

  std::string socket_path_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_ECHO_ECHO_SERVER_H_
