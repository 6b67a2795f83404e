// Byte layout of everything the catalog stores in RocksDB.
//
// Integers in keys are big-endian so that RocksDB's bytewise order groups
// and sorts them; integers in values are little-endian. Every value starts
// with a version byte and ends with a 4-byte check (the low 32 bits of
// XXH3-64 over all bytes before it), so a damaged or foreign value decodes
// to DATA_LOSS, never to wrong facts.
//
// Column family "default" (meta):
//   "format_version"   -> u32 kCatalogFormatVersion
//
// Column family "blocks":
//   key   = u8 tenant_len | tenant | u64be profile_id | block_id (1..32)
//   value (version 1):
//      0  u8   version = 1
//      1  u8   flags: bit0 durable, bit1 quarantined, bit2 has_nvme,
//              bit3 retained; other bits must be 0
//      2  u64  size_bytes
//     10  u64  checksum (XXH3-64 of the payload)
//     18  i64  created_micros
//     26  i64  last_access_micros
//     34  if has_nvme: u32 file_index | u64 offset | u64 length   (20 bytes)
//         u32  summary_len (<= kMaxSummaryBytes) | summary bytes
//         u32  check
//   = 42 bytes (62 with an nvme location) + summary.
//
// Column family "profiles" (a profile belongs to one tenant, its owner;
// "" is a tenant too):
//   key 'p' | u64be profile_id | u8 tenant_len | tenant
//                                               -> profile value
//   key 'm' | u8 tenant_len | tenant | u8 name_len | name | u8 rev_len |
//       revision                                -> u64 profile_id (8 bytes)
//   profile value (version 1):
//      0  u8   version = 1
//      1  u64  profile_id
//      9  u32  layers | u32 kv_heads | u32 head_dim | u32 block_size_tokens
//     25  u8   dtype | u8 layout
//     27  u8   name_len | name | u8 rev_len | revision
//         optional fields, each u8 tag | u32 len (1..64 KiB) | bytes:
//           tag 1 calibration (opaque; calibrated profiles only)
//           tag 2 owner (the tenant in the key; absent for "")
//         (older records end at the revision)
//         u32  check
//
// Format 1 (read only by Catalog::MigrateFromFormat1 at open) had one
// namespace of profiles for all tenants, with the same value:
//   key 'i' | u64be profile_id                  -> profile value
//   key 'n' | u8 name_len | name | u8 rev_len | revision -> u64 profile_id
//   meta "next_profile_id" -> u64 (ids were 1, 2, 3, ...)
//
// Column family "contexts":
//   key   = u8 tenant_len | tenant | u64be profile_id | context_id (1..64)
//   value (version 1):
//      0  u8   version = 1
//      1  u32  segment_count
//         per segment: u32 block_count, per block: u8 id_len | id
//         u32  check
//
// Column family "versions" (the compactor's versions and slots):
//   key 'v' | u8 tenant_len | tenant | u64be profile_id | u8 key_len |
//       context_key | u32be version            -> context version value
//   key 's' | block key (as in "blocks")       -> compacted slots value
//   context version value (version 1):
//      0  u8   version = 1
//      1  u32  version (of the context) | u8 key_len | context_key
//         u32  tokens | f32 retention | u8 importance | u8 merge | u8 bias
//         u64  created_unix_ms | u8 flags: bit0 dropped
//         u32  block_count, per block: u8 id_len | id
//         u32  check
//   compacted slots value (version 1):
//      0  u8   version = 1
//      1  u32  version
//         u32  n | n x i32 positions
//         u32  n | n x f32 logit_bias
//         u32  n | n x u32 merged
//         u32  check
// Catalogs opened before this family existed get it, empty, at open; the
// daemon moves an older separate store into it (daemon/compaction).
//
// Encoders expect input that passed the Validate* functions of records.h.
// Decoders accept any bytes and return DATA_LOSS naming what is wrong.
// Thread-safe (no state).
#ifndef KVTIER_STORAGE_CATALOG_RECORD_FORMAT_H_
#define KVTIER_STORAGE_CATALOG_RECORD_FORMAT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/catalog/records.h"

