#include "client/client.h"

#include <grpcpp/grpcpp.h>

#include "grpc/health/v1/health.grpc.pb.h"

namespace kvtier {
namespace {

void SetDeadline(grpc::ClientContext* ctx, const ClientOptions& options) {
  ctx->set_deadline(std::chrono::system_clock::now() + options.call_timeout);
}

}  // namespace

std::string NormalizeTarget(const std::string& target) {
  if (target.rfind("unix:", 0) == 0 || target.rfind("dns:", 0) == 0 ||
      target.rfind("ipv4:", 0) == 0 || target.rfind("ipv6:", 0) == 0) {
    return target;
  }
  bool is_path = target.find('/') != std::string::npos ||
                 (target.size() > 5 && target.compare(target.size() - 5, 5, ".sock") == 0);
  return is_path ? "unix:" + target : target;
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& target,
                                                        const ClientOptions& options) {
  if (target.empty()) return absl::InvalidArgumentError("target: empty daemon address");
  std::string normalized = NormalizeTarget(target);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  auto channel =
      grpc::CreateCustomChannel(normalized, grpc::InsecureChannelCredentials(), args);
  return std::unique_ptr<Client>(new Client(normalized, options, std::move(channel)));
}

Client::Client(std::string target, ClientOptions options, std::shared_ptr<grpc::Channel> channel)
    : target_(std::move(target)),
      options_(options),
      channel_(std::move(channel)),
      kvtier_(v1::KvTier::NewStub(channel_)),
      admin_(v1::Admin::NewStub(channel_)) {}

absl::StatusOr<ServingStatus> Client::Health() {
  auto stub = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_);
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

absl::StatusOr<v1::StatsResponse> Client::Stats() {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_);
  v1::StatsResponse resp;
  grpc::Status st = admin_->Stats(&ctx, v1::StatsRequest(), &resp);
  if (!st.ok()) return FromGrpcStatus(st);
  return resp;
}

absl::StatusOr<v1::RegisterProfileResponse> Client::RegisterProfile(
    const v1::ModelProfile& profile) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_);
  v1::RegisterProfileRequest req;
  *req.mutable_profile() = profile;
  v1::RegisterProfileResponse resp;
  grpc::Status st = kvtier_->RegisterProfile(&ctx, req, &resp);
  if (!st.ok()) return FromGrpcStatus(st);
  return resp;
}

absl::StatusOr<v1::LookupResponse> Client::Lookup(const v1::LookupRequest& request) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_);
  v1::LookupResponse resp;
  grpc::Status st = kvtier_->Lookup(&ctx, request, &resp);
  if (!st.ok()) return FromGrpcStatus(st);
  return resp;
}

}  // namespace kvtier
