// Shapes and parameters of the device-tier kernel (gpu/cuda/kernels.h), as
// plain structs passed by value to the kernel. Plain C++: the CPU reference
// (tests/gpu/kernel_reference.h) uses the same structs, and this header
// compiles without CUDA.
//
// Every pointer in a *Params struct is device memory unless noted; shapes
// are written next to each pointer, row-major, outermost first.
#ifndef KVTIER_GPU_CUDA_KERNEL_SHAPES_H_
#define KVTIER_GPU_CUDA_KERNEL_SHAPES_H_

#include <cstddef>
#include <cstdint>

namespace kvtier::gpu {

// ---- Limits (CheckSegmentScoreParams enforces them before any launch) ----
inline constexpr int64_t kMaxScoreRows = int64_t{1} << 26;
inline constexpr int32_t kMaxScoreDim = 1024;

// ---- Segmented scoring: many tables, one anchor per segment --------------
//
// The Selector's levels of many contexts scored in one launch. Segment s
// names num_rows fp16 rows of dim elements (contiguous, row stride = dim)
// and the anchor they are scored against:
//   scores[segments[s].out_offset + i] = anchors[segments[s].anchor] . row_i
// accumulated in fp32 (raw dot products: the index maps them to
// affinities). Segments are stacked in order: segments[0].out_offset == 0
// and out_offset[s + 1] = out_offset[s] + num_rows[s], total_rows in all.
// The launcher cannot read the device-side segment table: callers build it
// consistently (index/select/gpu_scoring.cc does).
struct RowSegment {
  const uint16_t* rows = nullptr;  // device, fp16 bits [num_rows][dim]
  int64_t num_rows = 0;            // >= 1
  int64_t out_offset = 0;
  int32_t anchor = 0;  // 0..num_anchors-1
  int32_t reserved = 0;
};

struct SegmentScoreParams {
  const RowSegment* segments = nullptr;  // device [num_segments]
  int32_t num_segments = 0;              // 1..kMaxSegments
  int64_t total_rows = 0;                // 1..kMaxScoreRows
  const float* anchors = nullptr;        // device [num_anchors][dim] fp32
  int32_t num_anchors = 0;               // 1..kMaxSegmentAnchors
  int32_t dim = 0;                       // 1..kMaxScoreDim
  float* scores = nullptr;               // device [total_rows]
};

inline constexpr int32_t kMaxSegments = 1 << 20;
inline constexpr int32_t kMaxSegmentAnchors = 1 << 20;

}  // namespace kvtier::gpu

#endif  // KVTIER_GPU_CUDA_KERNEL_SHAPES_H_
