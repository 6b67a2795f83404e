#include "daemon/block_reactors.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/blocking_pool.h"
#include "daemon/convert.h"
#include "daemon/grpc_status.h"
#include "daemon/options.h"
#include "daemon/reactors.h"
#include "daemon/tenant.h"

namespace kvtier::daemon {
namespace {

class PutBlocksReactor final : public grpc::ServerReadReactor<v1::PutBlocksRequest> {
 public:
  PutBlocksReactor(Runtime* runtime, std::string tenant, v1::PutBlocksResponse* response)
      : runtime_(runtime), tenant_(std::move(tenant)), response_(response) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client closed its side: every message is processed
      Finish(grpc::Status::OK);
      return;
    }
    // Storing may write NVMe (durable puts, demotions) and sync the
    // catalog: done on an I/O thread; the next read starts once it is done.
    BlockingPool* pool = runtime_->blocking_pool();
    if (!pool->Submit([this] {
          absl::Status st = Process();
          if (!st.ok()) {
            Finish(ToGrpcStatus(st));
            return;
          }
          StartRead(&request_);
        })) {
      Finish(ToGrpcStatus(pool->QueueFullStatus()));
    }
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Process() {
    response_->set_messages_received(response_->messages_received() + 1);
    const uint64_t limit = runtime_->config().limits.max_batch_blocks;
    if (request_.profile_id() == 0) {
      return absl::InvalidArgumentError("profile_id: required in every PutBlocksRequest");
    }
    if (static_cast<uint64_t>(request_.blocks_size()) > limit) {
      return absl::InvalidArgumentError(absl::StrCat(
          "blocks: ", request_.blocks_size(), " exceed limits.max_batch_blocks = ", limit));
    }
    if (static_cast<uint64_t>(response_->results_size() + request_.blocks_size()) >
        kMaxPutResultsPerStream) {
      // Checked before storing anything of this message: the response (one
      // result per block) stays bounded, and what was acknowledged is
      // exactly what the earlier messages stored.
      return absl::ResourceExhaustedError(absl::StrCat(
          "blocks: more than ", kMaxPutResultsPerStream,
          " blocks in one PutBlocks stream; open another stream"));
    }
    if (auto profile = runtime_->store()->GetProfile(request_.profile_id()); !profile.ok()) {
      return absl::InvalidArgumentError(std::string(profile.status().message()));
    }
    // The blocks are stored in parallel (server.put_parallelism); results
    // are reported in message order.
    BlockStore* store = runtime_->store();
    outcomes_.clear();
    outcomes_.resize(request_.blocks_size());
    ParallelFor(runtime_->blocking_pool(), outcomes_.size(), PutParallelismOf(runtime_->config()),
                [&](size_t i) {
                  const v1::BlockPut& put = request_.blocks(static_cast<int>(i));
                  BlockKey key{tenant_, request_.profile_id(), put.block_id()};
                  absl::StatusOr<PutOutcome>& outcome = outcomes_[i];
                  switch (put.source_case()) {
                    case v1::BlockPut::kData:
                      outcome = store->Put(
                          key,
                          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(put.data().data()),
                                              put.data().size()),
                          request_.durable(), put.xxh3(), request_.retain());
                      break;
                    case v1::BlockPut::kSlot:
                      outcome = store->PutFromStaging(
                          key,
                          StagingSlot{put.slot().slot_id(), put.slot().offset_bytes(),
                                      put.slot().size_bytes(), put.slot().generation()},
                          request_.durable(), put.xxh3(), request_.retain());
                      break;
                    default:
                      outcome = absl::InvalidArgumentError(
                          absl::StrCat("blocks[", i, "]: set data or slot"));
                  }
                });
    for (int i = 0; i < request_.blocks_size(); ++i) {
      const v1::BlockPut& put = request_.blocks(i);
      const absl::StatusOr<PutOutcome>& outcome = outcomes_[i];
      v1::PutResult* result = response_->add_results();
      result->set_block_id(put.block_id());
      ToItemStatus(outcome.status(), result->mutable_status());
      if (outcome.ok()) {
        result->set_tier(ToProto(outcome->tier));
        result->set_durable(outcome->durable);
        result->set_existed(outcome->existed);
        result->set_retained(outcome->retained);
        if (!outcome->existed) {
          const uint64_t bytes = put.has_data() ? put.data().size() : put.slot().size_bytes();
          response_->set_blocks_stored(response_->blocks_stored() + 1);
          response_->set_bytes_stored(response_->bytes_stored() + bytes);
          runtime_->metrics()->BlocksPut(1, bytes);
        }
      }
    }
    return absl::OkStatus();
  }

