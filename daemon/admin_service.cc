#include "daemon/admin_service.h"

#include "daemon/reactors.h"
#include "daemon/version.h"

namespace kvtier::daemon {
namespace {

void AddTier(v1::StatsResponse* resp, v1::Tier tier, const std::string& backend,
             uint64_t capacity_bytes, const std::string& location) {
  v1::TierStats* t = resp->add_tiers();
  t->set_tier(tier);
  t->set_backend(backend);
  t->set_capacity_bytes(capacity_bytes);
  t->set_location(location);
}

}  // namespace

grpc::ServerUnaryReactor* AdminService::Stats(grpc::CallbackServerContext* ctx,
                                              const v1::StatsRequest*, v1::StatsResponse* resp) {
  const Config& config = runtime_->config();
  resp->set_version(kVersion);
  resp->set_uptime_s(runtime_->uptime_s());
  AddTier(resp, v1::TIER_DEVICE, runtime_->device_backend(), config.device.capacity_bytes,
          config.device.shm_dir);
  AddTier(resp, v1::TIER_HOST, "dram", config.host.capacity_bytes, config.host.shm_dir);
  AddTier(resp, v1::TIER_NVME, config.nvme.direct_io ? "nvme (O_DIRECT)" : "nvme (buffered)",
          config.nvme_capacity_bytes(), config.nvme.dir);
  for (const auto& [key, value] : config.Flatten()) (*resp->mutable_config())[key] = value;
  (*resp->mutable_config())["gpu.probe"] = runtime_->device_probe().description;
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::ListBlocks(grpc::CallbackServerContext* ctx,
                                                   const v1::ListBlocksRequest*,
                                                   v1::ListBlocksResponse*) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(NotBuilt("ListBlocks", "the block store"));
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::ListContexts(grpc::CallbackServerContext* ctx,
                                                     const v1::ListContextsRequest*,
                                                     v1::ListContextsResponse*) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(NotBuilt("ListContexts", "the semantic index (contexts)"));
  return reactor;
}

grpc::ServerWriteReactor<v1::DrainProgress>* AdminService::Drain(grpc::CallbackServerContext*,
                                                                 const v1::DrainRequest*) {
  return new FinishedWriteReactor<v1::DrainProgress>(NotBuilt("Drain", "the block store"));
}

grpc::ServerWriteReactor<v1::VerifyProgress>* AdminService::Verify(grpc::CallbackServerContext*,
                                                                   const v1::VerifyRequest*) {
  return new FinishedWriteReactor<v1::VerifyProgress>(NotBuilt("Verify", "the block store"));
}

}  // namespace kvtier::daemon
