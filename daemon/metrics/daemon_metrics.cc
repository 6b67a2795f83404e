#include "daemon/metrics/daemon_metrics.h"

#include <google/protobuf/descriptor.h>
#include <grpcpp/support/interceptor.h>

#include <algorithm>
#include <array>
#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_replace.h"
#include "daemon/blocking_pool.h"
#include "daemon/context_manager.h"
#include "daemon/prefetcher.h"
#include "daemon/runtime.h"
#include "daemon/summarizer.h"
#include "daemon/version.h"
#include "storage/store/block_store.h"

namespace kvtier::daemon {
namespace {

using metrics::Labels;
using metrics::Writer;

const char* const kPhases[4] = {"check", "select", "build", "pin"};

// "/kvtier.v1.KvTier/Select" -> "kvtier.v1.KvTier/Select" when the method
// exists in this binary; "unknown" otherwise, so a client cannot create
// series with names of its own choosing.
std::string MethodLabel(const char* path) {
  if (path == nullptr || path[0] != '/') return "unknown";
  std::string name(path + 1);
  const std::string dotted = absl::StrReplaceAll(name, {{"/", "."}});
  if (google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(dotted) == nullptr) {
    return "unknown";
  }
  return name;
}

class RpcInterceptor final : public grpc::experimental::Interceptor {
 public:
  RpcInterceptor(grpc::experimental::ServerRpcInfo* info, DaemonMetrics* metrics)
      : metrics_(metrics),
        method_(MethodLabel(info->method())),
        start_(std::chrono::steady_clock::now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      metrics_->RpcFinished(method_, status.error_code(), seconds);
    }
    methods->Proceed();
  }

 private:
  DaemonMetrics* const metrics_;
  const std::string method_;
  const std::chrono::steady_clock::time_point start_;
};

class RpcInterceptorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcInterceptorFactory(DaemonMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new RpcInterceptor(info, metrics_);
  }

 private:
  DaemonMetrics* const metrics_;
};

// The canonical name of a gRPC status code (abseil's, the same words),
// built once: the interceptor labels every call with it.
const char* CodeName(int code) {
  static const std::array<std::string, 17> kNames = [] {
    std::array<std::string, 17> names;
    for (int c = 0; c < 17; ++c)
      names[c] = absl::StatusCodeToString(static_cast<absl::StatusCode>(c));
    return names;
  }();
  return code >= 0 && code <= 16 ? kNames[code].c_str() : "UNKNOWN";
}

// The remote tier's counters (only when tiers.remote is on).
void CollectRemote(const remote::RemoteStore& store, Writer& w) {
  const remote::RemoteTierStats r = store.remote_stats();
  const char* lookups = "Remote tier lookups of blocks no local tier held, by result";
  for (auto [result, n] : {std::pair<const char*, uint64_t>{"hit", r.hits},
                           {"miss", r.misses},
                           {"unavailable", r.unavailable},
                           {"recent_miss", r.miss_cache_hits},
                           {"corrupt", r.corrupt}}) {
    w.Counter("kvtier_remote_lookups_total", lookups, {{"result", result}}, static_cast<double>(n));
  }
  const char* publish = "Blocks offered to the remote tier (by publish_policy), by outcome";
  for (auto [result, n] : {std::pair<const char*, uint64_t>{"published", r.published},
                           {"dropped", r.publish_dropped},
                           {"failed", r.publish_failed},
                           {"skipped", r.publish_skipped},
                           {"cancelled", r.publish_cancelled}}) {
    w.Counter("kvtier_remote_publish_total", publish, {{"result", result}}, static_cast<double>(n));
  }
  w.Gauge("kvtier_remote_publish_queued", "Blocks waiting to be published", {},
          static_cast<double>(r.publish_queued));
  w.Gauge("kvtier_remote_writeback_buffered_bytes",
          "Write-back: bytes of released blocks queued or being sent", {},
          static_cast<double>(r.writeback_buffered_bytes));
  w.Counter("kvtier_remote_bytes_total", "Payload bytes read from / written to the remote tier",
            {{"direction", "read"}}, static_cast<double>(r.bytes_read));
  w.Counter("kvtier_remote_bytes_total", "Payload bytes read from / written to the remote tier",
            {{"direction", "written"}}, static_cast<double>(r.bytes_written));
  w.Counter("kvtier_remote_deleted_total", "Remote copies removed by Delete", {},
            static_cast<double>(r.deleted));
  w.Gauge("kvtier_remote_masters", "Masters in the cluster client's slot map", {},
          static_cast<double>(r.masters.size()));
  const char* redirects = "Cluster redirections followed (MOVED, ASK) and TRYAGAIN retries";
  w.Counter("kvtier_remote_redirects_total", redirects, {{"kind", "moved"}},
            static_cast<double>(r.cluster.moved));
  w.Counter("kvtier_remote_redirects_total", redirects, {{"kind", "ask"}},
            static_cast<double>(r.cluster.ask));
  w.Counter("kvtier_remote_redirects_total", redirects, {{"kind", "tryagain"}},
            static_cast<double>(r.cluster.try_again));
  const char* errors = "Cluster errors: failed connects, timeouts, error replies";
  w.Counter("kvtier_remote_errors_total", errors, {{"kind", "connect"}},
            static_cast<double>(r.cluster.connect_failures));
  w.Counter("kvtier_remote_errors_total", errors, {{"kind", "timeout"}},
            static_cast<double>(r.cluster.timeouts));
  w.Counter("kvtier_remote_errors_total", errors, {{"kind", "reply"}},
            static_cast<double>(r.cluster.errors));
  w.Counter("kvtier_remote_slot_map_refreshes_total", "CLUSTER SLOTS refreshes", {},
            static_cast<double>(r.cluster.slot_map_refreshes));
  w.Counter("kvtier_remote_replica_reads_total",
            "Values fetched from replicas (tiers.remote.read_from_replicas)", {},
            static_cast<double>(r.cluster.replica_reads));
}

