// The block messages whose payloads travel without being copied into
// message objects: PutBlocksRequest (client -> daemon) and
// GetBlocksResponse (daemon -> client), read from and written as protobuf
// wire format (proto/wire/wire.h) so that a block's bytes are the pieces
// gRPC received or the caller's own memory.
//
// Field numbers are those of proto/kvtier/v1/kvtier.proto and types.proto;
// wire_test.cc checks every encoder and parser here against libprotobuf on
// the same messages. Parsing follows protobuf's rules: fields in any order,
// unknown fields skipped, the last value of a scalar wins, setting one
// member of a oneof clears the other, a nested message seen twice merges.
//
// Thread safety: free functions over caller-owned data.
#ifndef KVTIER_PROTO_WIRE_BLOCK_MESSAGES_H_
#define KVTIER_PROTO_WIRE_BLOCK_MESSAGES_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "proto/wire/wire.h"

namespace kvtier::wire {

// Longest bytes field copied out of a message while parsing (ids, status
// messages). Block ids have 1..32 bytes; a longer one still parses, so the
// store can name it in the block's own status.
inline constexpr uint64_t kMaxCopiedFieldBytes = 4096;

// ---- PutBlocksRequest ----------------------------------------------------

struct SlotRefFields {
  uint64_t slot_id = 0;
  uint64_t offset_bytes = 0;
  uint64_t size_bytes = 0;
  uint64_t generation = 0;
};

struct BlockPutView {
  enum class Source { kNone, kData, kSlot };
  std::string block_id;
  Source source = Source::kNone;
  std::vector<Bytes> data;  // kData: the payload, as ranges of the pieces
  uint64_t data_size = 0;   // sum of data's sizes
  SlotRefFields slot;       // kSlot
  uint64_t xxh3 = 0;
};

struct PutBlocksView {
  uint64_t profile_id = 0;
  bool durable = false;
  bool retain = false;
  std::vector<BlockPutView> blocks;
};

// Parses a PutBlocksRequest held in `pieces`; the data ranges point into
// them. INVALID_ARGUMENT naming the field and byte offset when the bytes are
// not a PutBlocksRequest (*out is then unspecified). At most `max_blocks`
// blocks are parsed; more is INVALID_ARGUMENT naming "blocks" and
// `limit_name` (the setting that sets the limit).
absl::Status ParsePutBlocks(absl::Span<const Bytes> pieces, uint64_t max_blocks,
                            const char* limit_name, PutBlocksView* out);

// Encoding, for a message sent as slices: PutBlocksHead, then per block
// BlockPutHead followed by exactly data_size payload bytes (a slice of the
// caller's memory).
std::string PutBlocksHead(uint64_t profile_id, bool durable, bool retain);
std::string BlockPutHead(std::string_view block_id, uint64_t xxh3, uint64_t data_size);

// ---- GetBlocksResponse ---------------------------------------------------

struct BlockResultView {
  std::string block_id;
  int32_t status_code = 0;  // ItemStatus.code (a google.rpc code)
  std::string status_message;
  int32_t tier = 0;         // v1::Tier
  std::vector<Bytes> data;  // BYTES mode payload, as ranges of the pieces
  uint64_t data_size = 0;
  bool has_handle = false;     // HANDLES mode (not decoded here)
  bool has_compacted = false;  // CompactedSlots (not decoded here)
};

struct GetBlocksView {
  std::vector<BlockResultView> results;
  uint64_t lease_id = 0;
};

// Parses a GetBlocksResponse held in `pieces`, appending its results to
// out->results (a call's responses accumulate). INVALID_ARGUMENT naming the
// field and byte offset when malformed.
absl::Status ParseGetBlocksResponse(absl::Span<const Bytes> pieces, GetBlocksView* out);

}  // namespace kvtier::wire

#endif  // KVTIER_PROTO_WIRE_BLOCK_MESSAGES_H_
