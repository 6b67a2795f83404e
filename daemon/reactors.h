// Reactors that finish a callback RPC at once with a fixed status: for
// requests rejected before any message is read. Each deletes itself in OnDone.
#ifndef KVTIER_DAEMON_REACTORS_H_
#define KVTIER_DAEMON_REACTORS_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_callback.h>

#include <atomic>
#include <string>

namespace kvtier::daemon {

template <class Request>
class FinishedReadReactor final : public grpc::ServerReadReactor<Request> {
 public:
  explicit FinishedReadReactor(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

template <class Response>
class FinishedWriteReactor final : public grpc::ServerWriteReactor<Response> {
 public:
  explicit FinishedWriteReactor(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

template <class Request, class Response>
class FinishedBidiReactor final : public grpc::ServerBidiReactor<Request, Response> {
 public:
  explicit FinishedBidiReactor(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

// The lifetime of a reactor whose steps also run off gRPC's reaction
// threads (on the I/O pool, or called back by the stream table). gRPC
// deletes nothing itself: it holds one reference until OnDone, and each
// step queued elsewhere holds one more, taken before it is queued and
// dropped after its last touch of the reactor (locks released). Without
// it a step that calls Finish could race OnDone on another thread, which
// deletes the reactor while the step still holds its mutex.
//
//   void OnDone() override { Unref(); }
class ReactorRefs {
 public:
  virtual ~ReactorRefs() = default;
  void Ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

 private:
  std::atomic<int> refs_{1};  // gRPC's, until OnDone
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_REACTORS_H_
