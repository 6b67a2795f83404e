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
#include "storage/common/client_text.h"
#include "storage/host/host_tier.h"
#include "storage/nvme/nvme_tier.h"
#include "storage/tier.h"

namespace kvtier::store_internal {

// Block ids are quoted through ClientHex: a key that failed validation
// (or never went through it) still makes a short message.
inline std::string Describe(const BlockKey& key) {
  return absl::StrCat("block ", ClientHex(key.block_id), " (profile ", key.profile_id, ")");
}

// The one answer for a profile id that is not the caller's: unknown, or
// another tenant's (the same words, so that it reveals nothing).
inline absl::Status UnknownProfile(uint64_t profile_id) {
  return absl::NotFoundError(absl::StrCat("profile_id: ", profile_id, " is not registered"));
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
