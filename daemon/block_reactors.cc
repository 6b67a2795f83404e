#include "daemon/block_reactors.h"

#include <vector>

#include <grpcpp/impl/codegen/proto_utils.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/blocking_pool.h"
#include "daemon/convert.h"
#include "daemon/grpc_status.h"
#include "daemon/options.h"
#include "daemon/reactors.h"
#include "daemon/streams.h"
#include "daemon/tenant.h"
#include "proto/wire/block_messages.h"
#include "storage/common/status_macros.h"

namespace kvtier::daemon {
namespace {

// PutBlocks as a raw (ByteBuffer) client stream: each message is parsed in
// place (proto/wire/block_messages.h) and a block's data goes from the
// slices gRPC received straight into its host-tier slot (BlockStore::
// PutPieces), never through a std::string.
class PutBlocksReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer>,
                               public StreamTable::Stream,
                               public ReactorRefs {
 public:
  PutBlocksReactor(Runtime* runtime, std::string tenant, grpc::ByteBuffer* response)
      : runtime_(runtime), tenant_(std::move(tenant)), response_buffer_(response) {}

  // Registers with the stream table and starts reading, or finishes with
  // why it cannot.
  void Start(CallCredentials credentials) {
    absl::StatusOr<std::unique_ptr<StreamTable::Ticket>> ticket =
        runtime_->streams()->Open("PutBlocks", tenant_, std::move(credentials), this);
    absl::MutexLock lock(&mu_);
    if (!ticket.ok()) {
      FinishLocked(ToGrpcStatus(ticket.status()));
      return;
    }
    ticket_ = std::move(*ticket);
    if (!finished_) StartRead(&request_);  // else aborted since Open
  }

  // A message being stored finishes it first (what it stored stays
  // stored and acknowledged in nothing: the call fails).
  void Abort(const grpc::Status& status, bool /*wait_dropped*/) override {
    absl::MutexLock lock(&mu_);
    if (processing_) {
      abort_ = status;
      return;
    }
    FinishLocked(status);  // the outstanding read fails
  }

  void OnReadDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      if (!ok) {  // the client closed its side: every message is processed
        bool own = false;
        grpc::Status st = grpc::SerializationTraits<v1::PutBlocksResponse>::Serialize(
            response_, response_buffer_, &own);
        FinishLocked(st);
        return;
      }
      processing_ = true;
    }
    // Storing may write NVMe (durable puts, demotions) and sync the
    // catalog: done on an I/O thread (inline when server.io_threads is 0,
    // so no lock is held here); the next read starts once it is done.
    BlockingPool* pool = runtime_->blocking_pool();
    const uint64_t cost = request_.Length();
    Ref();  // the queued step's
    if (!pool->Submit(
            tenant_,
            [this] {
              absl::Status st = Process();
              slices_.clear();  // the message's memory goes back to gRPC
              request_.Clear();
              {
                absl::MutexLock lock(&mu_);
                processing_ = false;
                if (!abort_.ok()) {
                  FinishLocked(abort_);
                } else if (!st.ok()) {
                  FinishLocked(ToGrpcStatus(st));
                } else {
                  StartRead(&request_);
                }
              }
              Unref();
            },
            cost)) {
      {
        absl::MutexLock lock(&mu_);
        processing_ = false;
        FinishLocked(abort_.ok() ? ToGrpcStatus(pool->QueueFullStatus(tenant_)) : abort_);
      }
      Unref();
    }
  }

  void OnDone() override { Unref(); }

 private:
  absl::Status Parse() {
    const uint64_t limit = runtime_->config().limits.max_batch_blocks;
    slices_.clear();
    if (grpc::Status dumped = request_.Dump(&slices_); !dumped.ok()) {
      return absl::InternalError(absl::StrCat("PutBlocks: ", dumped.error_message()));
    }
    pieces_.clear();
    for (const grpc::Slice& s : slices_) pieces_.emplace_back(s.begin(), s.size());
    absl::Status st =
        wire::ParsePutBlocks(pieces_, limit, "limits.max_batch_blocks", &request_view_);
    if (!st.ok()) {
      // Messages are counted from 1, as messages_received counts them.
      return absl::InvalidArgumentError(absl::StrCat("message ", response_.messages_received(),
                                                     " of the stream: ", st.message()));
    }
    return absl::OkStatus();
  }

