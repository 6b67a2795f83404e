// CPU reference of the device-tier kernel (gpu/cuda/kernel_shapes.h), in
// plain C++ with double accumulation, so GPU results can be compared within
// fp tolerance. Inputs are host memory with the same layouts as the
// kernel's device inputs.
//
// Thread safety: pure functions.
#ifndef KVTIER_TESTS_GPU_KERNEL_REFERENCE_H_
#define KVTIER_TESTS_GPU_KERNEL_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "gpu/cuda/kernel_shapes.h"

namespace kvtier::gpu::testing {

// Segmented scoring: host copies of each segment's fp16 rows; returns the
// stacked dot products [sum of num_rows] (double accumulation).
struct SegmentReference {
  const uint16_t* rows = nullptr;  // [num_rows][dim] fp16 bits, host
  int64_t num_rows = 0;
  int32_t anchor = 0;
};
std::vector<float> ScoreSegmentsReference(const std::vector<SegmentReference>& segments,
                                          const std::vector<float>& anchors, int32_t dim);

}  // namespace kvtier::gpu::testing

#endif  // KVTIER_TESTS_GPU_KERNEL_REFERENCE_H_
