// GetBlocks as a raw (ByteBuffer) server stream. Bytes mode sends each
// block from its host-tier copy in place: the response message is the
// GetBlocksResponse wire format assembled from slices, each block's data a
// slice over a BlockStore::View that keeps the copy where it is until gRPC
// has sent it (the slice's destructor drops the view). Handles mode
// serialises the typed message as before.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/impl/codegen/proto_utils.h>

#include "absl/strings/str_cat.h"
#include "daemon/block_reactors.h"
#include "daemon/blocking_pool.h"
#include "daemon/convert.h"
#include "daemon/grpc_status.h"
#include "daemon/reactors.h"
#include "daemon/tenant.h"
#include "proto/wire/wire.h"

namespace kvtier::daemon {
namespace {

using wire::AppendLengthKey;

// GetBlocksResponse.results = 1; BlockResult.data = 4.
constexpr uint32_t kResultsField = 1;
constexpr uint32_t kDataField = 4;

class GetBlocksReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GetBlocksReactor(Runtime* runtime, std::string tenant, v1::GetBlocksRequest request)
      : runtime_(runtime), tenant_(std::move(tenant)), request_(std::move(request)) {
    absl::Status st = Validate();
    if (!st.ok()) {
      Finish(ToGrpcStatus(st));
      return;
    }
    if (request_.mode() == v1::RETURN_MODE_HANDLES) {
      // Promotion into the arena may read NVMe: on an I/O thread.
      Schedule([this] {
        v1::GetBlocksResponse response;
        absl::Status st = AcquireHandles(&response);
        bool own = false;
        grpc::Status serialised =
            st.ok() ? grpc::SerializationTraits<v1::GetBlocksResponse>::Serialize(response,
                                                                                  &buffer_, &own)
                    : ToGrpcStatus(st);
        if (!serialised.ok()) {
          Finish(serialised);
          return;
        }
        handles_sent_ = true;
        StartWrite(&buffer_);
      });
      return;
    }
    Schedule([this] { NextWrite(); });
  }

  void OnWriteDone(bool ok) override {
    buffer_.Clear();  // gRPC is done with the slices: their views go
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
      return;
    }
    if (handles_sent_) {
      Finish(grpc::Status::OK);
      return;
    }
    Schedule([this] { NextWrite(); });
  }

  void OnDone() override { delete this; }

 private:
  // Runs `work` (which reads blocks, possibly from NVMe, and then writes or
  // finishes) on an I/O thread; finishes RESOURCE_EXHAUSTED when none can
  // take it.
  void Schedule(absl::AnyInvocable<void() &&> work) {
    BlockingPool* pool = runtime_->blocking_pool();
    if (!pool->Submit(std::move(work))) Finish(ToGrpcStatus(pool->QueueFullStatus()));
  }

  absl::Status Validate() {
    const uint64_t limit = runtime_->config().limits.max_batch_blocks;
    if (request_.block_ids_size() == 0) return absl::InvalidArgumentError("block_ids: empty");
    if (request_.mode() != v1::RETURN_MODE_UNSPECIFIED &&
        request_.mode() != v1::RETURN_MODE_BYTES && request_.mode() != v1::RETURN_MODE_HANDLES) {
      return absl::InvalidArgumentError(
          absl::StrCat("mode: ", static_cast<int>(request_.mode()),
                       " is not a ReturnMode (BYTES or HANDLES)"));
    }
    if (static_cast<uint64_t>(request_.block_ids_size()) > limit) {
      return absl::InvalidArgumentError(absl::StrCat(
          "block_ids: ", request_.block_ids_size(), " exceed limits.max_batch_blocks = ", limit));
    }
    if (request_.lease_ttl_ms() > runtime_->config().leases.max_ttl_ms) {
      return absl::InvalidArgumentError(absl::StrCat("lease_ttl_ms: ", request_.lease_ttl_ms(),
                                                     " exceeds leases.max_ttl_ms = ",
                                                     runtime_->config().leases.max_ttl_ms));
    }
    if (auto profile = ProfileOf(runtime_->store(), tenant_, request_.profile_id());
        !profile.ok()) {
      return profile.status();
    }
    return absl::OkStatus();
  }

