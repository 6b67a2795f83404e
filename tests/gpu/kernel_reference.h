// CPU references of the device-tier kernels (gpu/cuda/kernel_shapes.h), in
// plain C++ with double accumulation, so GPU results can be compared within
// fp tolerance. Inputs are host memory with the same layouts as the
// kernels' device inputs.
//
// Thread safety: pure functions.
#ifndef KVTIER_TESTS_GPU_KERNEL_REFERENCE_H_
#define KVTIER_TESTS_GPU_KERNEL_REFERENCE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpu/cuda/kernel_shapes.h"

namespace kvtier::gpu::testing {

// Reads element i of a buffer of `type` elements as float.
float LoadElement(const void* data, ElementType type, int64_t i);

// Summary of one block, fp32, shapes as PoolKeysParams' outputs for one b.
struct PoolReference {
  std::vector<float> mean;           // [D]
  std::vector<float> weighted_mean;  // [D], empty without head weights
  std::vector<float> min, max;       // [D]
  std::vector<float> layer_mean;     // [L][D]
  std::vector<float> layer_min;      // [L][D]
  std::vector<float> layer_max;      // [L][D]
  bool nonfinite = false;
};

// `block` is shape.BlockBytes() bytes; head_weights is [L][H] or empty.
PoolReference PoolKeysReference(const KvBlockShape& shape, const void* block,
                                const std::vector<float>& head_weights);

// scores [num_anchors][num_rows] for levels [num_rows][row_stride] of
// levels_type and anchors [num_anchors][dim]. A row or anchor with a NaN or
// Inf element scores NaN.
std::vector<float> ScoreReference(const void* levels, ElementType levels_type, int64_t num_rows,
                                  int64_t row_stride, int32_t dim,
                                  const std::vector<float>& anchors, int32_t num_anchors,
                                  ScoreKind kind);

// Segmented scoring: host copies of each segment's fp16 rows; returns the
// stacked dot products [sum of num_rows] (double accumulation).
struct SegmentReference {
  const uint16_t* rows = nullptr;  // [num_rows][dim] fp16 bits, host
  int64_t num_rows = 0;
  int32_t anchor = 0;
};
std::vector<float> ScoreSegmentsReference(const std::vector<SegmentReference>& segments,
                                          const std::vector<float>& anchors, int32_t dim);

// Top k of each anchor's row of scores [num_anchors][num_rows]: values in
// descending order (NaN last), and the matching row numbers (ties by lower
// row number first).
struct TopKReference {
  std::vector<float> values;     // [num_anchors][k]
  std::vector<int32_t> indices;  // [num_anchors][k]
};
TopKReference TopKReferenceSelect(const std::vector<float>& scores, int64_t num_rows,
                                  int32_t num_anchors, int32_t k);

}  // namespace kvtier::gpu::testing

#endif  // KVTIER_TESTS_GPU_KERNEL_REFERENCE_H_
