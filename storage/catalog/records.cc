#include "storage/catalog/records.h"

#include "absl/strings/str_cat.h"
#include "storage/common/status_macros.h"

namespace kvtier {
namespace {

absl::Status CheckTenant(const std::string& tenant) {
  if (tenant.size() > kMaxTenantBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenant has ", tenant.size(), " bytes; at most ", kMaxTenantBytes));
  }
  return absl::OkStatus();
}

absl::Status CheckBlockId(const std::string& block_id, absl::string_view field) {
  if (block_id.empty() || block_id.size() > kMaxBlockIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must have 1..", kMaxBlockIdBytes, " bytes, has ", block_id.size()));
  }
  return absl::OkStatus();
}

absl::Status CheckRange(absl::string_view field, uint64_t value, uint64_t max) {
  if (value == 0 || value > max) {
    return absl::InvalidArgumentError(absl::StrCat(field, " must be in 1..", max, ", got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateBlockKey(const BlockKey& key) {
  KVTIER_RETURN_IF_ERROR(CheckTenant(key.tenant));
  if (key.profile_id == 0) return absl::InvalidArgumentError("profile_id must not be 0");
  return CheckBlockId(key.block_id, "block_id");
}

absl::Status ValidateBlockRecord(const BlockRecord& record) {
  KVTIER_RETURN_IF_ERROR(CheckRange("size_bytes", record.size_bytes, kMaxBlockBytes));
  if (record.summary.size() > kMaxSummaryBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("summary has ", record.summary.size(), " bytes; at most ", kMaxSummaryBytes));
  }
  if (record.durable && !record.nvme.has_value()) {
    return absl::InvalidArgumentError("durable block record without an nvme location");
  }
  if (record.nvme.has_value() && record.nvme->length < record.size_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("nvme length ", record.nvme->length,
                                                   " is below size_bytes ", record.size_bytes));
  }
  if (record.nvme.has_value() && record.nvme->offset + record.nvme->length < record.nvme->offset) {
    return absl::InvalidArgumentError("nvme offset + length overflows");
  }
  return absl::OkStatus();
}

uint32_t DtypeBytes(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kFp16:
    case KvDtype::kBf16:
      return 2;
    case KvDtype::kFp32:
      return 4;
  }
  return 0;
}

absl::Status ValidateProfile(const ModelProfile& profile) {
  if (profile.name.empty() || profile.name.size() > kMaxProfileNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile name must have 1..", kMaxProfileNameBytes, " bytes, has ", profile.name.size()));
  }
  if (profile.revision.size() > kMaxProfileRevisionBytes) {
    return absl::InvalidArgumentError(absl::StrCat("profile revision has ", profile.revision.size(),
                                                   " bytes; at most ", kMaxProfileRevisionBytes));
  }
  KVTIER_RETURN_IF_ERROR(CheckRange("layers", profile.layers, kMaxLayers));
  KVTIER_RETURN_IF_ERROR(CheckRange("kv_heads", profile.kv_heads, kMaxKvHeads));
  KVTIER_RETURN_IF_ERROR(CheckRange("head_dim", profile.head_dim, kMaxHeadDim));
  KVTIER_RETURN_IF_ERROR(
      CheckRange("block_size_tokens", profile.block_size_tokens, kMaxBlockSizeTokens));
  if (DtypeBytes(profile.dtype) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", static_cast<int>(profile.dtype), " is not fp16/bf16/fp32"));
  }
  if (profile.owner.size() > kMaxTenantBytes) {
    return absl::InvalidArgumentError(absl::StrCat("profile owner has ", profile.owner.size(),
                                                   " bytes; at most ", kMaxTenantBytes));
  }
  if (profile.calibration.size() > kMaxCalibrationBytes) {
    return absl::InvalidArgumentError(absl::StrCat("profile calibration has ",
                                                   profile.calibration.size(), " bytes; at most ",
                                                   kMaxCalibrationBytes));
  }
  if (profile.layout != BlockLayout::kLayerKvHeadTokenDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout ", static_cast<int>(profile.layout), " is unknown"));
  }
  // With the limits above the product is below 2^48: no overflow.
  const uint64_t block_bytes = BlockSizeBytes(profile);
  if (block_bytes > kMaxBlockBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("block size ", block_bytes, " bytes exceeds ", kMaxBlockBytes));
  }
  return absl::OkStatus();
}

uint64_t BlockSizeBytes(const ModelProfile& profile) {
  return uint64_t{profile.layers} * 2 * profile.kv_heads * profile.block_size_tokens *
         profile.head_dim * DtypeBytes(profile.dtype);
}

bool SameDefinition(const ModelProfile& a, const ModelProfile& b) {
  ModelProfile a_copy = a;
  a_copy.profile_id = b.profile_id;
  a_copy.owner = b.owner;
  return a_copy == b;
}

absl::Status ValidateContextVersionRecord(const ContextVersionRecord& record) {
  if (record.context_key.empty() || record.context_key.size() > kMaxContextKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("context version context_key must be 1..",
                                                   kMaxContextKeyBytes, " bytes, got ",
                                                   record.context_key.size()));
  }
  if (record.block_ids.size() > kMaxContextBlocks) {
    return absl::InvalidArgumentError(absl::StrCat("context version has ", record.block_ids.size(),
                                                   " block_ids; at most ", kMaxContextBlocks));
  }
  for (const std::string& id : record.block_ids) {
    KVTIER_RETURN_IF_ERROR(CheckBlockId(id, "context version block_id"));
  }
  return absl::OkStatus();
}

absl::Status ValidateCompactedSlotsRecord(const CompactedSlotsRecord& record) {
  for (const auto& [name, size] :
       {std::pair<const char*, size_t>{"positions", record.positions.size()},
        {"logit_bias", record.logit_bias.size()},
        {"merged", record.merged.size()}}) {
    if (size > kMaxCompactedSlots) {
      return absl::InvalidArgumentError(absl::StrCat("compacted slots ", name, " has ", size,
                                                     " entries; at most ", kMaxCompactedSlots));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvtier
