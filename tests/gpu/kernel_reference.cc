#include "tests/gpu/kernel_reference.h"

#include "tests/gpu/half.h"

namespace kvtier::gpu::testing {

std::vector<float> ScoreSegmentsReference(const std::vector<SegmentReference>& segments,
                                          const std::vector<float>& anchors, int32_t dim) {
  std::vector<float> scores;
  for (const SegmentReference& seg : segments) {
    for (int64_t r = 0; r < seg.num_rows; ++r) {
      double dot = 0.0;
      for (int d = 0; d < dim; ++d) {
        dot += double{HalfToFloat(seg.rows[r * dim + d])} * anchors[seg.anchor * dim + d];
      }
      scores.push_back(static_cast<float>(dot));
    }
  }
  return scores;
}

}  // namespace kvtier::gpu::testing
