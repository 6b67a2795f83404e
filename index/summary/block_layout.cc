#include "index/summary/block_layout.h"

#include "absl/strings/str_cat.h"
#include "index/validate.h"

namespace kvtier::index {
int DtypeSizeBytes(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFp16:
    case Dtype::kBf16:
      return 2;
    case Dtype::kFp32:
      return 4;
  }
  return 0;
}

absl::string_view DtypeName(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFp16:
      return "fp16";
    case Dtype::kBf16:
      return "bf16";
    case Dtype::kFp32:
      return "fp32";
  }
  return "unknown";
}

absl::Status ValidateLayout(const BlockLayout& layout) {
  absl::Status s = CheckCount("layout", "num_layers", layout.num_layers, kMaxLayers);
  if (s.ok()) s = CheckCount("layout", "num_kv_heads", layout.num_kv_heads, kMaxKvHeads);
  if (s.ok()) s = CheckCount("layout", "head_dim", layout.head_dim, kMaxHeadDim);
  if (s.ok()) {
    s = CheckCount("layout", "block_size_tokens", layout.block_size_tokens, kMaxBlockSizeTokens);
  }
  if (!s.ok()) return s;
  if (DtypeSizeBytes(layout.dtype) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("layout.dtype (", static_cast<int>(layout.dtype),
                                                   ") is not fp16, bf16 or fp32"));
  }
  // Each factor is bounded, so the product fits in 64 bits.
  if (PayloadSizeBytes(layout) > kMaxPayloadBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout payload size (", PayloadSizeBytes(layout), " bytes) exceeds ", kMaxPayloadBytes));
  }
  return absl::OkStatus();
}

int64_t KeyElementCount(const BlockLayout& layout) {
  return int64_t{layout.num_layers} * layout.num_kv_heads * layout.block_size_tokens *
         layout.head_dim;
}

int64_t PayloadSizeBytes(const BlockLayout& layout) {
  return 2 * KeyElementCount(layout) * DtypeSizeBytes(layout.dtype);
}

}  // namespace kvtier::index