// What each tenant of auth.tenants_file holds (only "default" when auth is
// off), labelled by tenant name; bounded by the tenants file.
void CollectTenants(Runtime* rt, Writer& w) {
  for (const TenantPtr& t : rt->tenants().All()) {
    const TenantUsage u = rt->store()->UsageOf(t->name);
    const Labels tenant = {{"tenant", t->name}};
    w.Gauge("kvtier_tenant_device_bytes", "Device-arena bytes a tenant's blocks hold", tenant,
            static_cast<double>(u.device_bytes));
    w.Gauge("kvtier_tenant_pinned_bytes", "Device bytes a tenant's leases pin", tenant,
            static_cast<double>(u.pinned_bytes));
    w.Gauge("kvtier_tenant_host_bytes", "Host-tier bytes a tenant's blocks hold", tenant,
            static_cast<double>(u.host_bytes));
    w.Gauge("kvtier_tenant_nvme_bytes", "NVMe bytes a tenant's blocks hold", tenant,
            static_cast<double>(u.nvme_bytes));
    w.Gauge("kvtier_tenant_leases", "Leases a tenant holds", tenant, static_cast<double>(u.leases));
    w.Gauge("kvtier_tenant_contexts", "Contexts a tenant has open", tenant,
            static_cast<double>(rt->contexts()->OpenCount(t->name)));
  }
}

