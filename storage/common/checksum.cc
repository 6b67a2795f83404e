#include "storage/common/checksum.h"

#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
// Redefines XXH3_64bits as XXH3_64bits_dispatch (AVX2/AVX-512 when present).
#include <xxh_x86dispatch.h>
#endif

namespace kvtier {

uint64_t BlockChecksum(absl::Span<const uint8_t> data) {
  return XXH3_64bits(data.data(), data.size());
}

}  // namespace kvtier
