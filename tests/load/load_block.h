// The blocks of the load test: one profile whose block size is chosen at
// run time, ids that name their stream and sequence number, and payloads
// that are a pure function of the id, so that every read (bytes, device
// handles) is checked without remembering what was written: for an id,
// nothing but Payload(id, size) may ever come back.
//
// Thread safety: pure functions.
#ifndef KVTIER_TESTS_LOAD_LOAD_BLOCK_H_
#define KVTIER_TESTS_LOAD_LOAD_BLOCK_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvtier/v1/types.pb.h"

namespace kvtier::load {

// Geometry of a load block: layers x (k|v) x kv_heads x tokens x head_dim
// x fp16. Only the layer count varies with the block size.
inline constexpr uint32_t kKvHeads = 4, kTokens = 16, kHeadDim = 64;
inline constexpr uint64_t kBytesPerLayer =
    uint64_t{2} * kKvHeads * kTokens * kHeadDim * 2;  // 16 KiB
inline constexpr uint32_t kMaxLayers = 64;            // 1 MiB

// The profile of blocks of block_bytes (a multiple of kBytesPerLayer, at
// most kMaxLayers layers; the caller checks). Uncalibrated: Select with the
// default scorer picks a sliding window.
v1::ModelProfile LoadProfile(uint64_t block_bytes);

// The id of block `seq` of stream `stream`: "ld", 4 bytes stream, 8 bytes
// seq (big-endian); 14 bytes, unique per (stream, seq).
std::string BlockId(uint32_t stream, uint64_t seq);
// The stream of an id made by BlockId (0 for anything else).
uint32_t StreamOf(std::string_view id);

// Exactly size_bytes (a multiple of 8) of finite fp16 values seeded from
// the id (|x| in [2^-6, 4)); different ids give different bytes.
std::string Payload(std::string_view id, size_t size_bytes);

// "" when data[0, size) is Payload(id, want_size), else what differs
// ("N bytes instead of M", "differs from Payload(id) at offset K").
std::string ComparePayload(std::string_view id, size_t want_size, const void* data, size_t size);

// Lowercase hex of the bytes, for messages.
std::string Hex(std::string_view bytes);

}  // namespace kvtier::load

#endif  // KVTIER_TESTS_LOAD_LOAD_BLOCK_H_