  absl::Status AcquireHandles(v1::GetBlocksResponse* response) {
    std::vector<BlockKey> keys;
    for (const std::string& id : request_.block_ids()) {
      keys.push_back(BlockKey{tenant_, request_.profile_id(), id});
    }
    std::vector<absl::StatusOr<DeviceHandle>> handles;
    auto lease =
        runtime_->store()->AcquireHandles(tenant_, keys, request_.lease_ttl_ms(), &handles);
    if (!lease.ok()) return lease.status();
    response->set_lease_id(*lease);
    for (size_t i = 0; i < keys.size(); ++i) {
      v1::BlockResult* result = response->add_results();
      result->set_block_id(keys[i].block_id);
      ToItemStatus(handles[i].status(), result->mutable_status());
      if (handles[i].ok()) {
        result->set_tier(v1::TIER_DEVICE);
        *result->mutable_handle() = ToProto(*handles[i]);
        runtime_->compactor()->Annotate(tenant_, request_.profile_id(), result);
      }
    }
    // Handles fit in one message, but compacted blocks carry their slots.
    const uint64_t limit = runtime_->config().server.max_message_bytes;
    if (response->ByteSizeLong() > limit) {
      if (*lease != 0) runtime_->store()->Release(tenant_, *lease).IgnoreError();
      return absl::ResourceExhaustedError(absl::StrCat(
          "block_ids: the handles and compacted slots of ", keys.size(),
          " blocks exceed server.max_message_bytes = ", limit, "; ask for fewer blocks"));
    }
    return absl::OkStatus();
  }

  // Fills the next message with as many blocks as fit in the message
  // budget (at least one) and writes it; finishes after the last. Each
  // result is its fields but data, serialised, then the data field: the
  // key and length in the same slice, the bytes in a slice of their own
  // over the block's view.
  void NextWrite() {
    const uint64_t budget = runtime_->config().server.max_message_bytes - (64u << 10);
    uint64_t bytes = 0;
    std::vector<grpc::Slice> slices;
    while (next_ < request_.block_ids_size()) {
      const std::string& id = request_.block_ids(next_);
      TierId from = TierId::kHost;
      absl::StatusOr<std::unique_ptr<BlockView>> view =
          runtime_->store()->View(BlockKey{tenant_, request_.profile_id(), id}, &from);
      absl::Status st = view.status();
      const size_t size = view.ok() ? (*view)->bytes().size() : 0;
      if (st.ok() && size > budget) {
        st = absl::ResourceExhaustedError(
            absl::StrCat("block is larger than server.max_message_bytes allows; use "
                         "RETURN_MODE_HANDLES"));
      }
      const size_t data_size = st.ok() ? size : 0;
      if (!slices.empty() && bytes + data_size > budget) break;  // next message (read again)
      ++next_;
      v1::BlockResult result;
      result.set_block_id(id);
      ToItemStatus(st, result.mutable_status());
      if (st.ok()) {
        runtime_->metrics()->BytesGot(data_size);
        result.set_tier(ToProto(from));
        runtime_->compactor()->Annotate(tenant_, request_.profile_id(), &result);
      }
      std::string head = result.SerializeAsString();
      std::string data_key;
      if (data_size > 0) AppendLengthKey(kDataField, data_size, &data_key);
      std::string prefix;
      AppendLengthKey(kResultsField, head.size() + data_key.size() + data_size, &prefix);
      prefix += head;
      prefix += data_key;
      bytes += prefix.size() + data_size;
      slices.emplace_back(prefix);
      if (data_size > 0) {
        // The slice owns the view: destroying the slice releases the copy.
        BlockView* owned = view->release();
        const absl::Span<const uint8_t> data = owned->bytes();
        slices.emplace_back(const_cast<uint8_t*>(data.data()), data.size(),
                            +[](void* v) { delete static_cast<BlockView*>(v); }, owned);
      }
    }
    if (slices.empty()) {
      Finish(grpc::Status::OK);
      return;
    }
    buffer_ = grpc::ByteBuffer(slices.data(), slices.size());
    StartWrite(&buffer_);
  }

  Runtime* const runtime_;
  const std::string tenant_;
  const v1::GetBlocksRequest request_;
  grpc::ByteBuffer buffer_;  // the message being written
  int next_ = 0;
  bool handles_sent_ = false;
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* NewGetBlocksReactor(Runtime* runtime,
                                                                 grpc::CallbackServerContext* ctx,
                                                                 const grpc::ByteBuffer* request) {
  absl::StatusOr<TenantPtr> caller = CallerOf(runtime->tenants(), ctx);
  if (!caller.ok()) {
    return new FinishedWriteReactor<grpc::ByteBuffer>(ToGrpcStatus(caller.status()));
  }
  v1::GetBlocksRequest parsed;
  grpc::ByteBuffer copy(*request);  // Deserialize consumes its buffer
  grpc::Status st = grpc::SerializationTraits<v1::GetBlocksRequest>::Deserialize(&copy, &parsed);
  if (!st.ok()) {
    return new FinishedWriteReactor<grpc::ByteBuffer>(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("request: not a GetBlocksRequest (", st.error_message(), ")")));
  }
  return new GetBlocksReactor(runtime, (*caller)->name, std::move(parsed));
}

}  // namespace kvtier::daemon
