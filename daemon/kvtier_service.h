// KvTierService: the data-plane gRPC service (proto/kvtier/v1/kvtier.proto).
// Holds only what it serves; the work is done by storage/ and index/.
//
// Thread safety: all handlers may run concurrently on gRPC threads.
#ifndef KVTIER_DAEMON_KVTIER_SERVICE_H_
#define KVTIER_DAEMON_KVTIER_SERVICE_H_

#include "absl/functional/any_invocable.h"
#include "daemon/runtime.h"
#include "kvtier/v1/kvtier.grpc.pb.h"

namespace kvtier::daemon {

// PutBlocks and GetBlocks are served as raw methods (their payloads are read
// and sent in place, not copied into messages; block_reactors.h); every
// other method as generated.
class KvTierService final
    : public v1::KvTier::WithRawCallbackMethod_GetBlocks<
          v1::KvTier::WithRawCallbackMethod_PutBlocks<v1::KvTier::CallbackService>> {
 public:
  explicit KvTierService(Runtime* runtime) : runtime_(runtime) {}

  grpc::ServerUnaryReactor* RegisterProfile(grpc::CallbackServerContext* ctx,
                                            const v1::RegisterProfileRequest* req,
                                            v1::RegisterProfileResponse* resp) override;
  grpc::ServerUnaryReactor* GetProfile(grpc::CallbackServerContext* ctx,
                                       const v1::GetProfileRequest* req,
                                       v1::GetProfileResponse* resp) override;
  grpc::ServerUnaryReactor* OpenArena(grpc::CallbackServerContext* ctx,
                                      const v1::OpenArenaRequest* req,
                                      v1::OpenArenaResponse* resp) override;
  grpc::ServerUnaryReactor* ReserveSlots(grpc::CallbackServerContext* ctx,
                                         const v1::ReserveSlotsRequest* req,
                                         v1::ReserveSlotsResponse* resp) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* PutBlocks(grpc::CallbackServerContext* ctx,
                                                       grpc::ByteBuffer* resp) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* GetBlocks(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* req) override;
  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* ctx, const v1::LookupRequest* req,
                                   v1::LookupResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteBlocks(grpc::CallbackServerContext* ctx,
                                         const v1::DeleteBlocksRequest* req,
                                         v1::DeleteBlocksResponse* resp) override;
  grpc::ServerUnaryReactor* OpenContext(grpc::CallbackServerContext* ctx,
                                        const v1::OpenContextRequest* req,
                                        v1::OpenContextResponse* resp) override;
  grpc::ServerUnaryReactor* AppendBlocks(grpc::CallbackServerContext* ctx,
                                         const v1::AppendBlocksRequest* req,
                                         v1::AppendBlocksResponse* resp) override;
  grpc::ServerUnaryReactor* CloseContext(grpc::CallbackServerContext* ctx,
                                         const v1::CloseContextRequest* req,
                                         v1::CloseContextResponse* resp) override;
  grpc::ServerBidiReactor<v1::SelectRequest, v1::SelectResponse>* Select(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx, const v1::ReleaseRequest* req,
                                    v1::ReleaseResponse* resp) override;
  grpc::ServerUnaryReactor* CompactContext(grpc::CallbackServerContext* ctx,
                                           const v1::CompactContextRequest* req,
                                           v1::CompactContextResponse* resp) override;
  grpc::ServerUnaryReactor* ListContextVersions(grpc::CallbackServerContext* ctx,
                                                const v1::ListContextVersionsRequest* req,
                                                v1::ListContextVersionsResponse* resp) override;
  grpc::ServerUnaryReactor* DropContextVersion(grpc::CallbackServerContext* ctx,
                                               const v1::DropContextVersionRequest* req,
                                               v1::DropContextVersionResponse* resp) override;

 private:
  // INVALID_ARGUMENT naming field when a batch is empty or over
  // limits.max_batch_blocks.
  absl::Status CheckBatch(const char* field, int size) const;
  // Runs `work` on the runtime's BlockingPool (it may wait on a disk) and
  // finishes the call with its status; RESOURCE_EXHAUSTED when the pool's
  // queue is full. `tenant` (the caller, already resolved) is the queue it
  // waits in. The request and response stay valid until then.
  grpc::ServerUnaryReactor* FinishBlocking(grpc::CallbackServerContext* ctx,
                                           const std::string& tenant,
                                           absl::AnyInvocable<absl::Status() &&> work);

  Runtime* const runtime_;  // not owned; outlives the service
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KVTIER_SERVICE_H_
