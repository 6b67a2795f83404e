// Client::PutBlockData and Client::GetBlockData: the block RPCs as generic
// (ByteBuffer) calls, their messages written and parsed as wire format
// (proto/wire/block_messages.h) so that a payload is never copied into or
// out of a protobuf object on this side.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "proto/wire/block_messages.h"

namespace kvtier {
namespace {

constexpr char kPutBlocksMethod[] = "/kvtier.v1.KvTier/PutBlocks";
constexpr char kGetBlocksMethod[] = "/kvtier.v1.KvTier/GetBlocks";

// A generic streaming call driven on its own completion queue, one
// operation at a time. Every method blocks until its operation completes;
// false means the stream is over (Finish says why).
class GenericCall {
 public:
  GenericCall(grpc::GenericStub* stub, const char* method,
              std::chrono::system_clock::time_point deadline) {
    ctx_.set_deadline(deadline);
    call_ = stub->PrepareCall(&ctx_, method, &cq_);
    call_->StartCall(this);
    Wait();
  }
  ~GenericCall() {
    call_.reset();
    cq_.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  bool Write(const grpc::ByteBuffer& message) {
    call_->Write(message, this);
    return Wait();
  }
  bool WritesDone() {
    call_->WritesDone(this);
    return Wait();
  }
  bool Read(grpc::ByteBuffer* message) {
    call_->Read(message, this);
    return Wait();
  }
  void Cancel() { ctx_.TryCancel(); }
  grpc::Status Finish() {
    grpc::Status status;
    call_->Finish(&status, this);
    Wait();
    return status;
  }

 private:
  bool Wait() {
    void* tag = nullptr;
    bool ok = false;
    return cq_.Next(&tag, &ok) && ok;
  }

  // Declared first: destroyed after the call and its context.
  grpc::CompletionQueue cq_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
};

// Counts the slices over the caller's memory that gRPC still holds; the
// call returns only when every one is back.
class LentMemory {
 public:
  // A slice over [data, data + size) that counts as lent until gRPC drops
  // its last reference.
  grpc::Slice Lend(absl::Span<const uint8_t> data) {
    {
      absl::MutexLock lock(&mu_);
      ++out_;
    }
    return grpc::Slice(const_cast<uint8_t*>(data.data()), data.size(), &LentMemory::Return, this);
  }
  void WaitAllReturned() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int64_t* out) { return *out == 0; }, &out_));
  }

 private:
  static void Return(void* self) {
    auto* lent = static_cast<LentMemory*>(self);
    absl::MutexLock lock(&lent->mu_);
    --lent->out_;
  }

  absl::Mutex mu_;
  int64_t out_ ABSL_GUARDED_BY(mu_) = 0;
};

std::chrono::system_clock::time_point DeadlineOf(const ClientOptions& options) {
  return std::chrono::system_clock::now() + options.call_timeout;
}

absl::StatusOr<v1::PutBlocksResponse> StreamPuts(grpc::GenericStub* stub,
                                                 const ClientOptions& client_options,
                                                 uint64_t profile_id,
                                                 absl::Span<const BlockData> blocks,
                                                 const PutDataOptions& options, LentMemory* lent) {
  GenericCall call(stub, kPutBlocksMethod, DeadlineOf(client_options));
  const std::string head = wire::PutBlocksHead(profile_id, options.durable, options.retain);
  uint64_t sent = 0;
  for (size_t next = 0; next < blocks.size();) {
    std::vector<grpc::Slice> slices;
    slices.emplace_back(head);
    uint64_t bytes = head.size();
    for (uint32_t n = 0; next < blocks.size() && n < options.message_blocks; ++n, ++next) {
      const BlockData& b = blocks[next];
      std::string block_head = wire::BlockPutHead(b.block_id, b.xxh3, b.data.size());
      if (n > 0 && bytes + block_head.size() + b.data.size() > options.message_bytes) break;
      bytes += block_head.size() + b.data.size();
      slices.emplace_back(block_head);
      if (!b.data.empty()) slices.push_back(lent->Lend(b.data));
    }
    grpc::ByteBuffer message(slices.data(), slices.size());
    slices.clear();
    if (!call.Write(message)) break;  // the daemon finished early; Finish says why
    ++sent;
  }
  call.WritesDone();
  grpc::ByteBuffer reply;
  const bool got_reply = call.Read(&reply);
  grpc::Status st = call.Finish();
  if (!st.ok()) return FromGrpcStatus(st);
  v1::PutBlocksResponse response;
  if (!got_reply) return absl::InternalError("PutBlocks: the daemon sent no response");
  st = grpc::SerializationTraits<v1::PutBlocksResponse>::Deserialize(&reply, &response);
  if (!st.ok()) return absl::InternalError("PutBlocks: " + st.error_message());
  if (response.messages_received() != sent) {
    return absl::DataLossError(absl::StrCat("PutBlocks: the daemon read ",
                                            response.messages_received(), " of the ", sent,
                                            " messages sent"));
  }
  return response;
}

}  // namespace

