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

}  // namespace

grpc::ServerReadReactor<v1::PutBlocksRequest>* NewPutBlocksReactor(
    Runtime* runtime, grpc::CallbackServerContext* ctx, v1::PutBlocksResponse* response) {
  absl::StatusOr<TenantPtr> caller = CallerOf(runtime->tenants(), ctx);
  if (!caller.ok()) {
    return new FinishedReadReactor<v1::PutBlocksRequest>(ToGrpcStatus(caller.status()));
  }
  return new PutBlocksReactor(runtime, (*caller)->name, response);
}


}  // namespace kvtier::daemon
