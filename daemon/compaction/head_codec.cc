#include "daemon/compaction/head_codec.h"

#include <algorithm>
#include <cstring>

#include "index/kernels/simd.h"

namespace kvtier::daemon {
namespace {

uint16_t FloatToBf16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN stays NaN
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

// Element index of token 0, dim 0 of (layer, k|v, head) in one block.
int64_t RowBase(const index::BlockLayout& s, int32_t layer, int kv, int32_t head) {
  return ((int64_t{layer} * 2 + kv) * s.num_kv_heads + head) * int64_t{s.block_size_tokens} *
         s.head_dim;
}

void Decode(index::Dtype dtype, const char* src, float* dst, int64_t n) {
  switch (dtype) {
    case index::Dtype::kFp32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case index::Dtype::kFp16:
      index::simd::HalfToFloatN(src, dst, static_cast<size_t>(n));
      return;
    case index::Dtype::kBf16:
      index::simd::BfloatToFloatN(src, dst, static_cast<size_t>(n));
      return;
  }
}

void Encode(index::Dtype dtype, const float* src, char* dst, int64_t n) {
  switch (dtype) {
    case index::Dtype::kFp32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case index::Dtype::kFp16:
      // dst may be unaligned for uint16_t: convert through a small buffer.
      for (int64_t i = 0; i < n; i += 256) {
        uint16_t h[256];
        const int64_t m = std::min<int64_t>(256, n - i);
        index::simd::FloatToHalfN(src + i, h, static_cast<size_t>(m));
        std::memcpy(dst + 2 * i, h, static_cast<size_t>(m) * 2);
      }
      return;
    case index::Dtype::kBf16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t b = FloatToBf16(src[i]);
        std::memcpy(dst + 2 * i, &b, 2);
      }
      return;
  }
}

}  // namespace

void GatherHead(const index::BlockLayout& shape, absl::Span<const absl::string_view> payloads,
                KvHead which, float* keys, float* values) {
  const int32_t layer = which.layer, head = which.head;
  const int eb = index::DtypeSizeBytes(shape.dtype);
  const int64_t per_block = int64_t{shape.block_size_tokens} * shape.head_dim;
  for (size_t b = 0; b < payloads.size(); ++b) {
    const char* data = payloads[b].data();
    Decode(shape.dtype, data + RowBase(shape, layer, 0, head) * eb, keys + b * per_block,
           per_block);
    Decode(shape.dtype, data + RowBase(shape, layer, 1, head) * eb, values + b * per_block,
           per_block);
  }
}

void ScatterHead(const index::BlockLayout& shape, KvHead which, const HeadRows& in,
                 std::vector<std::string>* payloads) {
  const int32_t layer = which.layer, head = which.head;
  const float* keys = in.keys;
  const float* values = in.values;
  const int64_t rows = in.rows;
  const int eb = index::DtypeSizeBytes(shape.dtype);
  const int64_t d = shape.head_dim;
  for (int64_t first = 0, b = 0; first < rows; first += shape.block_size_tokens, ++b) {
    const int64_t n = std::min<int64_t>(shape.block_size_tokens, rows - first);
    char* data = (*payloads)[static_cast<size_t>(b)].data();
    Encode(shape.dtype, keys + first * d, data + RowBase(shape, layer, 0, head) * eb, n * d);
    Encode(shape.dtype, values + first * d, data + RowBase(shape, layer, 1, head) * eb, n * d);
  }
}

}  // namespace kvtier::daemon