void CollectRuntime(Runtime* rt, Writer& w) {
  if (rt->remote() != nullptr) CollectRemote(*rt->remote(), w);
  CollectTenants(rt, w);
  const BlockStoreStats s = rt->store()->Stats();
  for (const TierUsage& t : s.tiers) {
    const Labels tier = {{"tier", std::string(TierName(t.tier))}};
    w.Gauge("kvtier_tier_capacity_bytes", "Capacity of each tier, bytes", tier,
            static_cast<double>(t.capacity_bytes));
    w.Gauge("kvtier_tier_used_bytes", "Bytes held in each tier", tier,
            static_cast<double>(t.used_bytes));
    w.Gauge("kvtier_tier_pinned_bytes", "Bytes pinned by leases in each tier", tier,
            static_cast<double>(t.pinned_bytes));
    w.Gauge("kvtier_tier_blocks", "Block copies in each tier", tier, static_cast<double>(t.blocks));
    const int i = static_cast<int>(t.tier);
    w.Counter("kvtier_reads_total",
              "Block reads (Get, handles for Select and GetBlocks) by the fastest tier that "
              "held the block when asked",
              tier, static_cast<double>(s.reads_from[i]));
    if (t.tier != TierId::kNvme) {
      w.Counter("kvtier_promotions_total",
                "Copies made into a tier from a slower one (host: from NVMe; device: from host)",
                tier, static_cast<double>(s.promotions[i]));
    }
    w.Counter("kvtier_checksum_failures_total",
              "Checksum mismatches found, by the tier of the bad copy", tier,
              static_cast<double>(s.checksum_failures[static_cast<int>(t.tier)]));
  }
  w.Gauge("kvtier_blocks", "Blocks stored", {}, static_cast<double>(s.blocks));
  w.Counter("kvtier_read_misses_total", "Block reads of blocks not stored (or quarantined)", {},
            static_cast<double>(s.read_misses));
  w.Counter("kvtier_demotions_total", "Last copies moved from host memory to NVMe to make room", {},
            static_cast<double>(s.demotions));
  w.Gauge("kvtier_quarantined_blocks", "Blocks quarantined after a checksum mismatch", {},
          static_cast<double>(s.quarantined_blocks));
  w.Counter("kvtier_evicted_blocks_total", "Blocks given up by the cache (not deletes)", {},
            static_cast<double>(s.evicted_blocks));
  w.Gauge("kvtier_retained_bytes", "Bytes of retained blocks (never evicted)", {},
          static_cast<double>(s.retained_bytes));
  w.Gauge("kvtier_leases_active", "Leases pinning device copies", {},
          static_cast<double>(s.active_leases));
  w.Gauge("kvtier_staging_slots_reserved", "Staging slots reserved by clients", {},
          static_cast<double>(s.staging_slots));
  w.Gauge("kvtier_contexts_open", "Open contexts", {}, static_cast<double>(rt->contexts()->size()));
  w.Counter("kvtier_prefetched_blocks_total", "Blocks the prefetcher brought into host memory", {},
            static_cast<double>(rt->prefetcher()->promoted()));
  w.Counter("kvtier_deferred_promotions_done_total",
            "Blocks the prefetcher brought into the device arena for Selects that deferred them",
            {}, static_cast<double>(rt->prefetcher()->promoted_to_device()));
  w.Counter("kvtier_summaries_deferred_total",
            "Puts acknowledged before their key summary (server.defer_summaries)", {},
            static_cast<double>(s.summaries_deferred));
  w.Gauge("kvtier_summaries_pending", "Stored blocks whose key summary is still being computed", {},
          static_cast<double>(s.summaries_pending));
  w.Gauge("kvtier_get_in_flight_bytes",
          "Host-tier bytes GetBlocks responses hold in place while they are sent", {},
          static_cast<double>(s.view_bytes));
  w.Counter("kvtier_get_copied_over_cap_total",
            "Blocks GetBlocks sent from a private copy because tiers.host."
            "max_in_flight_get_bytes was reached",
            {}, static_cast<double>(s.views_copied_over_cap));
  w.Counter("kvtier_prefetch_dropped_total", "Prefetch keys dropped because the queue was full", {},
            static_cast<double>(rt->prefetcher()->dropped()));
  w.Counter("kvtier_blocks_without_summary_total",
            "Blocks stored without a key summary (keys not finite)", {},
            static_cast<double>(rt->summarizer()->blocks_without_summary()));
  const BlockingPoolStats io = rt->blocking_pool()->stats();
  w.Gauge("kvtier_io_queue_waiting", "Calls waiting for an I/O thread", {},
          static_cast<double>(io.queued));
  w.Counter("kvtier_io_queue_rejected_total",
            "Calls refused because server.io_queue_limit calls already waited", {},
            static_cast<double>(io.rejected));
  const StreamStats streams = rt->streams()->stats();
  w.Gauge("kvtier_streams_open", "Open Select, PutBlocks and GetBlocks streams", {},
          static_cast<double>(streams.open));
  w.Counter("kvtier_streams_refused_total",
            "Streams refused at server.max_streams_per_tenant or server.max_streams", {},
            static_cast<double>(streams.refused));
  w.Counter("kvtier_streams_cancelled_total", "Streams the daemon ended, by reason",
            {{"reason", "revoked"}}, static_cast<double>(streams.revoked));
  w.Counter("kvtier_streams_cancelled_total", "Streams the daemon ended, by reason",
            {{"reason", "stalled"}}, static_cast<double>(streams.stalled));
  w.Gauge("kvtier_stream_queued_bytes", "Bytes of GetBlocks messages written but not yet read", {},
          static_cast<double>(streams.queued_bytes));
  w.Gauge("kvtier_stream_waiting",
          "GetBlocks streams waiting for their tenant's or the daemon's "
          "queued-bytes budget",
          {}, static_cast<double>(streams.waiting));
  w.Gauge("kvtier_uptime_seconds", "Seconds since the daemon started", {},
          static_cast<double>(rt->uptime_s()));
  w.Gauge("kvtier_build_info", "Always 1; the version as a label", {{"version", kVersion}}, 1);
}

}  // namespace

