#include "client/client.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_interceptor.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "client/call.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace kvtier {

using internal::kWholeContextTimeouts;
using internal::SetDeadline;
using internal::Unary;

namespace {

// Adds "authorization: Bearer <token>" to the initial metadata of every call
// on the channel. An interceptor rather than call credentials: gRPC sends
// call credentials only over channels it considers secure, and the Unix
// socket channel is an insecure one.
class BearerInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(const std::string* value) : value_(value) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", *value_);
    }
    methods->Proceed();
  }

 private:
  const std::string* const value_;  // owned by the factory, which the channel keeps
};

class BearerInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(const std::string& token) : value_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new BearerInterceptor(&value_);
  }

 private:
  const std::string value_;
};

absl::Status CheckToken(const std::string& token) {
  if (token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError("options.token: " + std::to_string(token.size()) +
                                      " bytes, at most " + std::to_string(kMaxTokenBytes));
  }
  for (size_t i = 0; i < token.size(); ++i) {
    if (token[i] <= ' ' || token[i] > '~') {
      return absl::InvalidArgumentError("options.token: byte " + std::to_string(i) +
                                        " is a space, a control byte or not ASCII");
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string NormalizeTarget(const std::string& target) {
  for (const char* scheme : {"unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:"}) {
    if (target.rfind(scheme, 0) == 0) return target;
  }
  const bool is_path = target.find('/') != std::string::npos ||
                       (target.size() >= 5 && target.compare(target.size() - 5, 5, ".sock") == 0);
  if (!is_path) return target;
  // As Python's os.path.abspath: absolute, "." and ".." resolved lexically,
  // no trailing '/'.
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::absolute(target, ec);
  if (ec) return "unix:" + target;
  std::string out = abs.lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return "unix:" + out;
}

absl::Status FromItemStatus(const v1::ItemStatus& status, std::string_view where) {
  if (status.code() == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.code()),
                      std::string(where) + ": " + status.message());
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& target,
                                                        const ClientOptions& options) {
  if (target.empty()) return absl::InvalidArgumentError("target: empty daemon address");
  if (absl::Status st = CheckToken(options.token); !st.ok()) return st;
  std::string normalized = NormalizeTarget(target);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  if (options.own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!options.token.empty()) {
    interceptors.push_back(std::make_unique<BearerInterceptorFactory>(options.token));
  }
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!options.tls_root_certs_pem.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_root_certs_pem;
    ssl.pem_cert_chain = options.tls_cert_chain_pem;
    ssl.pem_private_key = options.tls_private_key_pem;
    creds = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(options.tls_server_name);
    }
  } else if (!options.tls_cert_chain_pem.empty() || !options.tls_private_key_pem.empty()) {
    return absl::InvalidArgumentError(
        "options.tls_root_certs_pem: a client certificate needs the roots that verify the daemon");
  }
  if (options.tls_cert_chain_pem.empty() != options.tls_private_key_pem.empty()) {
    return absl::InvalidArgumentError(
        "options.tls_private_key_pem: set both the client certificate chain and its key");
  }
  auto channel = grpc::experimental::CreateCustomChannelWithInterceptors(normalized, creds, args,
                                                                         std::move(interceptors));
  return std::unique_ptr<Client>(new Client(normalized, options, std::move(channel)));
}

Client::Client(std::string target, ClientOptions options, std::shared_ptr<grpc::Channel> channel)
    : target_(std::move(target)),
      options_(std::move(options)),
      channel_(std::move(channel)),
      kvtier_(v1::KvTier::NewStub(channel_)),
      admin_(v1::Admin::NewStub(channel_)),
      generic_(std::make_unique<grpc::GenericStub>(channel_)) {}

Client::~Client() = default;

client::SharedFileSource Client::ArenaSource(const v1::OpenArenaResponse& arena) const {
  if (!arena.shm_path().empty()) return client::SharedFileSource{arena.shm_path(), "", ""};
  return client::SharedFileSource{"", arena.fd_socket_path(), options_.token};
}

client::SharedFileSource Client::StagingSource(const v1::ReserveSlotsResponse& slots) const {
  if (!slots.staging_path().empty()) return client::SharedFileSource{slots.staging_path(), "", ""};
  return client::SharedFileSource{"", slots.fd_socket_path(), options_.token};
}

absl::StatusOr<ServingStatus> Client::Health() {
  auto stub = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.call_timeout);
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status st = stub->Check(&ctx, req, &resp);
  if (!st.ok()) return FromGrpcStatus(st);
  switch (resp.status()) {
    case grpc::health::v1::HealthCheckResponse::SERVING:
      return ServingStatus::kServing;
    case grpc::health::v1::HealthCheckResponse::NOT_SERVING:
      return ServingStatus::kNotServing;
    default:
      return ServingStatus::kUnknown;
  }
}

absl::StatusOr<v1::RegisterProfileResponse> Client::RegisterProfile(
    const v1::ModelProfile& profile) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.call_timeout);
  v1::RegisterProfileRequest req;
  *req.mutable_profile() = profile;
  v1::RegisterProfileResponse resp;
  grpc::Status st = kvtier_->RegisterProfile(&ctx, req, &resp);
  if (!st.ok()) return FromGrpcStatus(st);
  absl::MutexLock lock(&shapes_mu_);
  profile_shapes_[resp.profile_id()] = ContextShape{profile.num_layers(), profile.head_dim()};
  return resp;
}