absl::StatusOr<v1::PutBlocksResponse> Client::PutBlockData(uint64_t profile_id,
                                                           absl::Span<const BlockData> blocks,
                                                           const PutDataOptions& options) {
  if (blocks.empty()) return absl::InvalidArgumentError("blocks: empty");
  if (options.message_blocks == 0) {
    return absl::InvalidArgumentError("options.message_blocks: 0; at least 1");
  }
  LentMemory lent;
  absl::StatusOr<v1::PutBlocksResponse> response;
  response = StreamPuts(generic_.get(), options_, profile_id, blocks, options, &lent);
  // The call is gone; gRPC drops what it still holds of the messages.
  lent.WaitAllReturned();
  return response;
}

absl::StatusOr<std::vector<BlockDataResult>> Client::GetBlockData(
    uint64_t profile_id, absl::Span<const BlockDestination> blocks, uint32_t ids_per_call) {
  if (blocks.empty()) return absl::InvalidArgumentError("blocks: empty");
  if (ids_per_call == 0) return absl::InvalidArgumentError("ids_per_call: 0; at least 1");
  std::vector<BlockDataResult> results(blocks.size());
  for (size_t first = 0; first < blocks.size(); first += ids_per_call) {
    const size_t end = std::min(blocks.size(), first + ids_per_call);
    v1::GetBlocksRequest request;
    request.set_profile_id(profile_id);
    request.set_mode(v1::RETURN_MODE_BYTES);
    for (size_t i = first; i < end; ++i) {
      request.add_block_ids(blocks[i].block_id.data(), blocks[i].block_id.size());
    }
    grpc::ByteBuffer request_bytes;
    bool own = false;
    grpc::Status st =
        grpc::SerializationTraits<v1::GetBlocksRequest>::Serialize(request, &request_bytes, &own);
    if (!st.ok()) return FromGrpcStatus(st);

    GenericCall call(generic_.get(), kGetBlocksMethod, DeadlineOf(options_));
    if (call.Write(request_bytes)) call.WritesDone();
    size_t next = first;
    absl::Status failed;
    grpc::ByteBuffer message;
    std::vector<grpc::Slice> slices;
    std::vector<wire::Bytes> pieces;
    while (failed.ok() && call.Read(&message)) {
      slices.clear();
      pieces.clear();
      if (grpc::Status dumped = message.Dump(&slices); !dumped.ok()) {
        failed = FromGrpcStatus(dumped);
        break;
      }
      for (const grpc::Slice& s : slices) pieces.emplace_back(s.begin(), s.size());
      wire::GetBlocksView view;
      failed = wire::ParseGetBlocksResponse(pieces, &view);
      for (size_t r = 0; failed.ok() && r < view.results.size(); ++r, ++next) {
        const wire::BlockResultView& got = view.results[r];
        if (next >= end || got.block_id != blocks[next].block_id) {
          failed = absl::InternalError(absl::StrCat("GetBlocks: result ", next - first,
                                                    " is not for the id asked for in that place"));
          break;
        }
        BlockDataResult& out = results[next];
        out.tier = static_cast<v1::Tier>(got.tier);
        const absl::Span<uint8_t> dst = blocks[next].dst;
        if (got.status_code != 0) {
          out.status =
              absl::Status(static_cast<absl::StatusCode>(got.status_code), got.status_message);
        } else if (got.data_size != dst.size()) {
          out.status = absl::InvalidArgumentError(absl::StrCat(
              "blocks[", next, "].dst: ", dst.size(), " bytes; the block has ", got.data_size));
        } else {
          uint8_t* to = dst.data();
          for (const wire::Bytes& range : got.data) {
            std::memcpy(to, range.data(), range.size());
            to += range.size();
          }
        }
      }
    }
    if (!failed.ok()) call.Cancel();
    st = call.Finish();
    if (!failed.ok()) return failed;
    if (!st.ok()) return FromGrpcStatus(st);
    if (next != end) {
      return absl::DataLossError(absl::StrCat("GetBlocks: the daemon answered ", next - first,
                                              " of ", end - first, " blocks"));
    }
  }
  return results;
}

}  // namespace kvtier
