#include "daemon/select_reactor.h"

#include <google/protobuf/arena.h>

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/grpc_status.h"
#include "daemon/reactors.h"
#include "daemon/select_handler.h"
#include "daemon/streams.h"
#include "daemon/tenant.h"

namespace kvtier::daemon {
namespace {

class SelectReactor final : public grpc::ServerBidiReactor<v1::SelectRequest, v1::SelectResponse>,
                            public StreamTable::Stream {
 public:
  SelectReactor(Runtime* runtime, grpc::CallbackServerContext* ctx, size_t max_queued)
      : runtime_(runtime), ctx_(ctx), max_queued_(max_queued) {}

  // Registers with the stream table and starts reading, or finishes with
  // why it cannot.
  void Start(Runtime* runtime, const Tenant& tenant, CallCredentials credentials) {
    absl::StatusOr<std::unique_ptr<StreamTable::Ticket>> ticket =
        runtime->streams()->Open("Select", tenant.name, std::move(credentials), this);
    absl::StatusOr<std::unique_ptr<SelectHandler>> handler =
        ticket.ok() ? SelectHandler::Create(runtime, tenant.name) : ticket.status();
    absl::MutexLock lock(&mu_);
    if (!handler.ok()) {
      FinishLocked(ToGrpcStatus(handler.status()));
      return;
    }
    handler_ = std::move(*handler);
    ticket_ = std::move(*ticket);
    tenant_ = tenant.name;
    if (!finished_) StartRead(&request_);  // else aborted since Open
  }

  void Abort(const grpc::Status& status, bool /*wait_dropped*/) override {
    absl::MutexLock lock(&mu_);
    FinishLocked(status);  // no-op when finished (a stall after a revoke)
    // A write its client does not read: cancelled, else the call's end
    // waits behind it.
    if (writing_ && status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      ctx_->TryCancel();
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client closed its side, or the call is cancelled
      absl::MutexLock lock(&mu_);
      reads_done_ = true;
      MaybeFinishLocked();
      return;
    }
    // Answered on a Select thread, the tenants taking turns (inline when
    // select.threads is 0); the next read starts once it is answered.
    BlockingPool* pool = runtime_->select_pool();
    std::unique_ptr<Outgoing> out = TakeOutgoing();
    Ref();  // the queued answer's
    if (!pool->Submit(
            tenant_,
            [this, out = std::move(out)]() mutable {
              Answer(std::move(out));
              Unref();
            },
            handler_->Cost(request_))) {
      {
        absl::MutexLock lock(&mu_);
        FinishLocked(ToGrpcStatus(pool->QueueFullStatus(tenant_)));
      }
      Unref();
    }
  }

  void OnWriteDone(bool ok) override {
    ticket_->WriteDone();
    absl::MutexLock lock(&mu_);
    writing_ = false;
    spare_.push_back(std::move(queue_.front()));
    queue_.pop_front();
    if (finished_) return;  // aborted: nothing more is written or read
    if (!ok) {              // the client is gone: nobody reads what is left
      queue_.clear();
      FinishLocked(ToGrpcStatus(absl::CancelledError("Select: the client went away")));
      return;
    }
    if (!queue_.empty()) StartNextWriteLocked();
    if (read_paused_ && !reads_done_ && !finished_ && queue_.size() < max_queued_) {
      read_paused_ = false;
      StartRead(&request_);
    }
    MaybeFinishLocked();
  }

  void OnDone() override { Unref(); }

 private:
  // A response with its own arena. Responses are built on an arena with an
  // inline first block and the arenas are reused, so a typical response
  // (64 blocks per context) costs no heap allocation.
  struct Outgoing {
    static constexpr size_t kInlineBytes = 16 << 10;
    Outgoing() : arena(Options(this)) { Reset(); }
    static google::protobuf::ArenaOptions Options(Outgoing* self) {
      google::protobuf::ArenaOptions options;
      options.initial_block = self->inline_block;
      options.initial_block_size = kInlineBytes;
      return options;
    }
    void Reset() {
      arena.Reset();
      response = google::protobuf::Arena::CreateMessage<v1::SelectResponse>(&arena);
    }
    alignas(8) char inline_block[kInlineBytes];
    google::protobuf::Arena arena;
    v1::SelectResponse* response = nullptr;
  };

  std::unique_ptr<Outgoing> TakeOutgoing() {
    {
      absl::MutexLock lock(&mu_);
      if (!spare_.empty()) {
        std::unique_ptr<Outgoing> out = std::move(spare_.back());
        spare_.pop_back();
        out->Reset();
        return out;
      }
    }
    return std::make_unique<Outgoing>();
  }

  void Ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  // Answers request_ into out, queues it for writing and reads the next
  // request (or pauses reading while max_queued responses wait).
  void Answer(std::unique_ptr<Outgoing> out) {
    handler_->Handle(request_, out->response);
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    queue_.push_back(std::move(out));
    if (!writing_) StartNextWriteLocked();
    if (queue_.size() < max_queued_) {
      StartRead(&request_);
    } else {
      read_paused_ = true;
    }
  }

  void StartNextWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = true;
    ticket_->WriteStarted();
    StartWrite(queue_.front()->response);
  }

  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reads_done_ && !writing_ && queue_.empty()) FinishLocked(grpc::Status::OK);
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  Runtime* const runtime_;
  grpc::CallbackServerContext* const ctx_;  // valid until OnDone
  std::string tenant_;                      // set by Start
  // One for gRPC (until OnDone), one per queued answer: the reactor is
  // deleted when both are done.
  std::atomic<int> refs_{1};
  std::unique_ptr<SelectHandler> handler_;  // set by Start, before the first read
  const size_t max_queued_;
  v1::SelectRequest request_;  // the one outstanding read's target

  absl::Mutex mu_;
  std::deque<std::unique_ptr<Outgoing>> queue_ ABSL_GUARDED_BY(mu_);  // front is being written
  std::vector<std::unique_ptr<Outgoing>> spare_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // Last: unregistered first when the reactor is deleted.
  std::unique_ptr<StreamTable::Ticket> ticket_;
};

}  // namespace

grpc::ServerBidiReactor<v1::SelectRequest, v1::SelectResponse>* NewSelectReactor(
    Runtime* runtime, grpc::CallbackServerContext* ctx) {
  absl::StatusOr<TenantPtr> caller = CallerOf(runtime->tenants(), ctx);
  if (!caller.ok()) {
    return new FinishedBidiReactor<v1::SelectRequest, v1::SelectResponse>(
        ToGrpcStatus(caller.status()));
  }
  auto* reactor = new SelectReactor(runtime, ctx, runtime->config().select.max_queued_responses);
  reactor->Start(runtime, **caller, CredentialsOf(ctx));
  return reactor;
}

}  // namespace kvtier::daemon
