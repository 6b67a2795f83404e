// DaemonMetrics: what kvtierd exports on /metrics (metrics.listen_address).
//
// Read at scrape time from the runtime (gauges and totals kept elsewhere):
//   kvtier_tier_capacity_bytes{tier}, kvtier_tier_used_bytes{tier},
//   kvtier_tier_pinned_bytes{tier}, kvtier_tier_blocks{tier}
//   kvtier_reads_total{tier}, kvtier_read_misses_total,
//   kvtier_promotions_total{tier}, kvtier_demotions_total,
//   kvtier_blocks, kvtier_quarantined_blocks, kvtier_evicted_blocks_total,
//   kvtier_checksum_failures_total{tier}, kvtier_retained_bytes,
//   kvtier_leases_active, kvtier_staging_slots_reserved,
//   kvtier_contexts_open, kvtier_prefetched_blocks_total,
//   kvtier_deferred_promotions_done_total, kvtier_summaries_deferred_total,
//   kvtier_summaries_pending, kvtier_get_in_flight_bytes,
//   kvtier_get_copied_over_cap_total,
//   kvtier_prefetch_dropped_total, kvtier_blocks_without_summary_total,
//   kvtier_io_queue_waiting, kvtier_io_queue_rejected_total,
//   kvtier_uptime_seconds, kvtier_build_info{version}
// Counted as calls happen:
//   kvtier_rpc_total{method,code}             every RPC that finished
//   kvtier_rpc_duration_seconds{method}        histogram, arrival to status
//   kvtier_select_phase_seconds{phase}         histogram per Select request:
//                                              check, select, build, pin
//   kvtier_select_contexts_total               contexts selected
//   kvtier_select_blocks_total, kvtier_select_new_blocks_total  (churn)
//   kvtier_select_promotions_deferred_total    chosen blocks past the
//                                              inline promotion budget
//   kvtier_select_mass_heads_total{path}       retrieval heads the mass
//                                              tree served: "descended" the
//                                              tree or "reused" the pages
//                                              of earlier steps
//   kvtier_select_mass_pages_opened_total      blocks whose retrieval keys
//                                              the mass tree read (per head)
//   kvtier_put_bytes_total, kvtier_put_blocks_total   blocks newly stored
//   kvtier_get_bytes_total                     bytes returned by GetBlocks
// Planned (not exported yet): per-tenant labels.
//
// Thread safety: all methods are thread-safe.
#ifndef KVTIER_DAEMON_METRICS_DAEMON_METRICS_H_
#define KVTIER_DAEMON_METRICS_DAEMON_METRICS_H_

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/support/server_interceptor.h>

#include "absl/strings/string_view.h"
#include "daemon/metrics/registry.h"

namespace kvtier::daemon {

class Runtime;

class DaemonMetrics {
 public:
  // runtime must outlive this object (collectors read it at scrape time).
  explicit DaemonMetrics(Runtime* runtime);

  metrics::Registry* registry() { return &registry_; }
  std::string Render() const { return registry_.Render(); }

  // The gRPC server interceptor that counts RPCs by method and code.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> InterceptorFactory();

  void RpcFinished(absl::string_view method, int code, double seconds);
  void SelectPhases(double check_s, double select_s, double build_s, double pin_s, int contexts);
  // Blocks a Select request returned, and how many of them the context's
  // previous Select did not (churn = rate(new) / rate(selected)).
  void SelectChurn(uint64_t selected, uint64_t fresh);
  // Chosen blocks answered PENDING because the request's inline promotion
  // budget was spent.
  void SelectPromotionsDeferred(uint64_t blocks);
  // The mass tree's work in a Select request (index::SelectResult's
  // mass_heads_reused, mass_heads_descended, mass_pages_opened, summed).
  void SelectMassTree(uint64_t heads_reused, uint64_t heads_descended, uint64_t pages_opened);
  void BlocksPut(uint64_t blocks, uint64_t bytes);
  void BytesGot(uint64_t bytes);

 private:
  metrics::Registry registry_;
  metrics::CounterFamily* rpcs_;
  metrics::HistogramFamily* rpc_seconds_;
  metrics::Histogram* phase_[4];
  metrics::Counter* select_contexts_;
  metrics::Counter* select_blocks_;
  metrics::Counter* select_new_blocks_;
  metrics::Counter* select_deferred_;
  metrics::Counter* mass_reused_;
  metrics::Counter* mass_descended_;
  metrics::Counter* mass_pages_opened_;
  metrics::Counter* put_bytes_;
  metrics::Counter* put_blocks_;
  metrics::Counter* get_bytes_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_METRICS_DAEMON_METRICS_H_
