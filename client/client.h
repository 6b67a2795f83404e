// kvtier::Client: the C++ client library for kvtierd.
//
//   auto client = kvtier::Client::Connect("./var/kvtier/kvtierd.sock");
//   if (!client.ok()) ...;
//   auto stats = (*client)->Stats();
//
// A target is a Unix socket path ("/run/kvtier/kvtierd.sock", "unix:..."),
// or "host:port" for TCP (NormalizeTarget below). Every call returns
// absl::Status / StatusOr with the daemon's gRPC status code and message
// unchanged; per-item outcomes (one per block or context) stay in the
// responses' ItemStatus fields (FromItemStatus turns one into a Status).
//
// Deadlines: each unary call gets ClientOptions.call_timeout; calls that
// read or write whole contexts (CompactContext, DropContextVersion) get ten
// of them; Drain, Verify and Select streams take their own (none by
// default: they last as long as the work).
//
// The calls match the Python package's (client/python/kvtier/client.py):
// contexts (OpenContext, AppendBlocks, CloseContext), Select streams
// (client/select_stream.h), staged puts (PutBlocksStaged), compaction and
// every Admin call. Admin wrappers are in client/admin_calls.cc.
//
// Authentication: with ClientOptions.token set, every call made through this
// client's channel -- the wrappers below, the stubs kvtier_stub() and
// admin_stub() hand out (streams included) and Health -- carries the
// metadata "authorization: Bearer <token>" (a channel interceptor adds it).
// A daemon with auth.tenants_file set answers UNAUTHENTICATED without it.
// Its CPU arena and staging file are then reached through the fd socket
// its responses name, not by path: ArenaSource / StagingSource below feed
// client/shm's mappers either way.
//
// Thread safety: a Client is safe for concurrent use by multiple threads
// (one gRPC channel, shared).
#ifndef KVTIER_CLIENT_CLIENT_H_
#define KVTIER_CLIENT_CLIENT_H_

#include <grpcpp/generic/generic_stub.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "client/select_stream.h"
#include "client/shm/shm_mapping.h"
#include "kvtier/v1/admin.grpc.pb.h"
#include "kvtier/v1/kvtier.grpc.pb.h"

namespace grpc {
class Channel;
}

namespace kvtier {

// Longest bearer token Connect accepts.
inline constexpr size_t kMaxTokenBytes = 256;

struct ClientOptions {
  // Bearer token of the caller's tenant; empty: none (authentication off).
  // Printable ASCII without spaces, at most kMaxTokenBytes.
  std::string token;
  // Deadline of each unary call.
  std::chrono::milliseconds call_timeout{10000};
  // Largest message sent or received; match the daemon's
  // server.max_message_bytes.
  int max_message_bytes = 64 << 20;
  // TLS for a TCP target (the daemon serves TCP only with TLS). With
  // tls_root_certs_pem set the channel uses TLS and trusts those roots;
  // tls_cert_chain_pem + tls_private_key_pem add a client certificate
  // (mTLS: its common name maps to a tenant). tls_server_name overrides
  // the name checked against the server certificate (default: the host).
  // Empty: plaintext (right for a Unix socket).
  std::string tls_root_certs_pem;
  std::string tls_cert_chain_pem;
  std::string tls_private_key_pem;
  std::string tls_server_name;
  // A connection of this Client's own, not shared with other Clients of
  // the same target and options (gRPC shares one by default). For
  // engines reading many large GetBlocks responses from several threads:
  // give each thread a Client with its own connection (measured in
  // docs/BENCHMARKS.md, "Remote tier").
  bool own_connection = false;
};

enum class ServingStatus { kUnknown, kServing, kNotServing };

// Block payloads sent and received without protobuf copies (PutBlockData,
// GetBlockData below; client/block_data.cc).
struct BlockData {
  std::string_view block_id;
  absl::Span<const uint8_t> data;  // the caller's memory, read in place
  uint64_t xxh3 = 0;  // optional XXH3-64 of data: the daemon refuses a mismatch (DATA_LOSS)
};
struct PutDataOptions {
  bool durable = false;  // as PutBlocksRequest.durable
  bool retain = false;   // as PutBlocksRequest.retain
  // Blocks are grouped into messages of at most message_bytes (a larger
  // block goes alone) and message_blocks blocks (at most the daemon's
  // limits.max_batch_blocks).
  uint64_t message_bytes = 4 << 20;
  uint32_t message_blocks = 256;
};
struct BlockDestination {
  std::string_view block_id;
  absl::Span<uint8_t> dst;  // exactly the block's size
};
struct BlockDataResult {
  absl::Status status;                   // the block's ItemStatus; OK: dst holds its bytes
  v1::Tier tier = v1::TIER_UNSPECIFIED;  // where the daemon read it from
};

class Client {
 public:
  // Creates the channel; does not wait for the daemon (the first call does).
  // INVALID_ARGUMENT for an empty target, or a token that is not printable
  // ASCII without spaces or longer than kMaxTokenBytes ("options.token").
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& target,
                                                         const ClientOptions& options = {});

