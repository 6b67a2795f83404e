#include "storage/remote/remote_format.h"

#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "storage/common/checksum.h"

namespace kvtier::remote {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'T', 'R', 'E', 'M', '0', '1'};

void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t HashOf(std::string_view s) {
  return BlockChecksum(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
}

}  // namespace

uint64_t ProfileFingerprint(const ModelProfile& profile) {
  // Length-prefixed strings, then the numbers: no two definitions encode
  // alike.
  std::string canonical = absl::StrCat(profile.name.size(), ":", profile.name, ":",
                                       profile.revision.size(), ":", profile.revision);
  absl::StrAppend(&canonical, ":", profile.layers, ":", profile.kv_heads, ":", profile.head_dim,
                  ":", profile.block_size_tokens, ":", static_cast<int>(profile.dtype), ":",
                  static_cast<int>(profile.layout));
  return HashOf(canonical);
}

std::string RemoteKey(const BlockKey& key, uint64_t profile_fingerprint) {
  char fp[17];
  std::snprintf(fp, sizeof(fp), "%016llx", static_cast<unsigned long long>(profile_fingerprint));
  return absl::StrCat("kvt1:", key.tenant.size(), ":", key.tenant, ":", fp, ":",
                      absl::BytesToHexString(key.block_id));
}

std::array<uint8_t, kRemoteHeaderBytes> EncodeRemoteHeader(std::string_view remote_key,
                                                           uint64_t profile_fingerprint,
                                                           uint64_t payload_bytes,
                                                           uint64_t payload_checksum) {
  std::array<uint8_t, kRemoteHeaderBytes> h{};
  std::memcpy(h.data(), kMagic, sizeof(kMagic));
  PutU64(h.data() + 8, payload_bytes);
  PutU64(h.data() + 16, payload_checksum);
  PutU64(h.data() + 24, HashOf(remote_key));
  PutU64(h.data() + 32, profile_fingerprint);
  PutU64(h.data() + 40, BlockChecksum(absl::MakeConstSpan(h.data(), 40)));
  return h;
}

absl::StatusOr<RemoteValue> DecodeRemoteValue(std::string_view value, std::string_view remote_key,
                                              uint64_t profile_fingerprint,
                                              uint64_t expected_payload_bytes) {
  if (value.size() < kRemoteHeaderBytes) {
    return absl::DataLossError(absl::StrCat("remote value of ", value.size(),
                                            " bytes is shorter than its ", kRemoteHeaderBytes,
                                            "-byte header"));
  }
  const auto* h = reinterpret_cast<const uint8_t*>(value.data());
  if (std::memcmp(h, kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError("remote value has no KVTREM01 header");
  }
  if (GetU64(h + 40) != BlockChecksum(absl::MakeConstSpan(h, 40))) {
    return absl::DataLossError("remote value's header fails its checksum");
  }
  if (GetU64(h + 24) != HashOf(remote_key)) {
    return absl::DataLossError("remote value was written under another key");
  }
  if (GetU64(h + 32) != profile_fingerprint) {
    return absl::DataLossError("remote value belongs to another profile");
  }
  const uint64_t size = GetU64(h + 8);
  if (size != expected_payload_bytes || value.size() - kRemoteHeaderBytes != size) {
    return absl::DataLossError(absl::StrCat(
        "remote value holds ", value.size() - kRemoteHeaderBytes, " payload bytes (header says ",
        size, "); the profile's blocks are ", expected_payload_bytes, " bytes"));
  }
  RemoteValue out;
  out.payload = absl::MakeConstSpan(h + kRemoteHeaderBytes, size);
  out.payload_checksum = GetU64(h + 16);
  return out;
}

}  // namespace kvtier::remote
