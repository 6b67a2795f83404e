// AdminService: the administration gRPC service (proto/kvtier/v1/admin.proto)
// used by kvtierctl. Every call needs a caller with the admin role
// (PERMISSION_DENIED for the data role, UNAUTHENTICATED without
// credentials); admins see every tenant's blocks, contexts and usage.
//
// Thread safety: all handlers may run concurrently on gRPC threads.
#ifndef KVTIER_DAEMON_ADMIN_SERVICE_H_
#define KVTIER_DAEMON_ADMIN_SERVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "daemon/runtime.h"
#include "kvtier/v1/admin.grpc.pb.h"

namespace kvtier::daemon {

class AdminService final : public v1::Admin::CallbackService {
 public:
  explicit AdminService(Runtime* runtime) : runtime_(runtime) {}

  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx, const v1::StatsRequest* req,
                                  v1::StatsResponse* resp) override;
  grpc::ServerUnaryReactor* ListBlocks(grpc::CallbackServerContext* ctx,
                                       const v1::ListBlocksRequest* req,
                                       v1::ListBlocksResponse* resp) override;
  grpc::ServerUnaryReactor* ListContexts(grpc::CallbackServerContext* ctx,
                                         const v1::ListContextsRequest* req,
                                         v1::ListContextsResponse* resp) override;
  grpc::ServerWriteReactor<v1::DrainProgress>* Drain(grpc::CallbackServerContext* ctx,
                                                     const v1::DrainRequest* req) override;
  grpc::ServerWriteReactor<v1::VerifyProgress>* Verify(grpc::CallbackServerContext* ctx,
                                                       const v1::VerifyRequest* req) override;
  grpc::ServerUnaryReactor* ListProfiles(grpc::CallbackServerContext* ctx,
                                         const v1::ListProfilesRequest* req,
                                         v1::ListProfilesResponse* resp) override;
  // Runs on the I/O threads (a demotion writes to NVMe; a removal syncs
  // the catalog).
  grpc::ServerUnaryReactor* Evict(grpc::CallbackServerContext* ctx, const v1::EvictRequest* req,
                                  v1::EvictResponse* resp) override;

 private:
  static grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* ctx,
                                          const absl::Status& status);
  void AddTenantStats(v1::StatsResponse* resp);
  // One of limits.max_admin_operations, held until the last copy goes
  // (the ProgressReactor drops it when the work returns); RESOURCE_EXHAUSTED
  // naming the key when none is free.
  absl::StatusOr<std::shared_ptr<void>> StartOperation(const char* method);

  Runtime* const runtime_;  // not owned; outlives the service
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_ADMIN_SERVICE_H_