  Runtime* const runtime_;
  const std::string tenant_;
  v1::PutBlocksResponse* const response_;
  v1::PutBlocksRequest request_;
  std::vector<absl::StatusOr<PutOutcome>> outcomes_;  // of request_'s blocks
};

class GetBlocksReactor final : public grpc::ServerWriteReactor<v1::GetBlocksResponse> {
 public:
  GetBlocksReactor(Runtime* runtime, std::string tenant, const v1::GetBlocksRequest* request)
      : runtime_(runtime), tenant_(std::move(tenant)), request_(request) {
    absl::Status st = Validate();
    if (!st.ok()) {
      Finish(ToGrpcStatus(st));
      return;
    }
    if (request_->mode() == v1::RETURN_MODE_HANDLES) {
      // Promotion into the arena may read NVMe: on an I/O thread.
      Schedule([this] {
        absl::Status st = AcquireHandles();
        if (!st.ok()) {
          Finish(ToGrpcStatus(st));
          return;
        }
        handles_sent_ = true;
        StartWrite(&response_);
      });
      return;
    }
    Schedule([this] { NextWrite(); });
  }

  void OnWriteDone(bool ok) override {
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
    if (request_->block_ids_size() == 0) return absl::InvalidArgumentError("block_ids: empty");
    if (request_->mode() != v1::RETURN_MODE_UNSPECIFIED &&
        request_->mode() != v1::RETURN_MODE_BYTES && request_->mode() != v1::RETURN_MODE_HANDLES) {
      return absl::InvalidArgumentError(
          absl::StrCat("mode: ", static_cast<int>(request_->mode()),
                       " is not a ReturnMode (BYTES or HANDLES)"));
    }
    if (static_cast<uint64_t>(request_->block_ids_size()) > limit) {
      return absl::InvalidArgumentError(absl::StrCat(
          "block_ids: ", request_->block_ids_size(), " exceed limits.max_batch_blocks = ", limit));
    }
    if (request_->lease_ttl_ms() > runtime_->config().leases.max_ttl_ms) {
      return absl::InvalidArgumentError(absl::StrCat("lease_ttl_ms: ", request_->lease_ttl_ms(),
                                                     " exceeds leases.max_ttl_ms = ",
                                                     runtime_->config().leases.max_ttl_ms));
    }
    if (auto profile = runtime_->store()->GetProfile(request_->profile_id()); !profile.ok()) {
      return absl::InvalidArgumentError(std::string(profile.status().message()));
    }
    return absl::OkStatus();
  }

