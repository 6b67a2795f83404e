#include "daemon/convert.h"

#include <algorithm>
#include <climits>

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

index::Dtype ToIndexDtype(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kFp16:
      return index::Dtype::kFp16;
    case KvDtype::kBf16:
      return index::Dtype::kBf16;
    case KvDtype::kFp32:
      return index::Dtype::kFp32;
  }
  return index::Dtype::kFp16;
}

index::SelectionCalibration FromProto(const v1::SelectionCalibration& c) {
  index::SelectionCalibration out;
  out.num_q_heads = static_cast<int32_t>(std::min<uint32_t>(c.num_q_heads(), INT32_MAX));
  for (const v1::HeadRef& h : c.retrieval_heads()) {
    out.retrieval_heads.push_back(
        {static_cast<int32_t>(std::min<uint32_t>(h.layer(), INT32_MAX)),
         static_cast<int32_t>(std::min<uint32_t>(h.q_head(), INT32_MAX))});
  }
  out.prior.assign(c.prior().begin(), c.prior().end());
  out.prior_all.assign(c.prior_all().begin(), c.prior_all().end());
  out.head_weights.assign(c.head_weights().begin(), c.head_weights().end());
  out.softmax_scale = c.softmax_scale();
  out.head_min_mass = c.head_min_mass();
  // Out-of-range values stay out of range (ValidateCalibration names them).
  if (c.has_sink_blocks()) {
    out.sink_blocks = static_cast<int32_t>(std::min<uint32_t>(c.sink_blocks(), INT32_MAX));
  }
  if (c.has_local_blocks()) {
    out.local_blocks = static_cast<int32_t>(std::min<uint32_t>(c.local_blocks(), INT32_MAX));
  }
  if (c.has_retrieval_share()) out.retrieval_share = c.retrieval_share();
  if (c.has_sink_mass()) out.sink_mass = c.sink_mass();
  if (c.has_sink_mass_all()) out.sink_mass_all = c.sink_mass_all();
  auto clamp = [](uint32_t v) { return static_cast<int32_t>(std::min<uint32_t>(v, INT32_MAX)); };
  if (c.has_copy_run()) out.copy_run = clamp(c.copy_run());
  if (c.has_copy_hold()) out.copy_hold = clamp(c.copy_hold());
  if (c.has_copy_min_blocks()) out.copy_min_blocks = clamp(c.copy_min_blocks());
  if (c.has_copy_min_mass()) out.copy_min_mass = c.copy_min_mass();
  if (c.has_uncopied_weight()) out.uncopied_weight = c.uncopied_weight();
  if (c.has_copy_lead()) out.copy_lead = clamp(c.copy_lead());
  if (c.has_copy_weight()) out.copy_weight = c.copy_weight();
  return out;
}

}  // namespace

index::BlockLayout LayoutOf(const ModelProfile& profile) {
  index::BlockLayout layout;
  layout.num_layers = static_cast<int32_t>(profile.layers);
  layout.num_kv_heads = static_cast<int32_t>(profile.kv_heads);
  layout.head_dim = static_cast<int32_t>(profile.head_dim);
  layout.block_size_tokens = static_cast<int32_t>(profile.block_size_tokens);
  layout.dtype = ToIndexDtype(profile.dtype);
  return layout;
}

absl::StatusOr<index::SelectionCalibration> CalibrationOf(const ModelProfile& profile) {
  if (profile.calibration.empty()) return index::SelectionCalibration();
  v1::SelectionCalibration proto;
  if (!proto.ParseFromString(profile.calibration)) {
    return absl::DataLossError(
        absl::StrCat("profile ", profile.profile_id, ": stored calibration does not parse"));
  }
  index::SelectionCalibration c = FromProto(proto);
  if (absl::Status st = index::ValidateCalibration(c, LayoutOf(profile)); !st.ok()) {
    return absl::DataLossError(absl::StrCat("profile ", profile.profile_id,
                                            ": stored calibration is invalid: ", st.message()));
  }
  return c;
}

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
  if (proto.has_calibration()) {
    const index::SelectionCalibration c = FromProto(proto.calibration());
    if (absl::Status st = index::ValidateCalibration(c, LayoutOf(p)); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("profile.", st.message()));
    }
    if (c.calibrated()) p.calibration = proto.calibration().SerializeAsString();
    if (p.calibration.size() > kMaxCalibrationBytes) {
      return absl::InvalidArgumentError(absl::StrCat("profile.calibration: ", p.calibration.size(),
                                                     " bytes exceed the limit of ",
                                                     kMaxCalibrationBytes));
    }
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
  if (!p.calibration.empty()) {
    proto.mutable_calibration()->ParseFromString(p.calibration);  // validated when stored
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
    case TierId::kRemote:
      return v1::TIER_REMOTE;
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

v1::ContextVersion ToProto(const ContextVersionRecord& record) {
  v1::ContextVersion v;
  v.set_version(record.version);
  v.set_context_key(record.context_key);
  for (const std::string& id : record.block_ids) v.add_block_ids(id);
  v.set_tokens(record.tokens);
  v.set_retention(record.retention);
  v.set_importance(static_cast<v1::CompactImportance>(record.importance));
  v.set_merge(static_cast<v1::CompactMerge>(record.merge));
  v.set_bias(static_cast<v1::CompactBias>(record.bias));
  v.set_created_unix_ms(record.created_unix_ms);
  v.set_dropped(record.dropped);
  return v;
}

v1::CompactedSlots ToProto(const CompactedSlotsRecord& record) {
  v1::CompactedSlots s;
  s.set_version(record.version);
  s.mutable_positions()->Add(record.positions.begin(), record.positions.end());
  s.mutable_logit_bias()->Add(record.logit_bias.begin(), record.logit_bias.end());
  s.mutable_merged()->Add(record.merged.begin(), record.merged.end());
  return s;
}

}  // namespace kvtier::daemon
