#include "daemon/reflection_service.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include <memory>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/grpc_status.h"
#include "daemon/runtime.h"
#include "daemon/streams.h"
#include "daemon/tenant.h"

namespace kvtier::daemon {
namespace {

namespace pb = ::google::protobuf;
using grpc::reflection::v1alpha::ServerReflectionRequest;
using grpc::reflection::v1alpha::ServerReflectionResponse;

constexpr char kOwnName[] = "grpc.reflection.v1alpha.ServerReflection";

// The answer to one request. `sent`: the files this stream has sent, which
// are not sent again (a client keeps them).
void Answer(const std::vector<std::string>& services, const ServerReflectionRequest& request,
            absl::flat_hash_set<std::string>* sent, ServerReflectionResponse* response) {
  response->Clear();
  response->set_valid_host(request.host());
  *response->mutable_original_request() = request;
  const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
  auto error = [response](grpc::StatusCode code, std::string message) {
    response->mutable_error_response()->set_error_code(static_cast<int32_t>(code));
    response->mutable_error_response()->set_error_message(std::move(message));
  };
  // The file and the imports not sent yet, the file first.
  auto send_file = [response, sent](const pb::FileDescriptor* file) {
    auto* out = response->mutable_file_descriptor_response();
    std::vector<const pb::FileDescriptor*> todo = {file};
    bool first = true;
    while (!todo.empty()) {
      const pb::FileDescriptor* f = todo.back();
      todo.pop_back();
      if (!first && sent->contains(f->name())) continue;
      first = false;
      sent->insert(f->name());
      pb::FileDescriptorProto proto;
      f->CopyTo(&proto);
      proto.SerializeToString(out->add_file_descriptor_proto());
      for (int i = 0; i < f->dependency_count(); ++i) todo.push_back(f->dependency(i));
    }
  };
  switch (request.message_request_case()) {
    case ServerReflectionRequest::kListServices:
      for (const std::string& name : services) {
        response->mutable_list_services_response()->add_service()->set_name(name);
      }
      return;
    case ServerReflectionRequest::kFileByFilename:
      if (const pb::FileDescriptor* f = pool->FindFileByName(request.file_by_filename())) {
        return send_file(f);
      }
      return error(grpc::StatusCode::NOT_FOUND,
                   absl::StrCat("file_by_filename: no file ", request.file_by_filename()));
    case ServerReflectionRequest::kFileContainingSymbol:
      if (const pb::FileDescriptor* f =
              pool->FindFileContainingSymbol(request.file_containing_symbol())) {
        return send_file(f);
      }
      return error(grpc::StatusCode::NOT_FOUND, absl::StrCat("file_containing_symbol: no symbol ",
                                                             request.file_containing_symbol()));
    case ServerReflectionRequest::kFileContainingExtension: {
      const auto& ext = request.file_containing_extension();
      const pb::Descriptor* type = pool->FindMessageTypeByName(ext.containing_type());
      const pb::FieldDescriptor* field =
          type == nullptr ? nullptr : pool->FindExtensionByNumber(type, ext.extension_number());
      if (field != nullptr) return send_file(field->file());
      return error(grpc::StatusCode::NOT_FOUND,
                   absl::StrCat("file_containing_extension: no extension ", ext.extension_number(),
                                " of ", ext.containing_type()));
    }
    case ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const pb::Descriptor* type =
          pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
      if (type == nullptr) {
        return error(grpc::StatusCode::NOT_FOUND,
                     absl::StrCat("all_extension_numbers_of_type: no type ",
                                  request.all_extension_numbers_of_type()));
      }
      std::vector<const pb::FieldDescriptor*> fields;
      pool->FindAllExtensions(type, &fields);
      auto* out = response->mutable_all_extension_numbers_response();
      out->set_base_type_name(type->full_name());
      for (const pb::FieldDescriptor* f : fields) out->add_extension_number(f->number());
      return;
    }
    case ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
      break;
  }
  error(grpc::StatusCode::INVALID_ARGUMENT, "message_request: not set");
}

// One ServerReflectionInfo stream: read a request, write its answer, read
// the next. Lives until OnDone. The reactor never calls the stream table
// while holding mu_ (StreamTable's contract).
class ReflectionReactor final
    : public grpc::ServerBidiReactor<ServerReflectionRequest, ServerReflectionResponse>,
      public StreamTable::Stream {
 public:
  ReflectionReactor(const std::vector<std::string>* services, grpc::CallbackServerContext* ctx)
      : services_(services), ctx_(ctx) {}

  void Begin(const Runtime& rt) {
    absl::StatusOr<TenantPtr> caller = CallerOf(rt.tenants(), ctx_);
    if (!caller.ok()) return FinishNow(ToGrpcStatus(caller.status()));
    absl::StatusOr<std::unique_ptr<StreamTable::Ticket>> ticket =
        rt.streams()->Open("ServerReflectionInfo", (*caller)->name, CredentialsOf(ctx_), this);
    if (!ticket.ok()) return FinishNow(ToGrpcStatus(ticket.status()));
    ticket_ = std::move(*ticket);
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    if (abort_.has_value()) return FinishLocked(*abort_);
    if (!ok) return FinishLocked(grpc::Status::OK);  // the client half-closed (or left)
    Answer(*services_, request_, &sent_, &response_);
    ticket_->WriteStarted();
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    ticket_->WriteDone();
    absl::MutexLock lock(&mu_);
    if (abort_.has_value()) return FinishLocked(*abort_);
    if (!ok) return FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
    StartRead(&request_);
  }

  // Revoked or stalled: the read or write in flight is cancelled, and its
  // completion finishes the call with `status`.
  void Abort(const grpc::Status& status, bool /*wait_dropped*/) override {
    absl::MutexLock lock(&mu_);
    if (finished_ || abort_.has_value()) return;
    abort_ = status;
    ctx_->TryCancel();
  }

  void OnDone() override {
    ticket_.reset();  // unregisters from the stream table
    delete this;
  }

 private:
  void FinishNow(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    FinishLocked(status);
  }
  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  const std::vector<std::string>* const services_;
  grpc::CallbackServerContext* const ctx_;
  // One read or one write is in flight at a time; they touch these only
  // from their completions.
  ServerReflectionRequest request_;
  ServerReflectionResponse response_;
  absl::flat_hash_set<std::string> sent_;
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> abort_ ABSL_GUARDED_BY(mu_);
  // Last member: destroyed first (StreamTable's contract).
  std::unique_ptr<StreamTable::Ticket> ticket_;
};

}  // namespace

ReflectionService::ReflectionService(Runtime* runtime, std::vector<std::string> services)
    : runtime_(runtime), services_([&services] {
        services.push_back(kOwnName);
        return std::move(services);
      }()) {}

grpc::ServerBidiReactor<ServerReflectionRequest, ServerReflectionResponse>*
ReflectionService::ServerReflectionInfo(grpc::CallbackServerContext* ctx) {
  auto* reactor = new ReflectionReactor(&services_, ctx);
  reactor->Begin(*runtime_);
  return reactor;
}

}  // namespace kvtier::daemon