  // The gRPC target string actually used, e.g. "unix:/abs/path.sock".
  const std::string& target() const { return target_; }

  // grpc.health.v1 Check of the whole server ("" service).
  absl::StatusOr<ServingStatus> Health();

  // Admin service (the admin role when authentication is on).
  absl::StatusOr<v1::StatsResponse> Stats();
  absl::StatusOr<v1::ListBlocksResponse> ListBlocks(const v1::ListBlocksRequest& request);
  absl::StatusOr<v1::ListContextsResponse> ListContexts();
  absl::StatusOr<v1::ListProfilesResponse> ListProfiles();
  absl::StatusOr<v1::EvictResponse> Evict(const v1::EvictRequest& request);
  // Drain and Verify stream progress: on_progress (may be empty) sees every
  // message as it arrives; the last one is returned (an empty message when
  // the daemon sent none). timeout 0: no deadline.
  absl::StatusOr<v1::DrainProgress> Drain(
      const v1::DrainRequest& request,
      const std::function<void(const v1::DrainProgress&)>& on_progress = {},
      std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  absl::StatusOr<v1::VerifyProgress> Verify(
      const v1::VerifyRequest& request,
      const std::function<void(const v1::VerifyProgress&)>& on_progress = {},
      std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

  // Data-plane calls (blocking wrappers). Per-block outcomes are in the
  // responses' ItemStatus fields; the returned status is the call's.
  absl::StatusOr<v1::RegisterProfileResponse> RegisterProfile(const v1::ModelProfile& profile);
  absl::StatusOr<v1::GetProfileResponse> GetProfile(uint64_t profile_id);
  absl::StatusOr<v1::LookupResponse> Lookup(const v1::LookupRequest& request);
  absl::StatusOr<v1::OpenArenaResponse> OpenArena();
  absl::StatusOr<v1::ReserveSlotsResponse> ReserveSlots(uint64_t profile_id, uint32_t count,
                                                        uint32_t lease_ttl_ms = 0);
  // Streams the requests in order and returns the single response.
  absl::StatusOr<v1::PutBlocksResponse> PutBlocks(
      const std::vector<v1::PutBlocksRequest>& requests);
  // Collects every streamed response into one list of results, in order;
  // *lease_id receives the lease of a HANDLES call (may be null).
  absl::StatusOr<std::vector<v1::BlockResult>> GetBlocks(const v1::GetBlocksRequest& request,
                                                         uint64_t* lease_id = nullptr);
  // PutBlocks from the caller's memory: each message is written as slices
  // that point at the blocks' bytes, so the only copy of a payload on this
  // side is the socket write. The call returns once gRPC has let go of
  // every slice: the memory may then be reused. Returns the daemon's
  // response (one result per block, in order); DATA_LOSS when the daemon
  // read fewer messages than were sent; INVALID_ARGUMENT naming
  // "options.message_blocks" when it is 0.
  absl::StatusOr<v1::PutBlocksResponse> PutBlockData(uint64_t profile_id,
                                                     absl::Span<const BlockData> blocks,
                                                     const PutDataOptions& options = {});
  // GetBlocks in BYTES mode into the caller's buffers: every response is
  // parsed where gRPC received it and each block's bytes are copied once,
  // from the received slices into its dst. One result per block, in order:
  // the daemon's ItemStatus (NOT_FOUND for a miss), or INVALID_ARGUMENT
  // naming "blocks[i].dst" when dst is not the block's size (nothing is
  // written then). ids_per_call: blocks asked for in one GetBlocks call (at
  // most the daemon's limits.max_batch_blocks).
  absl::StatusOr<std::vector<BlockDataResult>> GetBlockData(
      uint64_t profile_id, absl::Span<const BlockDestination> blocks, uint32_t ids_per_call = 1024);
  // The staged put (Python: put_blocks(staging=True)): ReserveSlots for
  // every block, one copy of each payload into its slot of the staging
  // file (client/shm), then PutBlocks naming the slots, in messages of at
  // most options.message_blocks. No payload byte goes through gRPC.
  // INVALID_ARGUMENT naming "blocks" (empty) or "blocks[i].data" (not the
  // slot's size); the staging file's mapping error as FAILED_PRECONDITION.
  absl::StatusOr<v1::PutBlocksResponse> PutBlocksStaged(uint64_t profile_id,
                                                        absl::Span<const BlockData> blocks,
                                                        const PutDataOptions& options = {});
  absl::StatusOr<v1::DeleteBlocksResponse> DeleteBlocks(const v1::DeleteBlocksRequest& request);

  // Contexts. OpenContext remembers the shape of a context whose profile
  // this client registered or fetched (RegisterProfile, GetProfile), so
  // that SelectStream::Send can check its anchors; CloseContext forgets it.
  absl::StatusOr<v1::OpenContextResponse> OpenContext(const v1::OpenContextRequest& request);
  absl::StatusOr<v1::AppendBlocksResponse> AppendBlocks(uint64_t context_id,
                                                        absl::Span<const std::string> block_ids);
  absl::Status CloseContext(uint64_t context_id);
  // A Select stream (client/select_stream.h); deadline 0: none. The stream
  // must not outlive this client.
  std::unique_ptr<SelectStream> OpenSelectStream(
      std::chrono::milliseconds deadline = std::chrono::milliseconds(0));
  // Unpins a context's Select set (context_id) or a GetBlocks lease.
  absl::StatusOr<v1::ReleaseResponse> Release(const v1::ReleaseRequest& request);
  // SelKV compaction (docs/API.md, "Compaction"). CompactContext and
  // DropContextVersion get ten call timeouts: they read and write whole
  // contexts.
  absl::StatusOr<v1::CompactContextResponse> CompactContext(
      const v1::CompactContextRequest& request);
  absl::StatusOr<v1::ListContextVersionsResponse> ListContextVersions(
      const v1::ListContextVersionsRequest& request);
  absl::StatusOr<v1::DropContextVersionResponse> DropContextVersion(
      const v1::DropContextVersionRequest& request);

  // Where to map what OpenArena / ReserveSlots named: the path when the
  // daemon sent one, else its fd socket with this client's token. Pass the
  // result to ShmArenaView::Open / ShmStagingFile::Open (client/shm).
  client::SharedFileSource ArenaSource(const v1::OpenArenaResponse& arena) const;
  client::SharedFileSource StagingSource(const v1::ReserveSlotsResponse& slots) const;

  // Stubs for calls without a convenience wrapper (streams). Calls through
  // them carry the token too.
  v1::KvTier::Stub* kvtier_stub() { return kvtier_.get(); }
  v1::Admin::Stub* admin_stub() { return admin_.get(); }
  const ClientOptions& options() const { return options_; }

  // The shape of a context OpenContext remembered; false when unknown.
  bool ContextShapeOf(uint64_t context_id, ContextShape* shape) const;

  ~Client();

 private:
  Client(std::string target, ClientOptions options, std::shared_ptr<grpc::Channel> channel);

  const std::string target_;
  const ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KvTier::Stub> kvtier_;
  std::unique_ptr<v1::Admin::Stub> admin_;
  std::unique_ptr<grpc::GenericStub> generic_;  // PutBlockData, GetBlockData

  mutable absl::Mutex shapes_mu_;
  absl::flat_hash_map<uint64_t, ContextShape> profile_shapes_ ABSL_GUARDED_BY(shapes_mu_);
  absl::flat_hash_map<uint64_t, ContextShape> context_shapes_ ABSL_GUARDED_BY(shapes_mu_);
};

// Turns a user-supplied address into a gRPC target, as the Python
// package's normalize_target does (client/testdata/normalize_target.txt is
// the table both test): "unix:", "unix-abstract:", "dns:", "ipv4:" and
// "ipv6:" targets pass through unchanged; a path (containing '/' or ending
// in ".sock") becomes "unix:<absolute, normalised path>"; anything else is
// taken as host:port.
std::string NormalizeTarget(const std::string& target);

// An ItemStatus as a Status; `where` (e.g. "blocks[3]") prefixes the
// message of an error.
absl::Status FromItemStatus(const v1::ItemStatus& status, std::string_view where);

// The one place where grpc::Status becomes absl::Status on the client side.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace kvtier

#endif  // KVTIER_CLIENT_CLIENT_H_
