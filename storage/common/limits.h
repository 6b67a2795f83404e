// The fixed limits of kvtier's API: one table, used by the validation of
// every request (INVALID_ARGUMENT naming the field when exceeded), quoted
// by the comments of proto/kvtier/v1/*.proto and by docs/API.md ("Limits").
// Limits an operator sets (message size, ids per request, contexts, queue
// depths, tier capacities) live in the configuration (daemon/config.h) and
// are listed in the same section of docs/API.md.
//
// Header only; constants, no state.
#ifndef KVTIER_STORAGE_COMMON_LIMITS_H_
#define KVTIER_STORAGE_COMMON_LIMITS_H_

#include <cstddef>
#include <cstdint>

namespace kvtier {

// Names.
inline constexpr size_t kMaxTenantBytes = 128;          // tenant of a key
inline constexpr size_t kMaxBlockIdBytes = 32;          // block_id, 1..32 bytes
inline constexpr size_t kMaxContextIdBytes = 64;        // context_id, 1..64 bytes
inline constexpr size_t kMaxProfileNameBytes = 128;     // profile.name, 1..128
inline constexpr size_t kMaxProfileRevisionBytes = 64;  // profile.revision, 0..64

// Model profiles (proto ModelProfile).
inline constexpr uint32_t kMaxLayers = 1024;           // num_layers, 1..1024
inline constexpr uint32_t kMaxKvHeads = 1024;          // num_kv_heads, 1..1024
inline constexpr uint32_t kMaxHeadDim = 1024;          // head_dim, 1..1024
inline constexpr uint32_t kMaxBlockSizeTokens = 4096;  // block_size_tokens, 1..4096
// A block's payload (layers * 2 * kv_heads * tokens * head_dim * dtype).
// Every tier stores blocks up to this size (the NVMe tier's staging
// buffers are sized for it; a profile whose blocks do not fit the
// configured tiers is refused at registration).
inline constexpr uint64_t kMaxBlockBytes = uint64_t{64} << 20;  // 64 MiB
inline constexpr size_t kMaxCalibrationBytes = 64 * 1024;       // encoded calibration

// Stored per block.
inline constexpr size_t kMaxSummaryBytes = 256 * 1024;  // v_b summary blob

// Contexts.
inline constexpr size_t kMaxContextSegments = 4096;   // segments per context
inline constexpr size_t kMaxContextBlocks = 1 << 18;  // blocks over all segments

}  // namespace kvtier

#endif  // KVTIER_STORAGE_COMMON_LIMITS_H_
