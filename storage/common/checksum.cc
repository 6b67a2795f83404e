#include "storage/common/checksum.h"

// The streaming state is used on the stack (layout from the installed
// header, which the package pins to its library).
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
// Redefines XXH3_64bits as XXH3_64bits_dispatch (AVX2/AVX-512 when present).
#include <xxh_x86dispatch.h>
#endif

namespace kvtier {

uint64_t BlockChecksum(absl::Span<const uint8_t> data) {
  return XXH3_64bits(data.data(), data.size());
}

uint64_t CopyWithChecksum(absl::Span<const uint8_t> src, uint8_t* dst) {
  // Small blocks: the one-shot hash is cheaper than the streaming state.
  constexpr size_t kChunkBytes = kChecksumChunkBytes;  // copied and hashed within L1/L2
  if (src.size() <= kChunkBytes) {
    std::memcpy(dst, src.data(), src.size());
    return XXH3_64bits(dst, src.size());
  }
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (size_t done = 0; done < src.size();) {
    const size_t n = std::min(kChunkBytes, src.size() - done);
    std::memcpy(dst + done, src.data() + done, n);
    XXH3_64bits_update(&state, dst + done, n);
    done += n;
  }
  return XXH3_64bits_digest(&state);
}

uint64_t GatherWithChecksum(absl::Span<const absl::Span<const uint8_t>> pieces, uint8_t* dst) {
  if (pieces.size() == 1) return CopyWithChecksum(pieces[0], dst);
  return GatherWithChecksum(pieces, dst, [](size_t) {});
}

uint64_t GatherWithChecksum(absl::Span<const absl::Span<const uint8_t>> pieces, uint8_t* dst,
                            absl::FunctionRef<void(size_t written)> on_chunk) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  size_t written = 0;
  for (const absl::Span<const uint8_t>& piece : pieces) {
    for (size_t done = 0; done < piece.size();) {
      const size_t n = std::min(kChecksumChunkBytes, piece.size() - done);
      std::memcpy(dst + written, piece.data() + done, n);
      XXH3_64bits_update(&state, dst + written, n);
      written += n;
      done += n;
      on_chunk(written);
    }
  }
  return XXH3_64bits_digest(&state);
}

}  // namespace kvtier