absl::StatusOr<v1::GetProfileResponse> Client::GetProfile(uint64_t profile_id) {
  v1::GetProfileRequest req;
  req.set_profile_id(profile_id);
  auto resp = Unary<v1::GetProfileResponse>(
      options_.call_timeout,
      [this](auto* c, auto& r, auto* p) { return kvtier_->GetProfile(c, r, p); }, req);
  if (resp.ok()) {
    absl::MutexLock lock(&shapes_mu_);
    profile_shapes_[profile_id] =
        ContextShape{resp->profile().num_layers(), resp->profile().head_dim()};
  }
  return resp;
}

absl::StatusOr<v1::OpenArenaResponse> Client::OpenArena() {
  return Unary<v1::OpenArenaResponse>(
      options_.call_timeout,
      [this](auto* c, auto& r, auto* p) { return kvtier_->OpenArena(c, r, p); },
      v1::OpenArenaRequest());
}

absl::StatusOr<v1::ReserveSlotsResponse> Client::ReserveSlots(uint64_t profile_id, uint32_t count,
                                                              uint32_t lease_ttl_ms) {
  v1::ReserveSlotsRequest req;
  req.set_profile_id(profile_id);
  req.set_count(count);
  req.set_lease_ttl_ms(lease_ttl_ms);
  return Unary<v1::ReserveSlotsResponse>(
      options_.call_timeout,
      [this](auto* c, auto& r, auto* p) { return kvtier_->ReserveSlots(c, r, p); }, req);
}

absl::StatusOr<v1::DeleteBlocksResponse> Client::DeleteBlocks(
    const v1::DeleteBlocksRequest& request) {
  return Unary<v1::DeleteBlocksResponse>(
      options_.call_timeout,
      [this](auto* c, auto& r, auto* p) { return kvtier_->DeleteBlocks(c, r, p); }, request);
}

absl::StatusOr<v1::ReleaseResponse> Client::Release(const v1::ReleaseRequest& request) {
  return Unary<v1::ReleaseResponse>(
      options_.call_timeout,
      [this](auto* c, auto& r, auto* p) { return kvtier_->Release(c, r, p); }, request);
}

absl::StatusOr<v1::CompactContextResponse> Client::CompactContext(
    const v1::CompactContextRequest& request) {
  return Unary<v1::CompactContextResponse>(
      options_.call_timeout * kWholeContextTimeouts,
      [this](auto* c, auto& r, auto* p) { return kvtier_->CompactContext(c, r, p); }, request);
}

absl::StatusOr<v1::ListContextVersionsResponse> Client::ListContextVersions(
    const v1::ListContextVersionsRequest& request) {
  return Unary<v1::ListContextVersionsResponse>(
      options_.call_timeout,
      [this](auto* c, auto& r, auto* p) { return kvtier_->ListContextVersions(c, r, p); }, request);
}

absl::StatusOr<v1::DropContextVersionResponse> Client::DropContextVersion(
    const v1::DropContextVersionRequest& request) {
  return Unary<v1::DropContextVersionResponse>(
      options_.call_timeout * kWholeContextTimeouts,
      [this](auto* c, auto& r, auto* p) { return kvtier_->DropContextVersion(c, r, p); }, request);
}

absl::StatusOr<v1::PutBlocksResponse> Client::PutBlocks(
    const std::vector<v1::PutBlocksRequest>& requests) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.call_timeout);
  v1::PutBlocksResponse resp;
  auto writer = kvtier_->PutBlocks(&ctx, &resp);
  for (const auto& req : requests) {
    if (!writer->Write(req)) break;  // the server finished early; Finish says why
  }
  writer->WritesDone();
  grpc::Status st = writer->Finish();
  if (!st.ok()) return FromGrpcStatus(st);
  // The daemon counts every message it read; a client compares it with
  // what it sent.
  if (resp.messages_received() != requests.size()) {
    return absl::DataLossError(absl::StrCat("PutBlocks: the daemon read ", resp.messages_received(),
                                            " of the ", requests.size(), " messages sent"));
  }
  return resp;
}

absl::StatusOr<std::vector<v1::BlockResult>> Client::GetBlocks(const v1::GetBlocksRequest& request,
                                                               uint64_t* lease_id) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.call_timeout);
  auto reader = kvtier_->GetBlocks(&ctx, request);
  std::vector<v1::BlockResult> results;
  v1::GetBlocksResponse resp;
  while (reader->Read(&resp)) {
    if (lease_id != nullptr && resp.lease_id() != 0) *lease_id = resp.lease_id();
    for (auto& r : *resp.mutable_results()) results.push_back(std::move(r));
  }
  grpc::Status st = reader->Finish();
  if (!st.ok()) return FromGrpcStatus(st);
  return results;
}

absl::StatusOr<v1::LookupResponse> Client::Lookup(const v1::LookupRequest& request) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.call_timeout);
  v1::LookupResponse resp;
  grpc::Status st = kvtier_->Lookup(&ctx, request, &resp);
  if (!st.ok()) return FromGrpcStatus(st);
  return resp;
}

}  // namespace kvtier
