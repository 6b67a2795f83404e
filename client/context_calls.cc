// Client calls on contexts (OpenContext, AppendBlocks, CloseContext, Select
// streams) and the staged put.
#include <span>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/call.h"
#include "client/client.h"

namespace kvtier {

using internal::Unary;

absl::StatusOr<v1::OpenContextResponse> Client::OpenContext(const v1::OpenContextRequest& request) {
  auto resp = Unary<v1::OpenContextResponse>(
      options_.call_timeout,
      [this](auto* c, auto& r, auto* p) { return kvtier_->OpenContext(c, r, p); }, request);
  if (resp.ok()) {
    absl::MutexLock lock(&shapes_mu_);
    auto it = profile_shapes_.find(request.profile_id());
    if (it != profile_shapes_.end()) context_shapes_[resp->context_id()] = it->second;
  }
  return resp;
}

absl::StatusOr<v1::AppendBlocksResponse> Client::AppendBlocks(
    uint64_t context_id, absl::Span<const std::string> block_ids) {
  v1::AppendBlocksRequest req;
  req.set_context_id(context_id);
  for (const std::string& id : block_ids) req.add_block_ids(id);
  return Unary<v1::AppendBlocksResponse>(
      options_.call_timeout,
      [this](auto* c, auto& r, auto* p) { return kvtier_->AppendBlocks(c, r, p); }, req);
}

absl::Status Client::CloseContext(uint64_t context_id) {
  {
    absl::MutexLock lock(&shapes_mu_);
    context_shapes_.erase(context_id);
  }
  v1::CloseContextRequest req;
  req.set_context_id(context_id);
  return Unary<v1::CloseContextResponse>(
             options_.call_timeout,
             [this](auto* c, auto& r, auto* p) { return kvtier_->CloseContext(c, r, p); }, req)
      .status();
}

bool Client::ContextShapeOf(uint64_t context_id, ContextShape* shape) const {
  absl::MutexLock lock(&shapes_mu_);
  auto it = context_shapes_.find(context_id);
  if (it == context_shapes_.end()) return false;
  *shape = it->second;
  return true;
}

std::unique_ptr<SelectStream> Client::OpenSelectStream(std::chrono::milliseconds deadline) {
  return std::make_unique<SelectStream>(this, kvtier_.get(), deadline);
}

absl::StatusOr<v1::PutBlocksResponse> Client::PutBlocksStaged(uint64_t profile_id,
                                                              absl::Span<const BlockData> blocks,
                                                              const PutDataOptions& options) {
  if (blocks.empty()) return absl::InvalidArgumentError("blocks: empty");
  if (options.message_blocks == 0) {
    return absl::InvalidArgumentError("options.message_blocks: 0, give at least 1");
  }
  auto reserved = ReserveSlots(profile_id, static_cast<uint32_t>(blocks.size()));
  if (!reserved.ok()) return reserved.status();
  if (static_cast<size_t>(reserved->slots_size()) != blocks.size()) {
    return absl::InternalError(absl::StrCat("ReserveSlots: ", reserved->slots_size(), " slots for ",
                                            blocks.size(), " blocks"));
  }
  std::string error;
  auto staging = client::ShmStagingFile::Open(StagingSource(*reserved),
                                              reserved->staging_size_bytes(), &error);
  if (staging == nullptr) return absl::FailedPreconditionError("staging file: " + error);
  std::vector<v1::PutBlocksRequest> requests;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const v1::SlotRef& slot = reserved->slots(static_cast<int>(i));
    std::span<const std::byte> data(reinterpret_cast<const std::byte*>(blocks[i].data.data()),
                                    blocks[i].data.size());
    if (!staging->Write(slot.offset_bytes(), slot.size_bytes(), data, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("blocks[", i, "].data: ", error));
    }
    if (i % options.message_blocks == 0) {
      requests.emplace_back();
      requests.back().set_profile_id(profile_id);
      requests.back().set_durable(options.durable);
      requests.back().set_retain(options.retain);
    }
    v1::BlockPut* put = requests.back().add_blocks();
    put->set_block_id(std::string(blocks[i].block_id));
    *put->mutable_slot() = slot;
    if (blocks[i].xxh3 != 0) put->set_xxh3(blocks[i].xxh3);
  }
  return PutBlocks(requests);
}

}  // namespace kvtier
