// HealthService: grpc.health.v1.Health on the callback API, with the
// daemon's authentication and stream limits (it replaces gRPC's default
// health service, which admits any caller and leaves Watch uncounted).
//
//  - Check and Watch resolve the caller like every other RPC (CallerOf):
//    with authentication on, a call without a tenant's credentials is
//    UNAUTHENTICATED.
//  - Known service names: "" (the daemon), "kvtier.v1.KvTier" and
//    "kvtier.v1.Admin"; any other is NOT_FOUND for Check and
//    SERVICE_UNKNOWN (then no updates) for Watch.
//  - A Watch stream is registered in the StreamTable: it counts against
//    server.max_streams_per_tenant and server.max_streams (RESOURCE_EXHAUSTED
//    past either), is cancelled when its token is revoked, and an unread
//    update is subject to server.stream_write_timeout_ms. It costs no
//    thread.
//  - HealthBoard::SetServing(false) sends NOT_SERVING to every Watch;
//    HealthBoard::Shutdown() also ends them (UNAVAILABLE) once that update
//    is written or its client is gone, so that a watcher never holds the
//    daemon's shutdown.
//
// One HealthBoard holds the status for every gRPC server of the daemon (the
// main one and the peer socket's per-uid ones); each server registers a
// HealthService of its own that reads it.
//
// Thread safety: every method is thread-safe.
#ifndef KVTIER_DAEMON_HEALTH_SERVICE_H_
#define KVTIER_DAEMON_HEALTH_SERVICE_H_

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace kvtier::daemon {

class Runtime;
class WatchReactor;

class HealthBoard {
 public:
  HealthBoard() = default;
  HealthBoard(const HealthBoard&) = delete;
  HealthBoard& operator=(const HealthBoard&) = delete;

  // The status every Check answers and every Watch is told.
  void SetServing(bool serving);
  // NOT_SERVING, then every Watch ends; later Watches end at once.
  void Shutdown();
  // Watch streams open now (for tests and stats).
  size_t watchers() const;

 private:
  friend class HealthService;
  friend class WatchReactor;
  grpc::health::v1::HealthCheckResponse::ServingStatus Current() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Remove(WatchReactor* w);

  mutable absl::Mutex mu_;
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<WatchReactor*> watchers_ ABSL_GUARDED_BY(mu_);
};

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  // Neither is owned; both outlive the service's server.
  HealthService(Runtime* runtime, HealthBoard* board) : runtime_(runtime), board_(board) {}

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* ctx,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* ctx,
      const grpc::health::v1::HealthCheckRequest* request) override;

 private:
  Runtime* const runtime_;
  HealthBoard* const board_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_HEALTH_SERVICE_H_