namespace kvtier::catalog_format {

inline constexpr uint32_t kCatalogFormatVersion = 2;
inline constexpr uint8_t kRecordVersion = 1;

inline constexpr char kFormatVersionKey[] = "format_version";

// Blocks.
std::string EncodeBlockKey(const BlockKey& key);
absl::StatusOr<BlockKey> DecodeBlockKey(absl::string_view bytes);
// The common prefix of every block key of (tenant, profile_id).
std::string BlockKeyPrefix(absl::string_view tenant, uint64_t profile_id);
std::string EncodeBlockRecord(const BlockRecord& record);
absl::StatusOr<BlockRecord> DecodeBlockRecord(absl::string_view bytes);

// Profiles. Keys of a tenant longer than kMaxTenantBytes are not encoded
// (callers validate first).
inline constexpr uint8_t kProfileCalibrationTag = 1;
inline constexpr uint8_t kProfileOwnerTag = 2;
inline constexpr char kProfileKeyTag = 'p';
inline constexpr char kProfileNameKeyTag = 'm';
std::string EncodeProfileKey(absl::string_view tenant, uint64_t profile_id);
// The common prefix of every tenant's profile under profile_id.
std::string ProfileIdPrefix(uint64_t profile_id);
std::string EncodeProfileNameKey(absl::string_view tenant, absl::string_view name,
                                 absl::string_view revision);
std::string EncodeProfileRecord(const ModelProfile& profile);
absl::StatusOr<ModelProfile> DecodeProfileRecord(absl::string_view bytes);

// Format 1 (migration only).
inline constexpr char kLegacyNextProfileIdKey[] = "next_profile_id";
inline constexpr char kLegacyProfileIdKeyTag = 'i';
inline constexpr char kLegacyProfileNameKeyTag = 'n';

// Compaction versions.
inline constexpr char kContextVersionKeyTag = 'v';
inline constexpr char kCompactedSlotsKeyTag = 's';
struct ContextVersionKey {
  std::string tenant;
  uint64_t profile_id = 0;
  std::string context_key;
  uint32_t version = 0;
};
// Every version of (tenant, profile_id); of one context_key.
std::string ContextVersionPrefix(absl::string_view tenant, uint64_t profile_id);
std::string ContextVersionPrefix(absl::string_view tenant, uint64_t profile_id,
                                 absl::string_view context_key);
std::string EncodeContextVersionKey(const ContextVersionKey& key);
absl::StatusOr<ContextVersionKey> DecodeContextVersionKey(absl::string_view bytes);
std::string EncodeContextVersionRecord(const ContextVersionRecord& record);
absl::StatusOr<ContextVersionRecord> DecodeContextVersionRecord(absl::string_view bytes);
std::string EncodeCompactedSlotsKey(const BlockKey& key);
absl::StatusOr<BlockKey> DecodeCompactedSlotsKey(absl::string_view bytes);
std::string EncodeCompactedSlotsRecord(const CompactedSlotsRecord& record);
absl::StatusOr<CompactedSlotsRecord> DecodeCompactedSlotsRecord(absl::string_view bytes);

// Fixed-width little-endian values (meta entries, the profile name index).
std::string EncodeU32(uint32_t value);
std::string EncodeU64(uint64_t value);
absl::StatusOr<uint32_t> DecodeU32(absl::string_view bytes, absl::string_view what);
absl::StatusOr<uint64_t> DecodeU64(absl::string_view bytes, absl::string_view what);

// The smallest string greater than every string that starts with prefix,
// or "" when there is none (prefix is all 0xff). For iterate_upper_bound.
std::string PrefixSuccessor(absl::string_view prefix);

}  // namespace kvtier::catalog_format

#endif  // KVTIER_STORAGE_CATALOG_RECORD_FORMAT_H_
