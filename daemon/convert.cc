#include "daemon/convert.h"

#include "absl/strings/str_cat.h"

namespace kvtier::daemon {
namespace {

absl::Status Range(const char* field, uint64_t value, uint64_t lo, uint64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile.", field, ": ", value, " is outside ", lo, "..", hi));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelProfile> FromProto(const v1::ModelProfile& proto) {
  if (proto.name().empty() || proto.name().size() > kMaxProfileNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile.name: must be 1..", kMaxProfileNameBytes, " bytes"));
  }
  if (proto.revision().size() > kMaxProfileRevisionBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile.revision: at most ", kMaxProfileRevisionBytes, " bytes"));
  }
  if (auto st = Range("num_layers", proto.num_layers(), 1, kMaxLayers); !st.ok()) return st;
  if (auto st = Range("num_kv_heads", proto.num_kv_heads(), 1, kMaxKvHeads); !st.ok()) return st;
  if (auto st = Range("head_dim", proto.head_dim(), 1, kMaxHeadDim); !st.ok()) return st;
  if (auto st = Range("block_size_tokens", proto.block_size_tokens(), 1, kMaxBlockSizeTokens);
      !st.ok()) {
    return st;
  }
  ModelProfile p;
  p.name = proto.name();
  p.revision = proto.revision();
  p.layers = proto.num_layers();
  p.kv_heads = proto.num_kv_heads();
  p.head_dim = proto.head_dim();
  p.block_size_tokens = proto.block_size_tokens();
  switch (proto.dtype()) {
    case v1::DTYPE_FP16:
      p.dtype = KvDtype::kFp16;
      break;
    case v1::DTYPE_BF16:
      p.dtype = KvDtype::kBf16;
      break;
    case v1::DTYPE_FP32:
      p.dtype = KvDtype::kFp32;
      break;
    default:
      return absl::InvalidArgumentError("profile.dtype: must be FP16, BF16 or FP32");
  }
  if (BlockSizeBytes(p) > kMaxBlockBytes) {
    return absl::InvalidArgumentError(absl::StrCat("profile: blocks of ", BlockSizeBytes(p),
                                                   " bytes exceed the limit of ", kMaxBlockBytes));
  }
  return p;
}

v1::ModelProfile ToProto(const ModelProfile& p) {
  v1::ModelProfile proto;
  proto.set_name(p.name);
  proto.set_revision(p.revision);
  proto.set_num_layers(p.layers);
  proto.set_num_kv_heads(p.kv_heads);
  proto.set_head_dim(p.head_dim);
  proto.set_block_size_tokens(p.block_size_tokens);
  switch (p.dtype) {
    case KvDtype::kFp16:
      proto.set_dtype(v1::DTYPE_FP16);
      break;
    case KvDtype::kBf16:
      proto.set_dtype(v1::DTYPE_BF16);
      break;
    case KvDtype::kFp32:
      proto.set_dtype(v1::DTYPE_FP32);
      break;
  }
  return proto;
}

v1::Tier ToProto(TierId tier) {
  switch (tier) {
    case TierId::kDevice:
      return v1::TIER_DEVICE;
    case TierId::kHost:
      return v1::TIER_HOST;
    case TierId::kNvme:
      return v1::TIER_NVME;
  }
  return v1::TIER_UNSPECIFIED;
}

v1::BlockHandle ToProto(const DeviceHandle& h) {
  v1::BlockHandle proto;
  proto.set_arena_id(h.arena_id);
  proto.set_offset_bytes(h.offset_bytes);
  proto.set_size_bytes(h.size_bytes);
  proto.set_generation(h.generation);
  return proto;
}

}  // namespace kvtier::daemon
