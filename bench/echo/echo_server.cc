#include "echo_server.h"

#include <unistd.h>

#include <deque>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace kvtier::bench {
namespace {

using Request = v1::SelectRequest;
using Response = v1::SelectResponse;

// Mirrors daemon/select_reactor.cc step for step, with the handler replaced
// by a copy of the prepared response.
class EchoReactor final : public grpc::ServerBidiReactor<Request, Response> {
 public:
  explicit EchoReactor(std::shared_ptr<const Response> prepared) : prepared_(std::move(prepared)) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      absl::MutexLock lock(&mu_);
      reads_done_ = true;
      MaybeFinishLocked();
      return;
    }
    Response response = *prepared_;
    response.set_request_id(request_.request_id());
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    queue_.push_back(std::move(response));
    if (!writing_) StartNextWriteLocked();
    if (queue_.size() < kMaxQueued) {
      StartRead(&request_);
    } else {
      read_paused_ = true;
    }
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    queue_.pop_front();
    if (!ok) {
      queue_.clear();
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "echo: client went away"));
      return;
    }
    if (!queue_.empty()) StartNextWriteLocked();
    if (read_paused_ && !reads_done_ && !finished_ && queue_.size() < kMaxQueued) {
      read_paused_ = false;
      StartRead(&request_);
    }
    MaybeFinishLocked();
  }

  void OnDone() override { delete this; }

 private:
  static constexpr size_t kMaxQueued = 8;  // kvtierd's select.max_queued_responses

  void StartNextWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = true;
    StartWrite(&queue_.front());
  }
  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reads_done_ && !writing_ && queue_.empty()) FinishLocked(grpc::Status::OK);
  }
  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  const std::shared_ptr<const Response> prepared_;
  Request request_;
  absl::Mutex mu_;
  std::deque<Response> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

class EchoServer::Service final : public Echo::CallbackService {
 public:
  grpc::ServerBidiReactor<Request, Response>* Select(grpc::CallbackServerContext*) override {
    std::shared_ptr<const Response> prepared;
    {
      absl::MutexLock lock(&mu_);
      prepared = prepared_;
    }
    return new EchoReactor(std::move(prepared));
  }

  void Set(const Response& response) {
    absl::MutexLock lock(&mu_);
    prepared_ = std::make_shared<const Response>(response);
  }

 private:
  absl::Mutex mu_;
  std::shared_ptr<const Response> prepared_ ABSL_GUARDED_BY(mu_) =
      std::make_shared<const Response>();
};

absl::StatusOr<std::unique_ptr<EchoServer>> EchoServer::Start(const std::string& socket_path,
                                                              uint64_t max_message_bytes,
                                                              uint64_t max_concurrent_streams) {
  int port = 0;
  return StartAt("unix:" + socket_path, grpc::InsecureServerCredentials(), max_message_bytes,
                 max_concurrent_streams, &port);
}

absl::StatusOr<std::unique_ptr<EchoServer>> EchoServer::StartAt(
    const std::string& address, const std::shared_ptr<grpc::ServerCredentials>& credentials,
    uint64_t max_message_bytes, uint64_t max_concurrent_streams, int* port) {
  std::unique_ptr<EchoServer> server(new EchoServer());
  if (address.rfind("unix:", 0) == 0) {
    server->socket_path_ = address.substr(5);
    ::unlink(server->socket_path_.c_str());
  }
  server->service_ = std::make_unique<Service>();
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(static_cast<int>(max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(max_message_bytes));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(max_concurrent_streams));
  builder.AddListeningPort(address, credentials, port);
  builder.RegisterService(server->service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("echo: cannot listen on ", address));
  }
  return server;
}

EchoServer::~EchoServer() {
  if (server_ != nullptr) {
    server_->Shutdown();
    server_->Wait();
  }
  if (!socket_path_.empty()) ::unlink(socket_path_.c_str());
}

void EchoServer::SetResponse(const v1::SelectResponse& response) { service_->Set(response); }

}  // namespace kvtier::bench
