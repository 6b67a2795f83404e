// The byte layout of one KV block payload, as the index reads it.
//
// A block payload holds K and V for every layer and KV head of
// block_size_tokens tokens, little endian, in this order:
//
//   [layer][k|v][kv_head][token][dim]
//
// so the keys of layer l, head h are the block_size_tokens x head_dim
// elements starting at element ((l * 2 + 0) * num_kv_heads + h) *
// block_size_tokens * head_dim. Every block of a profile has the same size:
// num_layers * 2 * num_kv_heads * block_size_tokens * head_dim * dtype bytes.
//
// Thread safety: plain values; the functions are pure.
#ifndef KVTIER_INDEX_SUMMARY_BLOCK_LAYOUT_H_
#define KVTIER_INDEX_SUMMARY_BLOCK_LAYOUT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvtier::index {

enum class Dtype : uint8_t {
  kFp16 = 1,  // IEEE 754 binary16
  kBf16 = 2,  // bfloat16 (upper half of a binary32)
  kFp32 = 3,  // IEEE 754 binary32
};

// Bytes per element of `dtype`; 0 for an unknown value.
int DtypeSizeBytes(Dtype dtype);
// "fp16", "bf16", "fp32" or "unknown".
absl::string_view DtypeName(Dtype dtype);

// Limits every layout must respect (ValidateLayout enforces them).
inline constexpr int32_t kMaxLayers = 1024;
inline constexpr int32_t kMaxKvHeads = 1024;
inline constexpr int32_t kMaxHeadDim = 4096;
inline constexpr int32_t kMaxBlockSizeTokens = 65536;
inline constexpr int64_t kMaxPayloadBytes = int64_t{1} << 31;  // 2 GiB

struct BlockLayout {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size_tokens = 0;
  Dtype dtype = Dtype::kFp16;
};

// OK when every field is within its limit and the payload size fits
// kMaxPayloadBytes; otherwise InvalidArgument naming the field.
absl::Status ValidateLayout(const BlockLayout& layout);

// Payload size in bytes of one block. Requires ValidateLayout(layout).ok().
int64_t PayloadSizeBytes(const BlockLayout& layout);

// Number of key elements of one block (num_layers * num_kv_heads *
// block_size_tokens * head_dim).
int64_t KeyElementCount(const BlockLayout& layout);

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_SUMMARY_BLOCK_LAYOUT_H_