  absl::Status AcquireHandles() {
    std::vector<BlockKey> keys;
    for (const std::string& id : request_->block_ids()) {
      keys.push_back(BlockKey{tenant_, request_->profile_id(), id});
    }
    std::vector<absl::StatusOr<DeviceHandle>> handles;
    auto lease =
        runtime_->store()->AcquireHandles(tenant_, keys, request_->lease_ttl_ms(), &handles);
    if (!lease.ok()) return lease.status();
    response_.set_lease_id(*lease);
    for (size_t i = 0; i < keys.size(); ++i) {
      v1::BlockResult* result = response_.add_results();
      result->set_block_id(keys[i].block_id);
      ToItemStatus(handles[i].status(), result->mutable_status());
      if (handles[i].ok()) {
        result->set_tier(v1::TIER_DEVICE);
        *result->mutable_handle() = ToProto(*handles[i]);
        runtime_->compactor()->Annotate(tenant_, request_->profile_id(), result);
      }
    }
    // Handles fit in one message, but compacted blocks carry their slots.
    const uint64_t limit = runtime_->config().server.max_message_bytes;
    if (response_.ByteSizeLong() > limit) {
      if (*lease != 0) runtime_->store()->Release(tenant_, *lease).IgnoreError();
      response_.Clear();
      return absl::ResourceExhaustedError(absl::StrCat(
          "block_ids: the handles and compacted slots of ", keys.size(),
          " blocks exceed server.max_message_bytes = ", limit, "; ask for fewer blocks"));
    }
    return absl::OkStatus();
  }

  // Fills the next response with as many blocks as fit in the message
  // budget (at least one) and writes it; finishes after the last.
  void NextWrite() {
    response_.Clear();
    const uint64_t budget = runtime_->config().server.max_message_bytes - (64u << 10);
    uint64_t bytes = 0;
    while (next_ < request_->block_ids_size()) {
      const std::string& id = request_->block_ids(next_);
      // The block is read straight into the response: a cleared response
      // keeps its results and their strings' capacity, so from the second
      // message on a block costs no allocation (and no page faults).
      v1::BlockResult* result = response_.add_results();
      std::string* data = result->mutable_data();
      TierId from = TierId::kHost;
      absl::Status st =
          runtime_->store()->Get(BlockKey{tenant_, request_->profile_id(), id}, data, &from);
      if (!st.ok()) data->clear();  // never a previous block's bytes
      if (st.ok() && data->size() > budget) {
        data->clear();
        st = absl::ResourceExhaustedError(
            absl::StrCat("block is larger than server.max_message_bytes allows; use "
                         "RETURN_MODE_HANDLES"));
      }
      if (response_.results_size() > 1 && bytes + data->size() > budget) {
        response_.mutable_results()->RemoveLast();  // read again for the next message
        break;
      }
      ++next_;
      bytes += data->size() + id.size() + 32;
      result->set_block_id(id);
      ToItemStatus(st, result->mutable_status());
      if (st.ok()) {
        runtime_->metrics()->BytesGot(data->size());
        result->set_tier(ToProto(from));
        runtime_->compactor()->Annotate(tenant_, request_->profile_id(), result);
        bytes += result->compacted().ByteSizeLong();
      }
    }
    if (response_.results_size() == 0) {
      Finish(grpc::Status::OK);
      return;
    }
    StartWrite(&response_);
  }

  Runtime* const runtime_;
  const std::string tenant_;
  const v1::GetBlocksRequest* const request_;
  v1::GetBlocksResponse response_;
  int next_ = 0;
  bool handles_sent_ = false;
};

}  // namespace

grpc::ServerReadReactor<v1::PutBlocksRequest>* NewPutBlocksReactor(
    Runtime* runtime, grpc::CallbackServerContext* ctx, v1::PutBlocksResponse* response) {
  absl::StatusOr<TenantPtr> caller = CallerOf(runtime->tenants(), ctx);
  if (!caller.ok()) {
    return new FinishedReadReactor<v1::PutBlocksRequest>(ToGrpcStatus(caller.status()));
  }
  return new PutBlocksReactor(runtime, (*caller)->name, response);
}

grpc::ServerWriteReactor<v1::GetBlocksResponse>* NewGetBlocksReactor(
    Runtime* runtime, grpc::CallbackServerContext* ctx, const v1::GetBlocksRequest* request) {
  absl::StatusOr<TenantPtr> caller = CallerOf(runtime->tenants(), ctx);
  if (!caller.ok()) {
    return new FinishedWriteReactor<v1::GetBlocksResponse>(ToGrpcStatus(caller.status()));
  }
  return new GetBlocksReactor(runtime, (*caller)->name, request);
}

}  // namespace kvtier::daemon
