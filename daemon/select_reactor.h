// The Select bidirectional stream: one reactor per call.
//
// Each SelectRequest read is answered (SelectHandler, select_handler.h) on
// a thread of the runtime's Select pool (select.threads; on the gRPC
// callback thread that delivered it when that is 0), where tenants take
// turns by deficit round robin, each request costing the blocks its
// contexts hold (SelectHandler::Cost); the next request is read only once
// the previous one is answered, so a stream has at most one request
// waiting. When the tenant's queue is full (select.queue_limit_per_tenant,
// select.queue_limit) the call finishes RESOURCE_EXHAUSTED naming the key.
// Responses are queued and written in request order, one write
// outstanding at a time.
// At most select.max_queued_responses responses wait: beyond that the
// reactor stops reading until the client reads. When the client closes its
// side, the queued responses are written and the call finishes OK; when
// the client cancels or goes away, pending writes fail and the call
// finishes CANCELLED. The reactor deletes itself once OnDone has run and
// no answer is queued for it. Leases taken by
// its Selects belong to the contexts, not to the stream: they outlive it.
//
// Thread safety: OnReadDone and OnWriteDone may run concurrently on
// different threads; the queue and the call's state are under a mutex.
// Reads are never concurrent (one outstanding), so the handler is used by
// one thread at a time.
#ifndef KVTIER_DAEMON_SELECT_REACTOR_H_
#define KVTIER_DAEMON_SELECT_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include "daemon/runtime.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::daemon {

grpc::ServerBidiReactor<v1::SelectRequest, v1::SelectResponse>* NewSelectReactor(
    Runtime* runtime, grpc::CallbackServerContext* ctx);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_SELECT_REACTOR_H_
