// The facts the catalog keeps: block records, model profiles and contexts,
// all scoped by tenant + profile. Plain values; the byte encodings live in
// record_format.h, the store in catalog.h.
#ifndef KVTIER_STORAGE_CATALOG_RECORDS_H_
#define KVTIER_STORAGE_CATALOG_RECORDS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/common/limits.h"

namespace kvtier {

// Limits (storage/common/limits.h) are checked by the Validate* functions;
// bad input is INVALID_ARGUMENT naming the field.

// ---- Blocks ---------------------------------------------------------------

// Names a block. tenant comes from the caller's credentials (may be empty
// in a single-tenant deployment), profile_id from RegisterProfile (never
// 0), block_id is the engine's opaque id (1..kMaxBlockIdBytes bytes).
struct BlockKey {
  std::string tenant;
  uint64_t profile_id = 0;
  std::string block_id;

  friend bool operator==(const BlockKey& a, const BlockKey& b) {
    return a.profile_id == b.profile_id && a.tenant == b.tenant && a.block_id == b.block_id;
  }
  template <typename H>
  friend H AbslHashValue(H h, const BlockKey& k) {
    return H::combine(std::move(h), k.tenant, k.profile_id, k.block_id);
  }
};

// Where the NVMe tier keeps a block's payload, as the catalog records it
// (the NVMe tier's own type is NvmeLocation in storage/nvme/nvme_tier.h).
struct NvmeExtent {
  uint32_t file_index = 0;
  uint64_t offset = 0;
  uint64_t length = 0;  // bytes of the extent; >= the block's size_bytes

  friend bool operator==(const NvmeExtent&, const NvmeExtent&) = default;
};

struct BlockRecord {
  uint64_t size_bytes = 0;  // payload bytes, 1..kMaxBlockBytes
  uint64_t checksum = 0;    // XXH3-64 of the payload
  std::optional<NvmeExtent> nvme;
  // The payload at nvme was synced before this record was written; only
  // durable records are trusted after a restart. Requires nvme.
  bool durable = false;
  // A checksum mismatch was seen; the block is never served.
  bool quarantined = false;
  // Its writer asked the cache to keep it: it is never evicted, only
  // deleted.
  bool retained = false;
  // Set by the caller; the catalog never reads a clock.
  int64_t created_micros = 0;
  int64_t last_access_micros = 0;
  // The index layer's v_b summary (opaque, <= kMaxSummaryBytes, may be empty).
  std::string summary;

  friend bool operator==(const BlockRecord&, const BlockRecord&) = default;
};

absl::Status ValidateBlockKey(const BlockKey& key);
absl::Status ValidateBlockRecord(const BlockRecord& record);

// ---- Model profiles -------------------------------------------------------

enum class KvDtype : uint8_t { kFp16 = 1, kBf16 = 2, kFp32 = 3 };

// How a block's bytes are ordered. kLayerKvHeadTokenDim: for each layer,
// K then V, each [kv_head][token][dim] of dtype, row-major:
//   [layers][2][kv_heads][block_size_tokens][head_dim]
enum class BlockLayout : uint8_t { kLayerKvHeadTokenDim = 1 };

// One model's KV shape. Every block of a profile has the same size,
// BlockSizeBytes(profile).
struct ModelProfile {
  uint64_t profile_id = 0;  // assigned by Catalog::RegisterProfile (random)
  std::string name;         // 1..kMaxProfileNameBytes
  std::string revision;     // 0..kMaxProfileRevisionBytes
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t block_size_tokens = 0;
  KvDtype dtype = KvDtype::kFp16;
  BlockLayout layout = BlockLayout::kLayerKvHeadTokenDim;
  // The selection calibration, opaque to storage (the daemon encodes it;
  // empty = uncalibrated), <= kMaxCalibrationBytes. Part of the definition.
  std::string calibration;
  // The tenant it belongs to, which registered it (counts against its
  // profiles quota); only that tenant uses it. Not part of the definition:
  // two tenants' identical definitions are two profiles.
  std::string owner;

  friend bool operator==(const ModelProfile&, const ModelProfile&) = default;
};

// What registering a profile did (Catalog and BlockStore RegisterProfile).
struct RegisteredProfile {
  ModelProfile profile;  // with its profile_id
  bool created = false;  // false: an identical definition existed
};

// 2 for fp16/bf16, 4 for fp32, 0 for an unknown value.
uint32_t DtypeBytes(KvDtype dtype);

// Checks every field against the limits above (profile_id is ignored) and
// that the block size is at most kMaxBlockBytes.
absl::Status ValidateProfile(const ModelProfile& profile);

// layers * 2 * kv_heads * block_size_tokens * head_dim * dtype bytes.
// Only meaningful for a profile that passes ValidateProfile.
uint64_t BlockSizeBytes(const ModelProfile& profile);

// Equal in everything but profile_id and owner.
bool SameDefinition(const ModelProfile& a, const ModelProfile& b);

// ---- Compaction versions --------------------------------------------------
// The compactor's durable record (daemon/compaction): per (tenant, profile,
// context_key) every version of a context, and per compacted block its
// slot data. The catalog stores them; their meaning is the compactor's.

inline constexpr size_t kMaxContextKeyBytes = 64;      // context_key, 1..64
inline constexpr size_t kMaxCompactedSlots = 1 << 20;  // entries per slot array

struct ContextVersionRecord {
  uint32_t version = 0;                // 0 = the original blocks, n = compacted
  std::string context_key;             // 1..kMaxContextKeyBytes
  std::vector<std::string> block_ids;  // 0..kMaxContextBlocks, in slot order
  uint32_t tokens = 0;
  float retention = 0;
  // The method, as the compactor's codes (opaque here).
  uint8_t importance = 0;
  uint8_t merge = 0;
  uint8_t bias = 0;
  uint64_t created_unix_ms = 0;
  bool dropped = false;  // its blocks were deleted; the record stays

  friend bool operator==(const ContextVersionRecord&, const ContextVersionRecord&) = default;
};

// The slots of one compacted block (key: its BlockKey).
struct CompactedSlotsRecord {
  uint32_t version = 0;
  std::vector<int32_t> positions;  // each 0..kMaxCompactedSlots entries
  std::vector<float> logit_bias;
  std::vector<uint32_t> merged;

  friend bool operator==(const CompactedSlotsRecord&, const CompactedSlotsRecord&) = default;
};

absl::Status ValidateContextVersionRecord(const ContextVersionRecord& record);
absl::Status ValidateCompactedSlotsRecord(const CompactedSlotsRecord& record);

}  // namespace kvtier

#endif  // KVTIER_STORAGE_CATALOG_RECORDS_H_
