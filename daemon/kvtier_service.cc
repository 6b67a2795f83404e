#include "daemon/kvtier_service.h"

#include "daemon/reactors.h"

namespace kvtier::daemon {
namespace {

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx,
                                      const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

constexpr char kBlockStore[] = "the block store";
constexpr char kIndex[] = "the semantic index (contexts and Select)";

}  // namespace

grpc::ServerUnaryReactor* KvTierService::RegisterProfile(grpc::CallbackServerContext* ctx,
                                                         const v1::RegisterProfileRequest*,
                                                         v1::RegisterProfileResponse*) {
  return FinishUnary(ctx, NotBuilt("RegisterProfile", kBlockStore));
}

grpc::ServerUnaryReactor* KvTierService::GetProfile(grpc::CallbackServerContext* ctx,
                                                    const v1::GetProfileRequest*,
                                                    v1::GetProfileResponse*) {
  return FinishUnary(ctx, NotBuilt("GetProfile", kBlockStore));
}

grpc::ServerUnaryReactor* KvTierService::OpenArena(grpc::CallbackServerContext* ctx,
                                                   const v1::OpenArenaRequest*,
                                                   v1::OpenArenaResponse*) {
  return FinishUnary(ctx, NotBuilt("OpenArena", "the device arena"));
}

grpc::ServerUnaryReactor* KvTierService::ReserveSlots(grpc::CallbackServerContext* ctx,
                                                      const v1::ReserveSlotsRequest*,
                                                      v1::ReserveSlotsResponse*) {
  return FinishUnary(ctx, NotBuilt("ReserveSlots", kBlockStore));
}

grpc::ServerReadReactor<v1::PutBlocksRequest>* KvTierService::PutBlocks(
    grpc::CallbackServerContext*, v1::PutBlocksResponse*) {
  return new FinishedReadReactor<v1::PutBlocksRequest>(NotBuilt("PutBlocks", kBlockStore));
}

grpc::ServerWriteReactor<v1::GetBlocksResponse>* KvTierService::GetBlocks(
    grpc::CallbackServerContext*, const v1::GetBlocksRequest*) {
  return new FinishedWriteReactor<v1::GetBlocksResponse>(NotBuilt("GetBlocks", kBlockStore));
}

grpc::ServerUnaryReactor* KvTierService::Lookup(grpc::CallbackServerContext* ctx,
                                                const v1::LookupRequest*, v1::LookupResponse*) {
  return FinishUnary(ctx, NotBuilt("Lookup", kBlockStore));
}

grpc::ServerUnaryReactor* KvTierService::DeleteBlocks(grpc::CallbackServerContext* ctx,
                                                      const v1::DeleteBlocksRequest*,
                                                      v1::DeleteBlocksResponse*) {
  return FinishUnary(ctx, NotBuilt("DeleteBlocks", kBlockStore));
}

grpc::ServerUnaryReactor* KvTierService::OpenContext(grpc::CallbackServerContext* ctx,
                                                     const v1::OpenContextRequest*,
                                                     v1::OpenContextResponse*) {
  return FinishUnary(ctx, NotBuilt("OpenContext", kIndex));
}

grpc::ServerUnaryReactor* KvTierService::AppendBlocks(grpc::CallbackServerContext* ctx,
                                                      const v1::AppendBlocksRequest*,
                                                      v1::AppendBlocksResponse*) {
  return FinishUnary(ctx, NotBuilt("AppendBlocks", kIndex));
}

grpc::ServerUnaryReactor* KvTierService::CloseContext(grpc::CallbackServerContext* ctx,
                                                      const v1::CloseContextRequest*,
                                                      v1::CloseContextResponse*) {
  return FinishUnary(ctx, NotBuilt("CloseContext", kIndex));
}

grpc::ServerBidiReactor<v1::SelectRequest, v1::SelectResponse>* KvTierService::Select(
    grpc::CallbackServerContext*) {
  return new FinishedBidiReactor<v1::SelectRequest, v1::SelectResponse>(
      NotBuilt("Select", kIndex));
}

grpc::ServerUnaryReactor* KvTierService::Release(grpc::CallbackServerContext* ctx,
                                                 const v1::ReleaseRequest*,
                                                 v1::ReleaseResponse*) {
  return FinishUnary(ctx, NotBuilt("Release", "leases"));
}

}  // namespace kvtier::daemon
