// kvtier::SelectStream: one Select stream (bidirectional), many steps.
//
//   auto stream = *client->OpenSelectStream();
//   v1::ContextSelect e;                  // anchor, head_queries, budget...
//   e.set_context_id(ctx);
//   e.set_max_blocks(8);
//   stream->Send({e});                    // step t+1, returns at once
//   ...                                   // compute step t meanwhile
//   auto selections = stream->Receive();  // the answer to the oldest Send
//   for (const Selection& s : *selections) { if (s.status.ok()) ... s.blocks }
//   stream->Close();
//
// Requests are pipelined: Send writes one SelectRequest and returns; the
// daemon answers each request once, in the order sent, and Receive returns
// those answers in that order (one Receive per Send). The stream numbers
// the requests itself (request_id 1, 2, ...) and checks that each response
// answers the oldest unanswered request with one selection per context.
//
// Each entry is checked before anything is sent: a context id, at most one
// budget (max_blocks or max_tokens), head_queries a multiple of head_dim,
// and an anchor of head_dim (pooled) or num_layers * head_dim (per layer)
// floats. Shapes are known for contexts this stream's Client opened with a
// profile it registered or fetched (Client::OpenContext); other contexts
// are checked by the daemon. A bad entry is INVALID_ARGUMENT naming
// "contexts[i].<field>" and nothing is sent.
//
// Failure: when the stream breaks (daemon gone, deadline, Cancel), Send and
// Receive return its status (UNAVAILABLE when the daemon ended the stream
// without one) and keep returning it; the stream must be replaced.
//
// Thread safety: one thread may Send while another Receives (gRPC allows
// one write and one read in flight); two concurrent Sends or two concurrent
// Receives are not allowed. Cancel may be called from any thread at any
// time. The stream must not outlive its Client.
#ifndef KVTIER_CLIENT_SELECT_STREAM_H_
#define KVTIER_CLIENT_SELECT_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "kvtier/v1/kvtier.grpc.pb.h"

namespace kvtier {

class Client;

// One context's answer: the daemon's per-context status (OK, or e.g.
// NOT_FOUND for a closed context, INVALID_ARGUMENT for a bad anchor) and
// the selected blocks in position order (handles valid while resident and
// pinned, until the next Select of the context or Release).
struct Selection {
  uint64_t context_id = 0;
  absl::Status status;
  google::protobuf::RepeatedPtrField<v1::SelectedBlock> blocks;
};

// The shape an anchor or head query is checked against.
struct ContextShape {
  uint32_t num_layers = 0;
  uint32_t head_dim = 0;
};

// Checks one entry (see above); shape may be null (only the structure is
// checked). INVALID_ARGUMENT naming "contexts[index].<field>".
absl::Status CheckContextSelect(const v1::ContextSelect& entry, const ContextShape* shape,
                                int index);

class SelectStream {
 public:
  // Use Client::OpenSelectStream.
  SelectStream(Client* client, v1::KvTier::Stub* stub, std::chrono::milliseconds deadline);
  SelectStream(const SelectStream&) = delete;
  SelectStream& operator=(const SelectStream&) = delete;
  // Cancels the stream if Close was not called.
  ~SelectStream();

  // Checks and writes one request holding `contexts`; returns its
  // request_id. INVALID_ARGUMENT for an empty list or a bad entry; the
  // stream's status once it is broken.
  absl::StatusOr<uint64_t> Send(absl::Span<const v1::ContextSelect> contexts);

  // Blocks for the answer to the oldest request not yet received: one
  // Selection per context sent, in the order sent. FAILED_PRECONDITION when
  // no request is outstanding; INTERNAL when the daemon's answer does not
  // match the request; the stream's status once it is broken.
  absl::StatusOr<std::vector<Selection>> Receive();

  // Cancels the stream: a blocked Receive returns CANCELLED. Any thread.
  void Cancel();

  // Half-closes, reads (and drops) the answers still outstanding and
  // returns the stream's final status. Call once, with no Send or Receive
  // in flight.
  absl::Status Close();

  // Requests sent and not yet received.
  size_t outstanding() const;

 private:
  struct Pending {
    uint64_t request_id;
    int contexts;
  };
  // Records the first failure; later calls return it.
  absl::Status Break(absl::Status status);
  absl::Status Broken() const;
  // Reads the stream's final status after Read failed.
  absl::Status FinishAfterReadFailed();
  // Drops the answers left and collects the final status (once).
  absl::Status Finish();

  Client* const client_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SelectRequest, v1::SelectResponse>> stream_;
  uint64_t next_id_ = 1;  // Send's thread only
  // Receive's thread, or Close / the destructor with nothing in flight.
  bool closed_ = false;
  bool finished_ = false;

  mutable absl::Mutex mu_;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier

#endif  // KVTIER_CLIENT_SELECT_STREAM_H_
