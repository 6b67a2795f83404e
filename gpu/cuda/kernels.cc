#include "gpu/cuda/kernels.h"

#include <string>

#include "gpu/cuda/cuda_status.h"

namespace kvtier::gpu {
namespace {

GpuStatus Invalid(const std::string& message) {
  return GpuStatus::Error(GpuStatus::kInvalidArgument, message);
}

GpuStatus CheckRange(const char* field, int64_t value, int64_t low, int64_t high) {
  if (value < low || value > high) {
    return Invalid(std::string(field) + " must be in " + std::to_string(low) + ".." +
                   std::to_string(high) + ", got " + std::to_string(value));
  }
  return GpuStatus::Ok();
}

bool IsKnownType(ElementType type) {
  return type == ElementType::kFp16 || type == ElementType::kBf16 || type == ElementType::kFp32;
}

}  // namespace

GpuStatus CheckPoolKeysParams(const PoolKeysParams& p) {
  const KvBlockShape& s = p.shape;
  GpuStatus status = CheckRange("shape.num_layers", s.num_layers, 1, kMaxKernelLayers);
  if (status.ok()) status = CheckRange("shape.num_kv_heads", s.num_kv_heads, 1, kMaxKernelKvHeads);
  if (status.ok()) {
    status = CheckRange("shape.block_tokens", s.block_tokens, 1, kMaxKernelBlockTokens);
  }
  if (status.ok()) status = CheckRange("shape.head_dim", s.head_dim, 1, kMaxKernelHeadDim);
  if (status.ok()) status = CheckRange("num_blocks", p.num_blocks, 1, kMaxPoolBlocks);
  if (!status.ok()) return status;
  if (!IsKnownType(s.dtype)) return Invalid("shape.dtype is not fp16, bf16 or fp32");
  if (s.BlockBytes() > kMaxKernelBlockBytes) {
    return Invalid("shape gives " + std::to_string(s.BlockBytes()) +
                   " bytes per block, above kMaxKernelBlockBytes");
  }
  // rows of one layer (H x T) are indexed with int.
  if (int64_t{s.num_kv_heads} * s.block_tokens > (int64_t{1} << 30)) {
    return Invalid("shape.num_kv_heads * shape.block_tokens above 2^30");
  }
  if (p.arena == nullptr) return Invalid("arena is null");
  if (p.block_offsets == nullptr) return Invalid("block_offsets is null");
  if (p.mean == nullptr) return Invalid("mean is null (it is required)");
  if (p.flags == nullptr) return Invalid("flags is null (it is required)");
  if (p.weighted_mean != nullptr && p.head_weights == nullptr) {
    return Invalid("weighted_mean needs head_weights");
  }
  return GpuStatus::Ok();
}

GpuStatus CheckScoreParams(const ScoreParams& p) {
  GpuStatus status = CheckRange("num_rows", p.num_rows, 1, kMaxScoreRows);
  if (status.ok()) status = CheckRange("dim", p.dim, 1, kMaxScoreDim);
  if (status.ok()) status = CheckRange("num_anchors", p.num_anchors, 1, kMaxAnchors);
  if (status.ok()) status = CheckRange("row_stride", p.row_stride, p.dim, int64_t{1} << 32);
  if (!status.ok()) return status;
  if (p.levels_type != ElementType::kFp32 && p.levels_type != ElementType::kFp16) {
    return Invalid("levels_type must be fp32 or fp16");
  }
  if (p.kind != ScoreKind::kDot && p.kind != ScoreKind::kCosineUnit) {
    return Invalid("kind is not a ScoreKind");
  }
  if (p.levels == nullptr) return Invalid("levels is null");
  if (p.anchors == nullptr) return Invalid("anchors is null");
  if (p.scores == nullptr) return Invalid("scores is null");
  return GpuStatus::Ok();
}

GpuStatus CheckTopKParams(const TopKParams& p) {
  GpuStatus status = CheckRange("num_rows", p.num_rows, 1, kMaxScoreRows);
  if (status.ok()) status = CheckRange("num_anchors", p.num_anchors, 1, kMaxAnchors);
  if (status.ok()) status = CheckRange("k", p.k, 1, p.num_rows);
  if (!status.ok()) return status;
  if (p.scores == nullptr) return Invalid("scores is null");
  if (p.indices == nullptr) return Invalid("indices is null");
  return GpuStatus::Ok();
}

GpuStatus CheckSegmentScoreParams(const SegmentScoreParams& p) {
  GpuStatus status = CheckRange("num_segments", p.num_segments, 1, kMaxSegments);
  if (status.ok()) status = CheckRange("total_rows", p.total_rows, 1, kMaxScoreRows);
  if (status.ok()) status = CheckRange("num_anchors", p.num_anchors, 1, kMaxSegmentAnchors);
  if (status.ok()) status = CheckRange("dim", p.dim, 1, kMaxScoreDim);
  if (!status.ok()) return status;
  if (p.segments == nullptr) return Invalid("segments is null");
  if (p.anchors == nullptr) return Invalid("anchors is null");
  if (p.scores == nullptr) return Invalid("scores is null");
  return GpuStatus::Ok();
}

GpuStatus PoolKeys(const PoolKeysParams& params, cudaStream_t stream) {
  GpuStatus status = CheckPoolKeysParams(params);
  if (!status.ok()) return status;
  return CudaErrorToGpuStatus(LaunchPoolKeys(params, stream), "PoolKeys launch");
}

GpuStatus ScoreLevels(const ScoreParams& params, cudaStream_t stream) {
  GpuStatus status = CheckScoreParams(params);
  if (!status.ok()) return status;
  return CudaErrorToGpuStatus(LaunchScoreLevels(params, stream), "ScoreLevels launch");
}

GpuStatus TopK(const TopKParams& params, cudaStream_t stream) {
  GpuStatus status = CheckTopKParams(params);
  if (!status.ok()) return status;
  return CudaErrorToGpuStatus(LaunchTopK(params, stream), "TopK launch");
}

GpuStatus ScoreSegments(const SegmentScoreParams& params, cudaStream_t stream) {
  GpuStatus status = CheckSegmentScoreParams(params);
  if (!status.ok()) return status;
  return CudaErrorToGpuStatus(LaunchScoreSegments(params, stream), "ScoreSegments launch");
}

}  // namespace kvtier::gpu
