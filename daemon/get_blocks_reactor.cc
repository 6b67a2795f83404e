// GetBlocks as a raw (ByteBuffer) server stream. Bytes mode sends each
// block from its host-tier copy in place: the response message is the
// GetBlocksResponse wire format assembled from slices, each block's data a
// slice over a BlockStore::View that keeps the copy where it is until gRPC
// has sent it (the slice's destructor drops the view). Handles mode
// serialises the typed message as before.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/impl/codegen/proto_utils.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/block_reactors.h"
#include "daemon/blocking_pool.h"
#include "daemon/convert.h"
#include "daemon/grpc_status.h"
#include "daemon/reactors.h"
#include "daemon/streams.h"
#include "daemon/tenant.h"
#include "proto/wire/wire.h"

namespace kvtier::daemon {
namespace {

using wire::AppendLengthKey;

// GetBlocksResponse.results = 1; BlockResult.data = 4.
constexpr uint32_t kResultsField = 1;
constexpr uint32_t kDataField = 4;

// States (under mu_): a step of the call is on the I/O pool (kScheduled),
// waits for queued bytes (kWaiting), or its message is being written
// (kWriting); Abort ends the call when that step returns.
class GetBlocksReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer>,
                               public StreamTable::Stream,
                               public ReactorRefs {
 public:
  GetBlocksReactor(Runtime* runtime, grpc::CallbackServerContext* ctx, std::string tenant,
                   v1::GetBlocksRequest request)
      : runtime_(runtime), ctx_(ctx), tenant_(std::move(tenant)), request_(std::move(request)) {}

  void Start(CallCredentials credentials) {
    absl::Status st = Validate();
    absl::StatusOr<std::unique_ptr<StreamTable::Ticket>> ticket =
        st.ok() ? runtime_->streams()->Open("GetBlocks", tenant_, std::move(credentials), this)
                : st;
    {
      absl::MutexLock lock(&mu_);
      if (!ticket.ok()) {
        FinishLocked(ToGrpcStatus(ticket.status()));
        return;
      }
      ticket_ = std::move(*ticket);
      if (!abort_.ok()) {  // aborted since Open
        FinishLocked(abort_);
        return;
      }
    }
    if (request_.mode() == v1::RETURN_MODE_HANDLES) {
      // Promotion into the arena may read NVMe: on an I/O thread.
      Schedule([this] { SendHandles(); });
      return;
    }
    Schedule([this] { NextMessage(); });
  }

  void Abort(const grpc::Status& status, bool wait_dropped) override {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (abort_.ok()) abort_ = status;  // a stall after a revoke keeps the revoke
    if (state_ == State::kWriting) {
      // A stalled write is cancelled (OnWriteDone finishes); otherwise the
      // write completes and OnWriteDone finishes with abort_.
      if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) ctx_->TryCancel();
    } else if (state_ == State::kWaiting && wait_dropped) {
      FinishLocked(abort_);
    }  // kScheduled / a granted wait: the step finishes when it runs
  }

  void OnWriteDone(bool ok) override {
    ticket_->WriteDone();
    buffer_.Clear();  // gRPC is done with the slices: their views go
    ticket_->ReleaseBytes(held_bytes_);
    held_bytes_ = 0;
    {
      absl::MutexLock lock(&mu_);
      if (!abort_.ok()) {
        FinishLocked(abort_);
        return;
      }
      if (!ok) {
        FinishLocked(ToGrpcStatus(absl::CancelledError("client went away")));
        return;
      }
      if (handles_sent_) {
        FinishLocked(grpc::Status::OK);
        return;
      }
    }
    Schedule([this] { NextMessage(); });
  }

  void OnDone() override { Unref(); }

 private:
  enum class State { kScheduled, kWaiting, kWriting };

  // Runs `work` (which reads blocks, possibly from NVMe, and then writes or
  // finishes) on an I/O thread; finishes RESOURCE_EXHAUSTED when none can
  // take it. No lock is held: with server.io_threads = 0 it runs inline.
  void Schedule(absl::AnyInvocable<void() &&> work) {
    Ref();  // the queued step's; also keeps this alive to the end of Schedule
    {
      absl::MutexLock lock(&mu_);
      state_ = State::kScheduled;
    }
    BlockingPool* pool = runtime_->blocking_pool();
    const uint64_t cost = std::max<uint64_t>(held_bytes_, block_bytes_);
    Ref();
    if (pool->Submit(
            tenant_,
            [this, work = std::move(work)]() mutable {
              std::move(work)();
              Unref();
            },
            cost)) {
      Unref();
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      FinishLocked(abort_.ok() ? ToGrpcStatus(pool->QueueFullStatus(tenant_)) : abort_);
    }
    Unref();
    Unref();
  }

  // True, with the call finished, when an Abort came in meanwhile.
  bool AbortedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (abort_.ok()) return false;
    FinishLocked(abort_);
    return true;
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  // Writes buffer_ (holding held_bytes_ of the queued-bytes budget), or
  // finishes when aborted meanwhile.
  void WriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (AbortedLocked()) return;
    state_ = State::kWriting;
    ticket_->WriteStarted();
    StartWrite(&buffer_);
  }

  void SendHandles() {
    v1::GetBlocksResponse response;
    absl::Status st = AcquireHandles(&response);
    bool own = false;
    grpc::Status serialised = st.ok() ? grpc::SerializationTraits<v1::GetBlocksResponse>::Serialize(
                                            response, &buffer_, &own)
                                      : ToGrpcStatus(st);
    absl::MutexLock lock(&mu_);
    if (!serialised.ok()) {
      FinishLocked(abort_.ok() ? serialised : abort_);
      return;
    }
    handles_sent_ = true;
    WriteLocked();
  }

