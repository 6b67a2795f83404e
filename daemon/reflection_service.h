// ReflectionService: grpc.reflection.v1alpha.ServerReflection on the
// callback API, for grpcurl and grpc_cli (server.reflection, off by
// default). It replaces gRPC's reflection plugin, a sync-API service that
// holds a thread for every open stream and admits any caller.
//
//  - A stream resolves its caller like every other RPC (CallerOf): with
//    authentication on, a stream without a tenant's credentials is
//    UNAUTHENTICATED.
//  - A stream is registered in the StreamTable: it counts against
//    server.max_streams_per_tenant and server.max_streams
//    (RESOURCE_EXHAUSTED past either), is cancelled when its token is
//    revoked, and an unread answer is subject to
//    server.stream_write_timeout_ms. It costs no thread.
//  - Answers come from the process's generated descriptor pool: the files
//    of the services registered (and their imports), found by file name,
//    symbol or extension. A name it does not know is answered with an
//    error_response of NOT_FOUND on the same stream.
//
// Thread safety: gRPC calls it from its callback threads; it holds no state
// but the service names, fixed at construction.
#ifndef KVTIER_DAEMON_REFLECTION_SERVICE_H_
#define KVTIER_DAEMON_REFLECTION_SERVICE_H_

#include <string>
#include <vector>

#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"

namespace kvtier::daemon {

class Runtime;

class ReflectionService final
    : public grpc::reflection::v1alpha::ServerReflection::CallbackService {
 public:
  // `services`: the fully qualified names list_services answers (this
  // service's own is added). runtime must outlive the service.
  ReflectionService(Runtime* runtime, std::vector<std::string> services);

  grpc::ServerBidiReactor<grpc::reflection::v1alpha::ServerReflectionRequest,
                          grpc::reflection::v1alpha::ServerReflectionResponse>*
  ServerReflectionInfo(grpc::CallbackServerContext* ctx) override;

 private:
  Runtime* const runtime_;
  const std::vector<std::string> services_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_REFLECTION_SERVICE_H_
