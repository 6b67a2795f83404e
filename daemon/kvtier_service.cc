#include "daemon/kvtier_service.h"

#include "absl/container/flat_hash_map.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "daemon/block_reactors.h"
#include "daemon/compaction/compactor.h"
#include "daemon/convert.h"
#include "daemon/grpc_status.h"
#include "daemon/select_reactor.h"
#include "daemon/tenant.h"

namespace kvtier::daemon {
namespace {

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx,
                                      const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx,
                                      const absl::Status& status) {
  return FinishUnary(ctx, ToGrpcStatus(status));
}

// A context_key a client sent: the 16 bytes CompactContext returned (or,
// where `empty_ok`, none).
absl::Status CheckContextKey(const std::string& key, bool empty_ok) {
  if (key.empty() && empty_ok) return absl::OkStatus();
  if (key.size() != Compactor::kContextKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("context_key: ", key.size(), " bytes; a context key is the ",
                     Compactor::kContextKeyBytes, " bytes CompactContext returned"));
  }
  return absl::OkStatus();
}

}  // namespace

grpc::ServerUnaryReactor* KvTierService::FinishBlocking(
    grpc::CallbackServerContext* ctx, const std::string& tenant,
    absl::AnyInvocable<absl::Status() &&> work) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  BlockingPool* pool = runtime_->blocking_pool();
  if (!pool->Submit(tenant, [reactor, work = std::move(work)]() mutable {
        reactor->Finish(ToGrpcStatus(std::move(work)()));
      })) {
    reactor->Finish(ToGrpcStatus(pool->QueueFullStatus(tenant)));
  }
  return reactor;
}

