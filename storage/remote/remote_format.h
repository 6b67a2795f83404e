// The remote tier's keys and values: how a block is named and framed in a
// shared store (Redis Cluster) so that several daemons find the same block
// by content hash and every reader can prove the bytes are the ones that
// were put.
//
// Key (binary safe; Redis keys may hold any byte):
//   "kvt1:" <tenant length, decimal> ":" <tenant> ":" <profile fingerprint,
//   16 hex digits> ":" <block id, lower-case hex>
// The tenant keeps tenants apart exactly as locally; the profile is named by
// its fingerprint, not by the daemon-local profile id, so two daemons that
// registered the same model shape agree on the key.
//
// Value: a 48-byte header, then the payload.
//   offset size  field
//        0    8  magic "KVTREM01"
//        8    8  payload size, bytes (little endian)
//       16    8  XXH3-64 of the payload
//       24    8  XXH3-64 of the key the value was written under
//       32    8  profile fingerprint
//       40    8  XXH3-64 of bytes [0, 40)
// A value read back is accepted only when the header's own checksum holds,
// it was written under the key that was asked for, its size is the
// profile's block size and the payload's XXH3-64 matches.
//
// Thread safety: stateless functions.
#ifndef KVTIER_STORAGE_REMOTE_REMOTE_FORMAT_H_
#define KVTIER_STORAGE_REMOTE_REMOTE_FORMAT_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "storage/catalog/records.h"

namespace kvtier::remote {

inline constexpr size_t kRemoteHeaderBytes = 48;

// XXH3-64 of the fields that decide a block's bytes: name, revision,
// layers, kv_heads, head_dim, block_size_tokens, dtype and layout. Not the
// profile id (daemon-local), the calibration (selection only) or the owner.
uint64_t ProfileFingerprint(const ModelProfile& profile);

// The key of a block whose profile has fingerprint `profile_fingerprint`.
std::string RemoteKey(const BlockKey& key, uint64_t profile_fingerprint);

// The header of a value holding `payload_checksum` (XXH3-64 of a payload of
// payload_bytes) under `remote_key`.
std::array<uint8_t, kRemoteHeaderBytes> EncodeRemoteHeader(std::string_view remote_key,
                                                           uint64_t profile_fingerprint,
                                                           uint64_t payload_bytes,
                                                           uint64_t payload_checksum);

// A value's payload and the checksum its header promises, after the header
// checks (magic, header checksum, key, fingerprint, size). The payload is a
// view into `value`; its checksum is NOT checked here (the store checks it
// while copying it in). DATA_LOSS naming the check that failed.
struct RemoteValue {
  absl::Span<const uint8_t> payload;
  uint64_t payload_checksum = 0;
};
absl::StatusOr<RemoteValue> DecodeRemoteValue(std::string_view value, std::string_view remote_key,
                                              uint64_t profile_fingerprint,
                                              uint64_t expected_payload_bytes);

}  // namespace kvtier::remote

#endif  // KVTIER_STORAGE_REMOTE_REMOTE_FORMAT_H_
