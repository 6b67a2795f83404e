#include "daemon/admin_service.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "daemon/convert.h"
#include "daemon/grpc_status.h"
#include "daemon/progress_reactor.h"
#include "daemon/reactors.h"
#include "daemon/tenant.h"
#include "daemon/version.h"
#include "storage/common/client_text.h"
#include "storage/common/limits.h"

namespace kvtier::daemon {
namespace {

// Progress messages are sent at most this often (plus the last one).
constexpr uint64_t kProgressEvery = 64;

// The most quarantined blocks one Verify answer lists (Stats counts all).
constexpr uint64_t kMaxListedQuarantined = 10000;

void FillQuarantined(const QuarantinedBlock& q, v1::BlockInfo* info) {
  info->set_profile_id(q.key.profile_id);
  info->set_block_id(q.key.block_id);
  info->set_tenant(q.key.tenant);
  info->set_tier(ToProto(q.tier));
  info->set_quarantined(true);
  info->set_quarantine_location(q.location);
  info->set_quarantine_reason(q.reason);
  info->set_quarantined_at_micros(q.found_micros);
}

}  // namespace

grpc::ServerUnaryReactor* AdminService::Refuse(grpc::CallbackServerContext* ctx,
                                               const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

void AdminService::AddTenantStats(v1::StatsResponse* resp) {
  for (const TenantPtr& t : runtime_->tenants().All()) {
    TenantUsage u = runtime_->store()->UsageOf(t->name);
    v1::TenantStats* ts = resp->add_tenants();
    ts->set_name(t->name);
    ts->set_role(t->role == Role::kAdmin ? "admin" : "data");
    ts->set_arena_bytes(u.arena_bytes);
    ts->set_device_bytes(u.device_bytes);
    ts->set_pinned_bytes(u.pinned_bytes);
    ts->set_staging_slots(u.staging_slots);
    ts->set_host_bytes(u.host_bytes);
    ts->set_nvme_bytes(u.nvme_bytes);
    ts->set_retained_bytes(u.retained_bytes);
    ts->set_profiles(u.profiles);
    ts->set_leases(u.leases);
    ts->set_contexts(runtime_->contexts()->OpenCount(t->name));
    const TenantQuotas& q = t->quotas;
    const std::pair<const char*, uint64_t> quotas[] = {{"device_bytes", q.device_bytes},
                                                       {"pinned_bytes", q.pinned_bytes},
                                                       {"staging_bytes", q.staging_bytes},
                                                       {"staging_slots", q.staging_slots},
                                                       {"contexts", q.contexts},
                                                       {"blocks_per_context", q.blocks_per_context},
                                                       {"host_bytes", q.host_bytes},
                                                       {"nvme_bytes", q.nvme_bytes},
                                                       {"retained_bytes", q.retained_bytes},
                                                       {"profiles", q.profiles},
                                                       {"leases", runtime_->LeaseLimitOf(*t)}};
    for (const auto& [name, value] : quotas) {
      if (value != 0) (*ts->mutable_quotas())[name] = value;
    }
  }
}

grpc::ServerUnaryReactor* AdminService::Stats(grpc::CallbackServerContext* ctx,
                                              const v1::StatsRequest*, v1::StatsResponse* resp) {
  if (auto caller = AdminCallerOf(runtime_->tenants(), ctx); !caller.ok()) {
    return Refuse(ctx, caller.status());
  }
  const Config& config = runtime_->config();
  BlockStoreStats stats = runtime_->store()->Stats();
  resp->set_version(kVersion);
  resp->set_uptime_s(runtime_->uptime_s());
  for (const TierUsage& usage : stats.tiers) {
    v1::TierStats* t = resp->add_tiers();
    t->set_tier(ToProto(usage.tier));
    t->set_backend(usage.backend);
    t->set_capacity_bytes(usage.capacity_bytes);
    t->set_used_bytes(usage.used_bytes);
    t->set_pinned_bytes(usage.pinned_bytes);
    t->set_releasing_bytes(usage.releasing_bytes);
    t->set_blocks(usage.blocks);
    t->set_location(usage.location);
    t->set_prefault_target_bytes(usage.prefault_target_bytes);
    t->set_prefaulted_bytes(usage.prefaulted_bytes);
    t->set_prefault_failed_bytes(usage.prefault_failed_bytes);
    t->set_prefault_error(usage.prefault_error);
  }
  resp->set_profiles(stats.profiles);
  resp->set_open_contexts(runtime_->contexts()->size());
  resp->set_active_leases(stats.active_leases);
  resp->set_quarantined_blocks(stats.quarantined_blocks);
  resp->set_staging_slots(stats.staging_slots);
  resp->set_evicted_blocks(stats.evicted_blocks);
  resp->set_retained_bytes(stats.retained_bytes);
  resp->set_checksum_failures_device(stats.checksum_failures[0]);
  resp->set_checksum_failures_host(stats.checksum_failures[1]);
  resp->set_checksum_failures_nvme(stats.checksum_failures[2]);
  if (runtime_->remote() != nullptr) {
    const remote::RemoteTierStats r = runtime_->remote()->remote_stats();
    v1::RemoteTierStats* out = resp->mutable_remote();
    for (const std::string& m : r.masters) out->add_masters(m);
    out->set_hits(r.hits);
    out->set_misses(r.misses);
    out->set_unavailable(r.unavailable);
    out->set_corrupt(r.corrupt);
    out->set_published(r.published);
    out->set_publish_dropped(r.publish_dropped);
    out->set_publish_failed(r.publish_failed);
    out->set_publish_queued(r.publish_queued);
    out->set_publish_cancelled(r.publish_cancelled);
    out->set_writeback_buffered_bytes(r.writeback_buffered_bytes);
    out->set_publish_policy(
        !config.remote.publish
            ? "off"
            : std::string(NameOf(kPublishPolicyNames, config.remote.publish_policy)));
    out->set_bytes_read(r.bytes_read);
    out->set_bytes_written(r.bytes_written);
  }
  AddTenantStats(resp);
  for (const auto& [key, value] : config.Flatten()) (*resp->mutable_config())[key] = value;
  (*resp->mutable_config())["gpu.probe"] = runtime_->device_probe().description;
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::ListBlocks(grpc::CallbackServerContext* ctx,
                                                   const v1::ListBlocksRequest* req,
                                                   v1::ListBlocksResponse* resp) {
  if (auto caller = AdminCallerOf(runtime_->tenants(), ctx); !caller.ok()) {
    return Refuse(ctx, caller.status());
  }
  std::map<std::pair<uint64_t, int>, std::pair<uint64_t, uint64_t>> counts;
  const uint32_t limit = req->limit();
  if (!v1::Tier_IsValid(req->tier())) {
    return Refuse(ctx, absl::InvalidArgumentError(absl::StrCat(
                           "tier: ", static_cast<int>(req->tier()), " is not a Tier")));
  }
  if (req->quarantined()) {
    runtime_->store()->ForEachQuarantined(req->profile_id(), [&](const QuarantinedBlock& q) {
      auto& c = counts[{q.key.profile_id, static_cast<int>(v1::TIER_UNSPECIFIED)}];
      ++c.first;
      if (static_cast<uint32_t>(resp->blocks_size()) < limit) {
        FillQuarantined(q, resp->add_blocks());
      }
    });
  }
  if (!req->quarantined())
    runtime_->store()->ForEachBlock(
        req->profile_id(), [&](const BlockKey& key, const BlockLocation& loc) {
          v1::Tier tier = ToProto(loc.tier);
          if (req->tier() != v1::TIER_UNSPECIFIED && req->tier() != tier) return;
          auto& c = counts[{key.profile_id, static_cast<int>(tier)}];
          ++c.first;
          c.second += loc.size_bytes;
          if (static_cast<uint32_t>(resp->blocks_size()) < limit) {
            v1::BlockInfo* info = resp->add_blocks();
            info->set_profile_id(key.profile_id);
            info->set_block_id(key.block_id);
            info->set_tier(tier);
            info->set_size_bytes(loc.size_bytes);
            info->set_durable(loc.durable);
            info->set_pinned(loc.pinned);
            info->set_retained(loc.retained);
            info->set_tenant(key.tenant);
          }
        });
  for (const auto& [k, v] : counts) {
    v1::TierProfileCount* c = resp->add_counts();
    c->set_profile_id(k.first);
    c->set_tier(static_cast<v1::Tier>(k.second));
    c->set_blocks(v.first);
    c->set_bytes(v.second);
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::ListContexts(grpc::CallbackServerContext* ctx,
                                                     const v1::ListContextsRequest*,
                                                     v1::ListContextsResponse* resp) {
  if (auto caller = AdminCallerOf(runtime_->tenants(), ctx); !caller.ok()) {
    return Refuse(ctx, caller.status());
  }
  std::vector<ContextInfo> contexts = runtime_->contexts()->List();
  std::sort(contexts.begin(), contexts.end(),
            [](const ContextInfo& a, const ContextInfo& b) { return a.context_id < b.context_id; });
  for (const ContextInfo& c : contexts) {
    v1::ContextInfo* info = resp->add_contexts();
    info->set_context_id(c.context_id);
    info->set_profile_id(c.profile_id);
    info->set_num_blocks(c.num_blocks);
    info->set_pinned_blocks(c.pinned_blocks);
    info->set_last_step(c.last_step);
    info->set_idle_ms(c.idle_ms);
    info->set_tenant(c.tenant);
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

absl::StatusOr<std::shared_ptr<void>> AdminService::StartOperation(const char* method) {
  std::atomic<uint64_t>& running = runtime_->admin_operations();
  const uint64_t max = runtime_->config().limits.max_admin_operations;
  if (running.fetch_add(1) >= max) {
    running.fetch_sub(1);
    return absl::ResourceExhaustedError(absl::StrCat(
        method, ": ", max, " Drain or Verify calls already running (limits.max_admin_operations)"));
  }
  // The deleter runs when the work's last copy of the slot goes.
  return std::shared_ptr<void>(nullptr, [&running](void*) { running.fetch_sub(1); });
}

grpc::ServerWriteReactor<v1::DrainProgress>* AdminService::Drain(grpc::CallbackServerContext* ctx,
                                                                 const v1::DrainRequest* req) {
  if (auto caller = AdminCallerOf(runtime_->tenants(), ctx); !caller.ok()) {
    return new FinishedWriteReactor<v1::DrainProgress>(ToGrpcStatus(caller.status()));
  }
  if (!v1::Tier_IsValid(req->tier()) || req->tier() == v1::TIER_REMOTE) {
    return new FinishedWriteReactor<v1::DrainProgress>(ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("tier: ", static_cast<int>(req->tier()), " is not a local tier"))));
  }
  absl::StatusOr<std::shared_ptr<void>> slot = StartOperation("Drain");
  if (!slot.ok()) return new FinishedWriteReactor<v1::DrainProgress>(ToGrpcStatus(slot.status()));
  BlockStore* store = runtime_->store();
  const bool device_only = req->tier() == v1::TIER_DEVICE;
  return new ProgressReactor<v1::DrainProgress>(
      [store, device_only](const std::function<void(const v1::DrainProgress&)>& post) {
        auto report = [&](uint64_t done, uint64_t total) {
          if (done % kProgressEvery != 0 && done != total) return;
          v1::DrainProgress p;
          p.set_blocks_done(done);
          p.set_blocks_total(total);
          post(p);
        };
        if (!device_only) return store->Drain(report);
        std::vector<BlockKey> keys;
        store->ForEachBlock(0, [&](const BlockKey& key, const BlockLocation& loc) {
          if (loc.tier == TierId::kDevice && !loc.pinned) keys.push_back(key);
        });
        uint64_t done = 0;
        for (const BlockKey& key : keys) {
          // Pinned or gone meanwhile: left as it is.
          absl::Status st = store->Evict(key, TierId::kDevice);
          if (!st.ok() && st.code() != absl::StatusCode::kNotFound &&
              st.code() != absl::StatusCode::kFailedPrecondition) {
            return st;
          }
          report(++done, keys.size());
        }
        if (keys.empty()) report(0, 0);
        return absl::OkStatus();
      },
      *std::move(slot));
}

grpc::ServerUnaryReactor* AdminService::ListProfiles(grpc::CallbackServerContext* ctx,
                                                     const v1::ListProfilesRequest*,
                                                     v1::ListProfilesResponse* resp) {
  if (auto caller = AdminCallerOf(runtime_->tenants(), ctx); !caller.ok()) {
    return Refuse(ctx, caller.status());
  }
  // (owner, profile_id) -> blocks, bytes
  std::map<std::pair<std::string, uint64_t>, std::pair<uint64_t, uint64_t>> counts;
  runtime_->store()->ForEachBlock(0, [&](const BlockKey& key, const BlockLocation& loc) {
    auto& c = counts[{key.tenant, key.profile_id}];
    ++c.first;
    c.second += loc.size_bytes;
  });
  for (const ModelProfile& p : runtime_->store()->ListProfiles()) {
    v1::ProfileInfo* info = resp->add_profiles();
    info->set_profile_id(p.profile_id);
    *info->mutable_profile() = ToProto(p);
    info->set_block_size_bytes(BlockSizeBytes(p));
    info->set_owner(p.owner);
    const auto& c = counts[{p.owner, p.profile_id}];
    info->set_blocks(c.first);
    info->set_bytes(c.second);
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::Evict(grpc::CallbackServerContext* ctx,
                                              const v1::EvictRequest* req,
                                              v1::EvictResponse* resp) {
  if (auto caller = AdminCallerOf(runtime_->tenants(), ctx); !caller.ok()) {
    return Refuse(ctx, caller.status());
  }
  const uint64_t limit = runtime_->config().limits.max_batch_blocks;
  if (req->block_ids_size() == 0 || static_cast<uint64_t>(req->block_ids_size()) > limit) {
    return Refuse(ctx, absl::InvalidArgumentError(
                           absl::StrCat("block_ids: ", req->block_ids_size(),
                                        " ids; between 1 and limits.max_batch_blocks = ", limit)));
  }
  if (!v1::Tier_IsValid(req->tier()) || req->tier() == v1::TIER_REMOTE) {
    return Refuse(ctx, absl::InvalidArgumentError(absl::StrCat(
                           "tier: ", static_cast<int>(req->tier()), " is not a local tier")));
  }
  const std::string tenant = req->tenant().empty() ? "default" : req->tenant();
  if (tenant.size() > kMaxTenantBytes) {
    return Refuse(ctx, absl::InvalidArgumentError(absl::StrCat("tenant: ", ClientText(tenant),
                                                               " is not a tenant name (at most ",
                                                               kMaxTenantBytes, " bytes)")));
  }
  if (auto profile = runtime_->store()->GetProfile(tenant, req->profile_id()); !profile.ok()) {
    return Refuse(ctx, absl::InvalidArgumentError(absl::StrCat("profile_id: ", req->profile_id(),
                                                               " is not a profile of tenant \"",
                                                               ClientText(tenant), "\"")));
  }
  const TierId tier = req->tier() == v1::TIER_DEVICE ? TierId::kDevice
                      : req->tier() == v1::TIER_HOST ? TierId::kHost
                                                     : TierId::kNvme;
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  BlockingPool* pool = runtime_->blocking_pool();
  BlockStore* store = runtime_->store();
  if (!pool->Submit([reactor, store, req, resp, tier, tenant] {
        for (const std::string& id : req->block_ids()) {
          ToItemStatus(store->Evict(BlockKey{tenant, req->profile_id(), id}, tier),
                       resp->add_statuses());
        }
        reactor->Finish(grpc::Status::OK);
      })) {
    reactor->Finish(ToGrpcStatus(pool->QueueFullStatus()));
  }
  return reactor;
}

grpc::ServerWriteReactor<v1::VerifyProgress>* AdminService::Verify(grpc::CallbackServerContext* ctx,
                                                                   const v1::VerifyRequest* req) {
  if (auto caller = AdminCallerOf(runtime_->tenants(), ctx); !caller.ok()) {
    return new FinishedWriteReactor<v1::VerifyProgress>(ToGrpcStatus(caller.status()));
  }
  absl::StatusOr<std::shared_ptr<void>> slot = StartOperation("Verify");
  if (!slot.ok()) return new FinishedWriteReactor<v1::VerifyProgress>(ToGrpcStatus(slot.status()));
  BlockStore* store = runtime_->store();
  const uint64_t profile_id = req->profile_id();
  return new ProgressReactor<v1::VerifyProgress>(
      [store, profile_id](const std::function<void(const v1::VerifyProgress&)>& post) {
        uint64_t corrupt = 0;
        v1::VerifyProgress pending;
        absl::Status st =
            store->Verify(profile_id, [&](uint64_t done, uint64_t total, const BlockKey* bad) {
              if (bad != nullptr) {
                ++corrupt;
                pending.add_corrupt_block_ids(bad->block_id);
              }
              if (done % kProgressEvery != 0 && done != total && bad == nullptr) return;
              pending.set_blocks_checked(done);
              pending.set_blocks_total(total);
              pending.set_corrupt_blocks(corrupt);
              post(pending);
              pending.clear_corrupt_block_ids();
            });
        if (!st.ok()) return st;
        // The last message: every quarantined block, whoever found it.
        pending.set_done(true);
        uint64_t listed = 0;
        store->ForEachQuarantined(profile_id, [&](const QuarantinedBlock& q) {
          if (listed++ < kMaxListedQuarantined) FillQuarantined(q, pending.add_quarantined());
        });
        post(pending);
        return absl::OkStatus();
      },
      *std::move(slot));
}

}  // namespace kvtier::daemon