  absl::Status Process() {
    response_.set_messages_received(response_.messages_received() + 1);
    KVTIER_RETURN_IF_ERROR(Parse());
    const wire::PutBlocksView& request = request_view_;
    if (request.profile_id == 0) {
      return absl::InvalidArgumentError("profile_id: required in every PutBlocksRequest");
    }
    if (static_cast<uint64_t>(response_.results_size()) + request.blocks.size() >
        kMaxPutResultsPerStream) {
      // Checked before storing anything of this message: the response (one
      // result per block) stays bounded, and what was acknowledged is
      // exactly what the earlier messages stored.
      return absl::ResourceExhaustedError(
          absl::StrCat("blocks: more than ", kMaxPutResultsPerStream,
                       " blocks in one PutBlocks stream; open another stream"));
    }
    if (auto profile = ProfileOf(runtime_->store(), tenant_, request.profile_id); !profile.ok()) {
      return profile.status();
    }
    // The blocks are stored in parallel (server.put_parallelism); results
    // are reported in message order.
    BlockStore* store = runtime_->store();
    outcomes_.clear();
    outcomes_.resize(request.blocks.size());
    ParallelFor(
        runtime_->blocking_pool(), outcomes_.size(), PutParallelismOf(runtime_->config()),
        [&](size_t i) {
          const wire::BlockPutView& put = request.blocks[i];
          BlockKey key{tenant_, request.profile_id, put.block_id};
          absl::StatusOr<PutOutcome>& outcome = outcomes_[i];
          switch (put.source) {
            case wire::BlockPutView::Source::kData:
              outcome = store->PutPieces(key, put.data,
                                         {.durable = request.durable,
                                          .expected_xxh3 = put.xxh3,
                                          .retain = request.retain});
              break;
            case wire::BlockPutView::Source::kSlot:
              outcome = store->PutFromStaging(key,
                                              StagingSlot{put.slot.slot_id, put.slot.offset_bytes,
                                                          put.slot.size_bytes, put.slot.generation},
                                              {.durable = request.durable,
                                               .expected_xxh3 = put.xxh3,
                                               .retain = request.retain});
              break;
            default:
              outcome =
                  absl::InvalidArgumentError(absl::StrCat("blocks[", i, "]: set data or slot"));
          }
        },
        tenant_);
    for (size_t i = 0; i < request.blocks.size(); ++i) {
      const wire::BlockPutView& put = request.blocks[i];
      const absl::StatusOr<PutOutcome>& outcome = outcomes_[i];
      v1::PutResult* result = response_.add_results();
      result->set_block_id(put.block_id);
      ToItemStatus(outcome.status(), result->mutable_status());
      if (outcome.ok()) {
        result->set_tier(ToProto(outcome->tier));
        result->set_durable(outcome->durable);
        result->set_existed(outcome->existed);
        result->set_retained(outcome->retained);
        if (!outcome->existed) {
          const uint64_t bytes =
              put.source == wire::BlockPutView::Source::kData ? put.data_size : put.slot.size_bytes;
          response_.set_blocks_stored(response_.blocks_stored() + 1);
          response_.set_bytes_stored(response_.bytes_stored() + bytes);
          runtime_->metrics()->BlocksPut(1, bytes);
        }
      }
    }
    return absl::OkStatus();
  }

  Runtime* const runtime_;
  const std::string tenant_;
  grpc::ByteBuffer* const response_buffer_;  // serialised response_, at the end
  v1::PutBlocksResponse response_;
  grpc::ByteBuffer request_;                          // the message being read or processed
  std::vector<grpc::Slice> slices_;                   // request_'s, while it is processed
  std::vector<wire::Bytes> pieces_;                   // over slices_
  wire::PutBlocksView request_view_;                  // parsed from pieces_
  std::vector<absl::StatusOr<PutOutcome>> outcomes_;  // of request_view_'s blocks

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool processing_ ABSL_GUARDED_BY(mu_) = false;  // a message is on the I/O pool
  grpc::Status abort_ ABSL_GUARDED_BY(mu_);       // set by Abort while processing
  // Last: unregistered first when the reactor is deleted.
  std::unique_ptr<StreamTable::Ticket> ticket_;
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* NewPutBlocksReactor(Runtime* runtime,
                                                               grpc::CallbackServerContext* ctx,
                                                               grpc::ByteBuffer* response) {
  absl::StatusOr<TenantPtr> caller = CallerOf(runtime->tenants(), ctx);
  if (!caller.ok()) {
    return new FinishedReadReactor<grpc::ByteBuffer>(ToGrpcStatus(caller.status()));
  }
  auto* reactor = new PutBlocksReactor(runtime, (*caller)->name, response);
  reactor->Start(CredentialsOf(ctx));
  return reactor;
}

}  // namespace kvtier::daemon
