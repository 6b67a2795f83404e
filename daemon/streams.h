// StreamTable: every open streaming call (Select, PutBlocks, GetBlocks)
// with its tenant and credentials, and the limits that keep one tenant's
// streams from costing the others:
//
//  - Open refuses a stream past server.max_streams_per_tenant (of its
//    tenant) or server.max_streams (of the daemon) with RESOURCE_EXHAUSTED
//    naming the limit. A refused stream costs no thread and no memory
//    beyond its call.
//  - CancelRevoked (after a reload, SIGHUP) aborts UNAUTHENTICATED every
//    stream whose credentials no longer resolve to its tenant: a revoked
//    token stops serving at once, not at its next call.
//  - AbortStalled (the runtime's reaper, every 100 ms) aborts
//    DEADLINE_EXCEEDED every stream whose current write has waited more
//    than server.stream_write_timeout_ms for its client to read.
//  - AcquireBytes bounds the bytes of written-but-unread messages
//    (GetBlocks) per tenant (server.max_queued_bytes_per_tenant) and in
//    all (server.max_queued_bytes). A stream past either waits without
//    producing its next message until bytes are released; a tenant with
//    nothing queued always gets one message (so a message larger than a
//    limit still goes, alone). A request is granted at once when it fits
//    and no earlier request of its own tenant waits: another tenant's
//    waiting streams never hold it up. Released bytes go to the waiting
//    tenants in turn (round robin, each tenant's requests in order), never
//    in one queue across tenants.
//
//   absl::StatusOr<std::unique_ptr<StreamTable::Ticket>> t =
//       runtime->streams()->Open("Select", tenant, CredentialsOf(ctx), this);
//   if (!t.ok()) return Finish(ToGrpcStatus(t.status()));
//
// A reactor that registers implements Stream and owns its Ticket as its
// last-declared member (destroyed first, while the reactor is whole).
//
// Thread safety: every method is thread-safe. Abort is called with the
// table's lock held (so the stream cannot be destroyed during the call): a
// Stream must never call the table (Open, ~Ticket, AcquireBytes,
// ReleaseBytes) while holding a lock that its Abort takes. WriteStarted /
// WriteDone take no lock.
#ifndef KVTIER_DAEMON_STREAMS_H_
#define KVTIER_DAEMON_STREAMS_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "daemon/tenant.h"

namespace kvtier::daemon {

struct StreamLimits {
  uint64_t max_streams = 4096;
  uint64_t max_streams_per_tenant = 256;
  uint64_t write_timeout_ms = 30000;
  uint64_t max_queued_bytes = 1ull << 30;
  uint64_t max_queued_bytes_per_tenant = 256ull << 20;
};

struct StreamStats {
  uint64_t open = 0;
  uint64_t refused = 0;       // Open past a limit
  uint64_t revoked = 0;       // aborted by CancelRevoked
  uint64_t stalled = 0;       // aborted by AbortStalled
  uint64_t queued_bytes = 0;  // held by unread messages now
  uint64_t waiting = 0;       // streams waiting for queued bytes now
};

class StreamTable {
 public:
  // What the table may ask of a registered stream.
  class Stream {
   public:
    // Ends the call with `status` as soon as it can: at once when nothing
    // of it is in flight, else when its in-flight step returns. A status of
    // DEADLINE_EXCEEDED (a stalled write) also cancels the write its
    // client does not read; an UNAUTHENTICATED one (revoked credentials)
    // lets a pending write complete so that the client gets the status.
    // `wait_dropped`: the stream's pending AcquireBytes was dropped (its
    // `ready` will never run). Called at most once per reason (a stall
    // may follow a revocation); must not block.
    virtual void Abort(const grpc::Status& status, bool wait_dropped) = 0;

   protected:
    ~Stream() = default;
  };

  class Ticket {
   public:
    ~Ticket();  // unregisters; returns held bytes; drops a pending wait
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;

    // The watchdog's clock for the write the stream just started / that
    // just completed.
    void WriteStarted();
    void WriteDone();
    // Takes `bytes` of the queued-bytes budgets. True when granted now;
    // otherwise false and `ready` runs once they are granted (on the
    // thread that released them, after the table's lock is released; the
    // stream must stay alive until it has run unless Abort said
    // wait_dropped). At most one pending request per ticket.
    bool AcquireBytes(uint64_t bytes, absl::AnyInvocable<void() &&> ready);
    // Returns bytes granted before (the message was read, or dropped).
    void ReleaseBytes(uint64_t bytes);

   private:
    friend class StreamTable;
    Ticket(StreamTable* table, std::string tenant, CallCredentials credentials, Stream* stream)
        : table_(table),
          tenant_(std::move(tenant)),
          credentials_(std::move(credentials)),
          stream_(stream) {}

    StreamTable* const table_;
    const std::string tenant_;
    const CallCredentials credentials_;
    Stream* const stream_;
    std::atomic<int64_t> write_since_ns_{0};  // 0: no write outstanding
    // Guarded by table_->mu_.
    uint64_t held_bytes_ = 0;
    uint64_t wanted_bytes_ = 0;  // > 0: waiting
    absl::AnyInvocable<void() &&> ready_;
    bool revoked_ = false;  // CancelRevoked aborted it
    bool stalled_ = false;  // AbortStalled aborted it (may follow a revoke)
  };

  explicit StreamTable(const StreamLimits& limits) : limits_(limits) {}

  // Registers a stream of `rpc` ("Select") for `tenant`; RESOURCE_EXHAUSTED
  // naming the limit when the tenant or the daemon is at its cap.
  absl::StatusOr<std::unique_ptr<Ticket>> Open(absl::string_view rpc, const std::string& tenant,
                                               CallCredentials credentials, Stream* stream);

  // Aborts (UNAUTHENTICATED) the streams whose credentials no longer
  // resolve to their tenant in `registry`. Returns how many.
  size_t CancelRevoked(const TenantRegistry& registry);

  // Aborts (DEADLINE_EXCEEDED) the streams whose write started before
  // now - write_timeout_ms. Returns how many.
  size_t AbortStalled(std::chrono::steady_clock::time_point now);

  StreamStats stats() const;
  uint64_t OpenOf(const std::string& tenant) const;

 private:
  struct PerTenant {
    uint64_t streams = 0;
    uint64_t queued_bytes = 0;
    std::deque<Ticket*> waiters;  // its AcquireBytes requests, in order
  };
  bool FitsLocked(const Ticket& t, uint64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Grants waiters that fit now; their `ready` callbacks go to *ready, to
  // run once the lock is released.
  void GrantWaitersLocked(std::vector<absl::AnyInvocable<void() &&>>* ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropWaitLocked(Ticket* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Close(Ticket* t);

  const StreamLimits limits_;
  mutable absl::Mutex mu_;
  absl::flat_hash_set<Ticket*> open_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, PerTenant> tenants_ ABSL_GUARDED_BY(mu_);
  // Tenants with a waiting request, in turn order (round robin).
  std::deque<std::string> turns_ ABSL_GUARDED_BY(mu_);
  uint64_t waiting_ ABSL_GUARDED_BY(mu_) = 0;  // requests waiting, all tenants
  uint64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t revoked_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t stalled_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_STREAMS_H_
