#include "daemon/health_service.h"

#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/grpc_status.h"
#include "daemon/runtime.h"
#include "daemon/streams.h"
#include "daemon/tenant.h"

namespace kvtier::daemon {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using ServingStatus = HealthCheckResponse::ServingStatus;

bool KnownService(const std::string& name) {
  return name.empty() || name == "kvtier.v1.KvTier" || name == "kvtier.v1.Admin";
}

}  // namespace

// One Watch call. Lives from Watch() until OnDone. Lock order: the
// board's mu_, then the reactor's; the reactor never calls the stream
// table while holding its own.
class WatchReactor final : public grpc::ServerWriteReactor<HealthCheckResponse>,
                           public StreamTable::Stream {
 public:
  WatchReactor(HealthBoard* board, grpc::CallbackServerContext* ctx) : board_(board), ctx_(ctx) {}

  void Begin(const Runtime& rt, const HealthCheckRequest& request) {
    absl::StatusOr<TenantPtr> caller = CallerOf(rt.tenants(), ctx_);
    if (!caller.ok()) return FinishEarly(ToGrpcStatus(caller.status()));
    known_ = KnownService(request.service());
    absl::StatusOr<std::unique_ptr<StreamTable::Ticket>> ticket =
        rt.streams()->Open("Watch", (*caller)->name, CredentialsOf(ctx_), this);
    if (!ticket.ok()) return FinishEarly(ToGrpcStatus(ticket.status()));
    ticket_ = std::move(*ticket);
    absl::MutexLock board_lock(&board_->mu_);
    if (board_->shut_down_) {
      return FinishEarly(grpc::Status(grpc::StatusCode::UNAVAILABLE, "kvtierd is shutting down"));
    }
    board_->watchers_.insert(this);
    registered_ = true;
    Notify(board_->Current(), /*end=*/false);
  }

  // The daemon's status changed (end: it is shutting down). Called with
  // the board's mu_ held.
  void Notify(ServingStatus status, bool end) {
    absl::MutexLock lock(&mu_);
    wanted_ = known_ ? status : HealthCheckResponse::SERVICE_UNKNOWN;
    if (end) ending_ = true;
    NextLocked();
  }

  void Abort(const grpc::Status& status, bool /*wait_dropped*/) override {
    absl::MutexLock lock(&mu_);
    if (finished_ || abort_.has_value()) return;
    abort_ = status;
    // A write its client does not read would hold the call: cancel it.
    if (writing_) ctx_->TryCancel();
    NextLocked();
  }

  void OnWriteDone(bool ok) override {
    if (ticket_ != nullptr) ticket_->WriteDone();
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) broken_ = true;
    NextLocked();
  }

  void OnDone() override {
    if (registered_) board_->Remove(this);
    ticket_.reset();  // unregisters from the stream table
    delete this;
  }

 private:
  void FinishEarly(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    finished_ = true;
    Finish(status);
  }

  // Writes the wanted status if it is new, else finishes when asked to.
  // At most one write in flight; Finish only with none.
  void NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || writing_) return;
    if (broken_) {
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      return;
    }
    if (abort_.has_value()) {
      finished_ = true;
      Finish(*abort_);
      return;
    }
    if (!sent_ || wanted_ != last_sent_) {
      sent_ = true;
      last_sent_ = wanted_;
      message_.set_status(wanted_);
      writing_ = true;
      if (ticket_ != nullptr) ticket_->WriteStarted();
      StartWrite(&message_);
      return;
    }
    if (ending_) {
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "kvtierd is shutting down"));
    }
  }

  HealthBoard* const board_;
  grpc::CallbackServerContext* const ctx_;
  bool known_ = true;        // set in Begin, before any other thread sees this
  bool registered_ = false;  // in board_->watchers_ (set in Begin)
  absl::Mutex mu_;
  HealthCheckResponse message_ ABSL_GUARDED_BY(mu_);  // the write in flight
  ServingStatus wanted_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  ServingStatus last_sent_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  bool sent_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> abort_ ABSL_GUARDED_BY(mu_);
  // Last member: destroyed first (StreamTable's contract).
  std::unique_ptr<StreamTable::Ticket> ticket_;
};

ServingStatus HealthBoard::Current() const {
  return serving_ ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
}

void HealthBoard::SetServing(bool serving) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  serving_ = serving;
  for (WatchReactor* w : watchers_) w->Notify(Current(), /*end=*/false);
}

void HealthBoard::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  shut_down_ = true;
  serving_ = false;
  for (WatchReactor* w : watchers_) w->Notify(Current(), /*end=*/true);
}

void HealthBoard::Remove(WatchReactor* w) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(w);
}

size_t HealthBoard::watchers() const {
  absl::MutexLock lock(&mu_);
  return watchers_.size();
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* ctx,
                                               const HealthCheckRequest* request,
                                               HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<TenantPtr> caller = CallerOf(runtime_->tenants(), ctx);
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
  } else if (!KnownService(request->service())) {
    reactor->Finish(ToGrpcStatus(absl::NotFoundError(
        absl::StrCat("service: \"", request->service(), "\" is not served here"))));
  } else {
    absl::MutexLock lock(&board_->mu_);
    response->set_status(board_->Current());
    reactor->Finish(grpc::Status::OK);
  }
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext* ctx, const HealthCheckRequest* request) {
  auto* reactor = new WatchReactor(board_, ctx);
  reactor->Begin(*runtime_, *request);
  return reactor;
}

}  // namespace kvtier::daemon