  // Reserves the bytes of the next message from the queued-bytes budget
  // (waiting for them when the tenant or the daemon is at its bound), then
  // builds and writes it.
  void NextMessage() {
    {
      absl::MutexLock lock(&mu_);
      if (AbortedLocked()) return;
      if (next_ >= request_.block_ids_size()) {
        FinishLocked(grpc::Status::OK);
        return;
      }
      state_ = State::kWaiting;
    }
    const uint64_t remaining = static_cast<uint64_t>(request_.block_ids_size() - next_);
    const uint64_t want = std::min<uint64_t>(MessageBudget(), remaining * (block_bytes_ + 256));
    if (ticket_->AcquireBytes(want, [this, want] {
          held_bytes_ = want;
          Schedule([this] { BuildAndWrite(); });
        })) {
      held_bytes_ = want;
      BuildAndWrite();
    }
  }

  uint64_t MessageBudget() const {
    return runtime_->config().server.max_message_bytes - (64u << 10);
  }

  absl::Status Validate() {
    const uint64_t limit = runtime_->config().limits.max_batch_blocks;
    if (request_.block_ids_size() == 0) return absl::InvalidArgumentError("block_ids: empty");
    if (request_.mode() != v1::RETURN_MODE_UNSPECIFIED &&
        request_.mode() != v1::RETURN_MODE_BYTES && request_.mode() != v1::RETURN_MODE_HANDLES) {
      return absl::InvalidArgumentError(absl::StrCat("mode: ", static_cast<int>(request_.mode()),
                                                     " is not a ReturnMode (BYTES or HANDLES)"));
    }
    if (static_cast<uint64_t>(request_.block_ids_size()) > limit) {
      return absl::InvalidArgumentError(absl::StrCat("block_ids: ", request_.block_ids_size(),
                                                     " exceed limits.max_batch_blocks = ", limit));
    }
    if (request_.lease_ttl_ms() > runtime_->config().leases.max_ttl_ms) {
      return absl::InvalidArgumentError(
          absl::StrCat("lease_ttl_ms: ", request_.lease_ttl_ms(),
                       " exceeds leases.max_ttl_ms = ", runtime_->config().leases.max_ttl_ms));
    }
    auto profile = ProfileOf(runtime_->store(), tenant_, request_.profile_id());
    if (!profile.ok()) return profile.status();
    block_bytes_ = BlockSizeBytes(*profile);
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

  // Fills the next message with as many blocks as fit in the bytes it
  // holds (at least one) and writes it; finishes after the last. Each
  // result is its fields but data, serialised, then the data field: the
  // key and length in the same slice, the bytes in a slice of their own
  // over the block's view.
  void BuildAndWrite() {
    const uint64_t budget = std::min(MessageBudget(), held_bytes_);
    // The blocks that fit the budget, viewed together (blocks the remote
    // tier must bring in are fetched in one pipelined round); views not
    // sent in this message are dropped and taken again for the next.
    const int batch = static_cast<int>(
        std::clamp<uint64_t>(budget / (block_bytes_ + 256), 1, request_.block_ids_size() - next_));
    std::vector<BlockKey> keys;
    keys.reserve(batch);
    for (int i = next_; i < next_ + batch; ++i) {
      keys.push_back(BlockKey{tenant_, request_.profile_id(), request_.block_ids(i)});
    }
    std::vector<TierId> tiers;
    std::vector<absl::StatusOr<std::unique_ptr<BlockView>>> views =
        runtime_->store()->ViewMany(keys, &tiers);
    uint64_t bytes = 0;
    std::vector<grpc::Slice> slices;
    for (size_t k = 0; k < keys.size(); ++k) {
      const std::string& id = keys[k].block_id;
      const TierId from = tiers[k];
      absl::StatusOr<std::unique_ptr<BlockView>>& view = views[k];
      absl::Status st = view.status();
      const size_t size = view.ok() ? (*view)->bytes().size() : 0;
      if (st.ok() && size > MessageBudget()) {
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
        slices.emplace_back(
            const_cast<uint8_t*>(data.data()), data.size(),
            +[](void* v) { delete static_cast<BlockView*>(v); }, owned);
      }
    }
    absl::MutexLock lock(&mu_);
    if (slices.empty()) {
      FinishLocked(abort_.ok() ? grpc::Status::OK : abort_);
      return;
    }
    buffer_ = grpc::ByteBuffer(slices.data(), slices.size());
    WriteLocked();
  }

  Runtime* const runtime_;
  grpc::CallbackServerContext* const ctx_;  // valid until OnDone
  const std::string tenant_;
  const v1::GetBlocksRequest request_;
  uint64_t block_bytes_ = 0;  // the profile's, from Validate
  // Touched by one step at a time (the steps are sequential).
  grpc::ByteBuffer buffer_;  // the message being written
  uint64_t held_bytes_ = 0;  // of the queued-bytes budget, for buffer_
  int next_ = 0;
  bool handles_sent_ = false;

  absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kScheduled;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status abort_ ABSL_GUARDED_BY(mu_);  // not OK: Abort was called
  // Last: unregistered first when the reactor is deleted.
  std::unique_ptr<StreamTable::Ticket> ticket_;
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
    return new FinishedWriteReactor<grpc::ByteBuffer>(ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("request: not a GetBlocksRequest (", st.error_message(), ")"))));
  }
  auto* reactor = new GetBlocksReactor(runtime, ctx, (*caller)->name, std::move(parsed));
  reactor->Start(CredentialsOf(ctx));
  return reactor;
}

}  // namespace kvtier::daemon
