// Block checksums: XXH3-64 of a payload, the one function every tier, the
// catalog records and the clients' optional `xxh3` agree on.
//
// BlockChecksum is XXH3_64bits computed with the widest vector unit the CPU
// has (AVX2 or AVX-512 through libxxhash's x86 dispatcher; the baseline
// build uses SSE2 and is 1.5-2x slower on the block sizes kvtier stores).
// It returns exactly XXH3_64bits(data, size).
//
// Thread safety: stateless; safe from any thread.
#ifndef KVTIER_STORAGE_COMMON_CHECKSUM_H_
#define KVTIER_STORAGE_COMMON_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"

namespace kvtier {

uint64_t BlockChecksum(absl::Span<const uint8_t> data);

// Copies `src` to `dst` (src.size() bytes; the ranges must not overlap) and
// returns BlockChecksum of the bytes written to `dst`, in one pass over
// memory: each chunk is hashed from `dst` right after it is copied, while it
// is still in cache. Hashing the destination, not the source, makes the
// checksum describe the private copy even when another process may be
// changing the source meanwhile.
uint64_t CopyWithChecksum(absl::Span<const uint8_t> src, uint8_t* dst);

// CopyWithChecksum of the concatenation of `pieces` (a payload received in
// several buffers): copies them one after another to `dst` and returns
// BlockChecksum of everything written, in the same single pass.
uint64_t GatherWithChecksum(absl::Span<const absl::Span<const uint8_t>> pieces, uint8_t* dst);

// GatherWithChecksum that calls on_chunk(written) after each chunk (at most
// kChecksumChunkBytes) is copied and hashed, with the bytes written to
// `dst` so far, so that the caller can work on the chunk while it is still
// in cache (a put's key summary). The last call has written == the total.
inline constexpr size_t kChecksumChunkBytes = 32 << 10;
uint64_t GatherWithChecksum(absl::Span<const absl::Span<const uint8_t>> pieces, uint8_t* dst,
                            absl::FunctionRef<void(size_t written)> on_chunk);

}  // namespace kvtier

#endif  // KVTIER_STORAGE_COMMON_CHECKSUM_H_
