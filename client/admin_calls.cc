// Client calls of the Admin service.
#include "client/call.h"
#include "client/client.h"

namespace kvtier {
namespace {

// Reads a server stream to its end, handing each message to on_progress;
// returns the last one (an empty message when there was none).
template <class Progress, class Reader>
absl::StatusOr<Progress> ReadProgress(Reader* reader,
                                      const std::function<void(const Progress&)>& on_progress) {
  Progress progress, last;
  while (reader->Read(&progress)) {
    if (on_progress) on_progress(progress);
    last = progress;
  }
  grpc::Status st = reader->Finish();
  if (!st.ok()) return FromGrpcStatus(st);
  return last;
}

void SetOptionalDeadline(grpc::ClientContext* ctx, std::chrono::milliseconds timeout) {
  if (timeout.count() > 0) internal::SetDeadline(ctx, timeout);
}

}  // namespace

using internal::Unary;

absl::StatusOr<v1::StatsResponse> Client::Stats() {
  return Unary<v1::StatsResponse>(
      options_.call_timeout, [this](auto* c, auto& r, auto* p) { return admin_->Stats(c, r, p); },
      v1::StatsRequest());
}

absl::StatusOr<v1::ListBlocksResponse> Client::ListBlocks(const v1::ListBlocksRequest& request) {
  return Unary<v1::ListBlocksResponse>(
      options_.call_timeout,
      [this](auto* c, auto& r, auto* p) { return admin_->ListBlocks(c, r, p); }, request);
}

absl::StatusOr<v1::ListContextsResponse> Client::ListContexts() {
  return Unary<v1::ListContextsResponse>(
      options_.call_timeout,
      [this](auto* c, auto& r, auto* p) { return admin_->ListContexts(c, r, p); },
      v1::ListContextsRequest());
}

absl::StatusOr<v1::ListProfilesResponse> Client::ListProfiles() {
  return Unary<v1::ListProfilesResponse>(
      options_.call_timeout,
      [this](auto* c, auto& r, auto* p) { return admin_->ListProfiles(c, r, p); },
      v1::ListProfilesRequest());
}

absl::StatusOr<v1::EvictResponse> Client::Evict(const v1::EvictRequest& request) {
  return Unary<v1::EvictResponse>(
      options_.call_timeout, [this](auto* c, auto& r, auto* p) { return admin_->Evict(c, r, p); },
      request);
}

absl::StatusOr<v1::DrainProgress> Client::Drain(
    const v1::DrainRequest& request,
    const std::function<void(const v1::DrainProgress&)>& on_progress,
    std::chrono::milliseconds timeout) {
  grpc::ClientContext ctx;
  SetOptionalDeadline(&ctx, timeout);
  auto reader = admin_->Drain(&ctx, request);
  return ReadProgress<v1::DrainProgress>(reader.get(), on_progress);
}

absl::StatusOr<v1::VerifyProgress> Client::Verify(
    const v1::VerifyRequest& request,
    const std::function<void(const v1::VerifyProgress&)>& on_progress,
    std::chrono::milliseconds timeout) {
  grpc::ClientContext ctx;
  SetOptionalDeadline(&ctx, timeout);
  auto reader = admin_->Verify(&ctx, request);
  return ReadProgress<v1::VerifyProgress>(reader.get(), on_progress);
}

}  // namespace kvtier