DaemonMetrics::DaemonMetrics(Runtime* runtime) {
  rpcs_ = registry_.AddCounter("kvtier_rpc_total", "RPCs finished, by method and gRPC status code",
                               {"method", "code"});
  rpc_seconds_ = registry_.AddHistogram("kvtier_rpc_duration_seconds",
                                        "RPC time from arrival to status (streams: their life)",
                                        {"method"}, metrics::LatencyBuckets());
  metrics::HistogramFamily* phases = registry_.AddHistogram(
      "kvtier_select_phase_seconds",
      "Time of each phase of a Select request: check (entries, locks), select (the index), "
      "build (response blocks), pin (residency and leases)",
      {"phase"}, metrics::LatencyBuckets());
  for (int i = 0; i < 4; ++i) phase_[i] = phases->With({kPhases[i]});
  select_contexts_ = registry_
                         .AddCounter("kvtier_select_contexts_total",
                                     "Contexts selected (entries of Select requests)", {})
                         ->With({});
  select_blocks_ =
      registry_
          .AddCounter("kvtier_select_blocks_total", "Blocks Select returned (all contexts)", {})
          ->With({});
  select_new_blocks_ =
      registry_
          .AddCounter("kvtier_select_new_blocks_total",
                      "Blocks Select returned that the context's previous Select did not "
                      "(stability churn)",
                      {})
          ->With({});
  select_deferred_ =
      registry_
          .AddCounter("kvtier_select_promotions_deferred_total",
                      "Chosen blocks in host memory that a Select answered PENDING because "
                      "its inline promotion budget (select.inline_promotion_bytes) was spent; "
                      "promoted to the arena off the response path",
                      {})
          ->With({});
  metrics::CounterFamily* mass_heads = registry_.AddCounter(
      "kvtier_select_mass_heads_total",
      "Retrieval heads the mass scorer's tree served: descended (screened the summaries) or "
      "reused (reopened the pages of earlier steps; select.mass_tree_reuse_steps)",
      {"path"});
  mass_reused_ = mass_heads->With({"reused"});
  mass_descended_ = mass_heads->With({"descended"});
  mass_pages_opened_ =
      registry_
          .AddCounter("kvtier_select_mass_pages_opened_total",
                      "Blocks whose retrieval-head keys the mass scorer's tree read, per head", {})
          ->With({});
  put_bytes_ =
      registry_.AddCounter("kvtier_put_bytes_total", "Bytes of blocks newly stored", {})->With({});
  put_blocks_ =
      registry_.AddCounter("kvtier_put_blocks_total", "Blocks newly stored", {})->With({});
  get_bytes_ = registry_
                   .AddCounter("kvtier_get_bytes_total",
                               "Payload bytes returned by GetBlocks (bytes mode)", {})
                   ->With({});
  registry_.AddCollector([runtime](Writer& w) { CollectRuntime(runtime, w); });
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
DaemonMetrics::InterceptorFactory() {
  return std::make_unique<RpcInterceptorFactory>(this);
}

void DaemonMetrics::RpcFinished(absl::string_view method, int code, double seconds) {
  const std::string m(method);
  rpcs_->With({m, CodeName(code)})->Add(1);
  rpc_seconds_->With({m})->Observe(seconds);
}

void DaemonMetrics::SelectPhases(double check_s, double select_s, double build_s, double pin_s,
                                 int contexts) {
  const double s[4] = {check_s, select_s, build_s, pin_s};
  for (int i = 0; i < 4; ++i) phase_[i]->Observe(s[i]);
  select_contexts_->Add(contexts);
}

void DaemonMetrics::SelectChurn(uint64_t selected, uint64_t fresh) {
  select_blocks_->Add(static_cast<double>(selected));
  select_new_blocks_->Add(static_cast<double>(fresh));
}

void DaemonMetrics::SelectPromotionsDeferred(uint64_t blocks) {
  select_deferred_->Add(static_cast<double>(blocks));
}

void DaemonMetrics::SelectMassTree(uint64_t heads_reused, uint64_t heads_descended,
                                   uint64_t pages_opened) {
  mass_reused_->Add(static_cast<double>(heads_reused));
  mass_descended_->Add(static_cast<double>(heads_descended));
  mass_pages_opened_->Add(static_cast<double>(pages_opened));
}

void DaemonMetrics::BlocksPut(uint64_t blocks, uint64_t bytes) {
  put_blocks_->Add(static_cast<double>(blocks));
  put_bytes_->Add(static_cast<double>(bytes));
}

void DaemonMetrics::BytesGot(uint64_t bytes) { get_bytes_->Add(static_cast<double>(bytes)); }

}  // namespace kvtier::daemon
