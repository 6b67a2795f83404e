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

}  // namespace

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

GpuStatus ScoreSegments(const SegmentScoreParams& params, cudaStream_t stream) {
  GpuStatus status = CheckSegmentScoreParams(params);
  if (!status.ok()) return status;
  return CudaErrorToGpuStatus(LaunchScoreSegments(params, stream), "ScoreSegments launch");
}

}  // namespace kvtier::gpu