absl::Status KvTierService::CheckBatch(const char* field, int size) const {
  const uint64_t limit = runtime_->config().limits.max_batch_blocks;
  if (size == 0) return absl::InvalidArgumentError(absl::StrCat(field, ": empty"));
  if (static_cast<uint64_t>(size) > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", size, " ids exceed limits.max_batch_blocks = ", limit));
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* KvTierService::RegisterProfile(grpc::CallbackServerContext* ctx,
                                                         const v1::RegisterProfileRequest* req,
                                                         v1::RegisterProfileResponse* resp) {
  absl::StatusOr<TenantPtr> caller = CallerOf(runtime_->tenants(), ctx);
  if (!caller.ok()) return FinishUnary(ctx, caller.status());
  const std::string& tenant = (*caller)->name;
  auto profile = FromProto(req->profile());
  if (!profile.ok()) return FinishUnary(ctx, profile.status());
  // A new profile is a synced catalog write.
  return FinishBlocking(ctx, tenant, [this, tenant, profile = *std::move(profile), resp] {
    auto registered = runtime_->store()->RegisterProfile(profile, tenant);
    if (!registered.ok()) return registered.status();
    resp->set_profile_id(registered->profile.profile_id);
    resp->set_block_size_bytes(BlockSizeBytes(registered->profile));
    resp->set_created(registered->created);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvTierService::GetProfile(grpc::CallbackServerContext* ctx,
                                                    const v1::GetProfileRequest* req,
                                                    v1::GetProfileResponse* resp) {
  absl::StatusOr<TenantPtr> caller = CallerOf(runtime_->tenants(), ctx);
  if (!caller.ok()) return FinishUnary(ctx, caller.status());
  const std::string& tenant = (*caller)->name;
  auto profile = ProfileOf(runtime_->store(), tenant, req->profile_id());
  if (!profile.ok()) return FinishUnary(ctx, profile.status());
  *resp->mutable_profile() = ToProto(*profile);
  resp->set_block_size_bytes(BlockSizeBytes(*profile));
  index::HeadWeights weights = runtime_->summarizer()->HeadWeightsOf(tenant, req->profile_id());
  resp->mutable_head_weights()->Add(weights.weights.begin(), weights.weights.end());
  resp->set_head_weights_version(weights.version);
  return FinishUnary(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* KvTierService::OpenArena(grpc::CallbackServerContext* ctx,
                                                   const v1::OpenArenaRequest*,
                                                   v1::OpenArenaResponse* resp) {
  absl::StatusOr<TenantPtr> caller = CallerOf(runtime_->tenants(), ctx);
  if (!caller.ok()) return FinishUnary(ctx, caller.status());
  const std::string& tenant = (*caller)->name;
  absl::StatusOr<gpu::ArenaInfo> arena_or = runtime_->store()->Arena(tenant);
  if (!arena_or.ok()) return FinishUnary(ctx, arena_or.status());
  const gpu::ArenaInfo& arena = *arena_or;
  resp->set_arena_id(arena.arena_id);
  resp->set_size_bytes(arena.size_bytes);
  if (runtime_->store()->per_tenant_memory()) {
    // The file is private to the daemon: its descriptor comes from the fd
    // socket, for this tenant only.
    if (!arena.shm_path.empty()) resp->set_fd_socket_path(runtime_->fd_socket_path());
  } else {
    resp->set_shm_path(arena.shm_path);
  }
  resp->set_cuda_ipc_handle(arena.ipc_handle);
  resp->set_device_uuid(arena.device_uuid);
  return FinishUnary(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* KvTierService::ReserveSlots(grpc::CallbackServerContext* ctx,
                                                      const v1::ReserveSlotsRequest* req,
                                                      v1::ReserveSlotsResponse* resp) {
  absl::StatusOr<TenantPtr> caller = CallerOf(runtime_->tenants(), ctx);
  if (!caller.ok()) return FinishUnary(ctx, caller.status());
  const std::string& tenant = (*caller)->name;
  if (auto profile = ProfileOf(runtime_->store(), tenant, req->profile_id()); !profile.ok()) {
    return FinishUnary(ctx, profile.status());
  }
  auto slots = runtime_->store()->ReserveStaging(tenant, req->profile_id(), req->count(),
                                                 req->lease_ttl_ms());
  if (!slots.ok()) return FinishUnary(ctx, slots.status());
  // The staging file has no path: its (sealed) descriptor comes from the fd
  // socket, to this tenant only.
  absl::StatusOr<StagingFile> staging = runtime_->store()->OpenStagingFile(tenant);
  if (!staging.ok()) return FinishUnary(ctx, staging.status());
  resp->set_fd_socket_path(runtime_->fd_socket_path());
  resp->set_staging_size_bytes(staging->size_bytes);
  for (const StagingSlot& s : *slots) {
    v1::SlotRef* ref = resp->add_slots();
    ref->set_slot_id(s.slot_id);
    ref->set_offset_bytes(s.offset_bytes);
    ref->set_size_bytes(s.size_bytes);
    ref->set_generation(s.generation);
  }
  return FinishUnary(ctx, grpc::Status::OK);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* KvTierService::PutBlocks(
    grpc::CallbackServerContext* ctx, grpc::ByteBuffer* resp) {
  return NewPutBlocksReactor(runtime_, ctx, resp);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* KvTierService::GetBlocks(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req) {
  return NewGetBlocksReactor(runtime_, ctx, req);
}

grpc::ServerUnaryReactor* KvTierService::Lookup(grpc::CallbackServerContext* ctx,
                                                const v1::LookupRequest* req,
                                                v1::LookupResponse* resp) {
  absl::StatusOr<TenantPtr> caller = CallerOf(runtime_->tenants(), ctx);
  if (!caller.ok()) return FinishUnary(ctx, caller.status());
  const std::string& tenant = (*caller)->name;
  if (auto st = CheckBatch("block_ids", req->block_ids_size()); !st.ok()) {
    return FinishUnary(ctx, st);
  }
  if (auto profile = ProfileOf(runtime_->store(), tenant, req->profile_id()); !profile.ok()) {
    return FinishUnary(ctx, profile.status());
  }
  for (const std::string& id : req->block_ids()) {
    if (auto st = ValidateBlockKey(BlockKey{tenant, req->profile_id(), id}); !st.ok()) {
      return FinishUnary(ctx, st);
    }
  }
  // With a remote tier, the blocks of the prefix no local tier holds are
  // asked for in the cluster (network I/O: on an I/O thread), until the
  // first one it does not have either.
  remote::RemoteStore* remote = runtime_->remote();
  auto lookup = [this, tenant, req, resp, remote] {
    bool prefix = true;
    uint32_t prefix_blocks = 0;
    for (const std::string& id : req->block_ids()) {
      const BlockKey key{tenant, req->profile_id(), id};
      const BlockLocation loc = runtime_->store()->Lookup(key);
      v1::LookupEntry* entry = resp->add_entries();
      entry->set_block_id(id);
      entry->set_present(loc.present);
      if (loc.present) {
        entry->set_tier(ToProto(loc.tier));
        entry->set_durable(loc.durable);
      } else if (prefix && remote != nullptr && remote->InRemote(key)) {
        entry->set_present(true);
        entry->set_tier(v1::TIER_REMOTE);
      }
      prefix = prefix && entry->present();
      if (prefix) ++prefix_blocks;
    }
    resp->set_prefix_blocks(prefix_blocks);
    return absl::OkStatus();
  };
  if (remote != nullptr) return FinishBlocking(ctx, tenant, std::move(lookup));
  return FinishUnary(ctx, lookup());
}

grpc::ServerUnaryReactor* KvTierService::DeleteBlocks(grpc::CallbackServerContext* ctx,
                                                      const v1::DeleteBlocksRequest* req,
                                                      v1::DeleteBlocksResponse* resp) {
  absl::StatusOr<TenantPtr> caller = CallerOf(runtime_->tenants(), ctx);
  if (!caller.ok()) return FinishUnary(ctx, caller.status());
  const std::string& tenant = (*caller)->name;
  if (auto st = CheckBatch("block_ids", req->block_ids_size()); !st.ok()) {
    return FinishUnary(ctx, st);
  }
  // Removing a durable block's record is a synced catalog write.
  return FinishBlocking(ctx, tenant, [this, tenant, req, resp] {
    for (const std::string& id : req->block_ids()) {
      absl::Status st = runtime_->store()->Delete(BlockKey{tenant, req->profile_id(), id});
      ToItemStatus(st, resp->add_statuses());
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvTierService::OpenContext(grpc::CallbackServerContext* ctx,
                                                     const v1::OpenContextRequest* req,
                                                     v1::OpenContextResponse* resp) {
  absl::StatusOr<TenantPtr> caller = CallerOf(runtime_->tenants(), ctx);
  if (!caller.ok()) return FinishUnary(ctx, caller.status());
  const std::string& tenant = (*caller)->name;
  // Repeats are refused before anything is copied: a request naming one id
  // many times costs only its own message (ContextManager::Open checks
  // again, for in-process callers).
  {
    absl::flat_hash_map<absl::string_view, std::pair<int, int>> seen;
    for (int s = 0; s < req->segments_size(); ++s) {
      const auto& ids = req->segments(s).block_ids();
      for (int j = 0; j < ids.size(); ++j) {
        auto [it, fresh] = seen.try_emplace(ids[j], s, j);
        if (!fresh) {
          return FinishUnary(ctx, absl::InvalidArgumentError(absl::StrCat(
                                      "segments[", s, "].block_ids[", j, "]: repeats segments[",
                                      it->second.first, "].block_ids[", it->second.second,
                                      "] (a block appears at most once in a context)")));
        }
      }
    }
  }
  std::vector<std::vector<std::string>> segments;
  segments.reserve(req->segments_size());
  for (const v1::Segment& segment : req->segments()) {
    segments.emplace_back(segment.block_ids().begin(), segment.block_ids().end());
  }
  auto opened =
      runtime_->contexts()->Open(tenant, req->profile_id(), segments, req->lease_ttl_ms());
  if (!opened.ok()) return FinishUnary(ctx, opened.status());
  resp->set_context_id(opened->context_id);
  resp->set_num_blocks(opened->num_blocks);
  return FinishUnary(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* KvTierService::AppendBlocks(grpc::CallbackServerContext* ctx,
                                                      const v1::AppendBlocksRequest* req,
                                                      v1::AppendBlocksResponse* resp) {
  absl::StatusOr<TenantPtr> caller = CallerOf(runtime_->tenants(), ctx);
  if (!caller.ok()) return FinishUnary(ctx, caller.status());
  const std::string& tenant = (*caller)->name;
  std::vector<std::string> ids(req->block_ids().begin(), req->block_ids().end());
  auto appended = runtime_->contexts()->Append(tenant, req->context_id(), ids);
  if (!appended.ok()) return FinishUnary(ctx, appended.status());
  resp->set_num_blocks(*appended);
  return FinishUnary(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* KvTierService::CloseContext(grpc::CallbackServerContext* ctx,
                                                      const v1::CloseContextRequest* req,
                                                      v1::CloseContextResponse*) {
  absl::StatusOr<TenantPtr> caller = CallerOf(runtime_->tenants(), ctx);
  if (!caller.ok()) return FinishUnary(ctx, caller.status());
  const std::string& tenant = (*caller)->name;
  return FinishUnary(ctx, runtime_->contexts()->Close(tenant, req->context_id()));
}

grpc::ServerBidiReactor<v1::SelectRequest, v1::SelectResponse>* KvTierService::Select(
    grpc::CallbackServerContext* ctx) {
  return NewSelectReactor(runtime_, ctx);
}

grpc::ServerUnaryReactor* KvTierService::Release(grpc::CallbackServerContext* ctx,
                                                 const v1::ReleaseRequest* req,
                                                 v1::ReleaseResponse* resp) {
  absl::StatusOr<TenantPtr> caller = CallerOf(runtime_->tenants(), ctx);
  if (!caller.ok()) return FinishUnary(ctx, caller.status());
  const std::string& tenant = (*caller)->name;
  switch (req->target_case()) {
    case v1::ReleaseRequest::kLeaseId: {
      auto released = runtime_->store()->Release(tenant, req->lease_id());
      if (!released.ok()) return FinishUnary(ctx, released.status());
      resp->set_blocks_unpinned(*released);
      return FinishUnary(ctx, grpc::Status::OK);
    }
    case v1::ReleaseRequest::kContextId: {
      auto released = runtime_->contexts()->Release(tenant, req->context_id());
      if (!released.ok()) return FinishUnary(ctx, released.status());
      resp->set_blocks_unpinned(*released);
      return FinishUnary(ctx, grpc::Status::OK);
    }
    default:
      return FinishUnary(ctx, absl::InvalidArgumentError("target: set context_id or lease_id"));
  }
}

// Compaction reads and writes whole contexts: it runs on the I/O threads.
grpc::ServerUnaryReactor* KvTierService::CompactContext(grpc::CallbackServerContext* ctx,
                                                        const v1::CompactContextRequest* req,
                                                        v1::CompactContextResponse* resp) {
  absl::StatusOr<TenantPtr> caller = CallerOf(runtime_->tenants(), ctx);
  if (!caller.ok()) return FinishUnary(ctx, caller.status());
  return FinishBlocking(ctx, (*caller)->name, [this, tenant = (*caller)->name, req, resp] {
    auto result = runtime_->compactor()->Compact(tenant, *req);
    if (!result.ok()) return result.status();
    resp->set_context_key(result->context_key);
    *resp->mutable_version() = ToProto(result->version);
    resp->set_existed(result->existed);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvTierService::ListContextVersions(
    grpc::CallbackServerContext* ctx, const v1::ListContextVersionsRequest* req,
    v1::ListContextVersionsResponse* resp) {
  absl::StatusOr<TenantPtr> caller = CallerOf(runtime_->tenants(), ctx);
  if (!caller.ok()) return FinishUnary(ctx, caller.status());
  if (auto profile = ProfileOf(runtime_->store(), (*caller)->name, req->profile_id());
      !profile.ok()) {
    return FinishUnary(ctx, profile.status());
  }
  if (absl::Status s = CheckContextKey(req->context_key(), /*empty_ok=*/true); !s.ok()) {
    return FinishUnary(ctx, s);
  }
  auto versions =
      runtime_->compactor()->List((*caller)->name, req->profile_id(), req->context_key());
  if (!versions.ok()) return FinishUnary(ctx, versions.status());
  for (const ContextVersionRecord& v : *versions) *resp->add_versions() = ToProto(v);
  return FinishUnary(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* KvTierService::DropContextVersion(
    grpc::CallbackServerContext* ctx, const v1::DropContextVersionRequest* req,
    v1::DropContextVersionResponse* resp) {
  absl::StatusOr<TenantPtr> caller = CallerOf(runtime_->tenants(), ctx);
  if (!caller.ok()) return FinishUnary(ctx, caller.status());
  if (absl::Status s = CheckContextKey(req->context_key(), /*empty_ok=*/false); !s.ok()) {
    return FinishUnary(ctx, s);
  }
  return FinishBlocking(ctx, (*caller)->name, [this, tenant = (*caller)->name, req, resp] {
    auto deleted =
        runtime_->compactor()->Drop(tenant, req->profile_id(), req->context_key(), req->version());
    if (!deleted.ok()) return deleted.status();
    resp->set_blocks_deleted(*deleted);
    return absl::OkStatus();
  });
}

}  // namespace kvtier::daemon
