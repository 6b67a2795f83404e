// The blocks of the crash loop: one small profile, ids that name their
// owning load thread, and payloads that are a pure function of the id, so
// that every read anywhere (bytes, device handles) can be checked without
// remembering what was written: for id, nothing but Payload(id) may ever
// come back.
//
// Thread safety: pure functions.
#ifndef KVTIER_TESTS_CRASH_CRASH_BLOCK_H_
#define KVTIER_TESTS_CRASH_CRASH_BLOCK_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvtier/v1/types.pb.h"

namespace kvtier::crash {

// 2 layers x (k|v) x 2 KV heads x 16 tokens x 32 dims x fp16 = 8 KiB.
inline constexpr uint32_t kLayers = 2, kKvHeads = 2, kTokens = 16, kHeadDim = 32;
inline constexpr uint64_t kBlockBytes = uint64_t{kLayers} * 2 * kKvHeads * kTokens * kHeadDim * 2;

// The profile every crash-loop block belongs to (uncalibrated: the default
// mass scorer selects a sliding window).
v1::ModelProfile CrashProfile();

// The id of the seq-th block of load thread `owner`: 1 byte owner, 8 bytes
// seq (big-endian), then 0..23 filler bytes derived from both, so ids are
// unique per (owner, seq) and 9..32 bytes long.
std::string BlockId(uint8_t owner, uint64_t seq);
// The owner byte of an id made by BlockId.
inline uint8_t OwnerOf(std::string_view id) { return static_cast<uint8_t>(id[0]); }

// Exactly kBlockBytes of finite fp16 values (|x| in [2^-6, 8)) seeded from
// the id; different ids give different bytes.
std::string Payload(std::string_view id);
// Payload(id) with one byte changed: what a put of "different bytes under
// an existing id" sends.
std::string WrongPayload(std::string_view id);

// Lowercase hex of the bytes, as kvtierctl prints block ids.
std::string Hex(std::string_view bytes);

}  // namespace kvtier::crash

#endif  // KVTIER_TESTS_CRASH_CRASH_BLOCK_H_
