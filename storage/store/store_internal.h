// Small helpers shared by the block store's implementation files
// (block_store_*.cc). Internal to storage/store.
// Stateless; thread-safe.
#ifndef KVTIER_STORAGE_STORE_STORE_INTERNAL_H_
#define KVTIER_STORAGE_STORE_STORE_INTERNAL_H_

#include <cstdint>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "storage/catalog/records.h"
#include "storage/common/checksum.h"
#include "storage/host/host_tier.h"
#include "storage/nvme/nvme_tier.h"
#include "storage/tier.h"

namespace kvtier::store_internal {

inline std::string Describe(const BlockKey& key) {
  return absl::StrCat("block ", absl::BytesToHexString(key.block_id), " (profile ",
                      key.profile_id, ")");
}

inline uint64_t Checksum(absl::Span<const uint8_t> data) { return BlockChecksum(data); }

inline NvmeExtent ToExtent(const NvmeLocation& loc) {
  return NvmeExtent{loc.file_index, loc.offset_bytes, loc.length_bytes};
}
inline NvmeLocation FromExtent(const NvmeExtent& ext) {
  return NvmeLocation{ext.file_index, ext.offset, ext.length};
}

inline std::string HostPlace(const char* what, const HostSlot& slot) {
  return absl::StrCat(what, " @ ", slot.offset);
}

}  // namespace kvtier::store_internal

#endif  // KVTIER_STORAGE_STORE_STORE_INTERNAL_H_
