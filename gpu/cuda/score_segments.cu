// Segmented scoring: the Selector's levels of many contexts in one launch.
// One warp per row (grid-stride over the stacked rows of all segments);
// the row's segment is found by binary search over the out_offset prefix
// (cached while consecutive rows stay in one segment) and the anchor is
// read through L1. fp16 rows, fp32 anchors and accumulation.
#include <cuda_fp16.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "gpu/cuda/kernel_launch.h"
#include "gpu/cuda/launch.cuh"

namespace kvtier::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxCtas = 4096;

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// One warp per row of the stacked segments. See the file comment.
__global__ void __launch_bounds__(kThreads) ScoreSegmentsKernel(SegmentScoreParams p) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  const int dim = p.dim;
  int segment = 0;
  int64_t seg_begin = 0, seg_end = 0;  // [seg_begin, seg_end) rows of `segment`
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * warps + warp; r < p.total_rows;
       r += static_cast<int64_t>(gridDim.x) * warps) {
    if (r < seg_begin || r >= seg_end) {
      int lo = 0, hi = p.num_segments - 1;  // last segment with out_offset <= r
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (p.segments[mid].out_offset <= r) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      segment = lo;
      seg_begin = p.segments[lo].out_offset;
      seg_end = seg_begin + p.segments[lo].num_rows;
    }
    const RowSegment& seg = p.segments[segment];
    const __half* row = reinterpret_cast<const __half*>(seg.rows) + (r - seg_begin) * dim;
    const float* anchor = p.anchors + static_cast<int64_t>(seg.anchor) * dim;
    float acc = 0.0f;
    if ((dim & 1) == 0 && (reinterpret_cast<uintptr_t>(row) & 3) == 0) {
      const __half2* row2 = reinterpret_cast<const __half2*>(row);
      for (int d = lane; d < dim / 2; d += 32) {
        const float2 x = __half22float2(row2[d]);
        acc += x.x * __ldg(anchor + 2 * d) + x.y * __ldg(anchor + 2 * d + 1);
      }
    } else {
      for (int d = lane; d < dim; d += 32) acc += __half2float(row[d]) * __ldg(anchor + d);
    }
    acc = WarpSum(acc);
    if (lane == 0) p.scores[r] = acc;
  }
}

// CTAs for num_rows rows: enough for one full wave on the current device
// (as many CTAs as its SMs hold at once) and no more, so each warp walks
// several rows. The wave size is queried once per device; kMaxCtas if the
// queries fail.
int64_t WaveCtas(int64_t num_rows) {
  struct Wave {
    int device;
    int64_t ctas;
  };
  static std::mutex mu;
  static std::vector<Wave> waves;
  const int64_t warps = kThreads / 32;
  const int64_t ctas = (num_rows + warps - 1) / warps;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return std::max<int64_t>(1, std::min<int64_t>(ctas, kMaxCtas));
  }
  std::lock_guard<std::mutex> lock(mu);
  for (const Wave& w : waves) {
    if (w.device == device) return std::max<int64_t>(1, std::min(ctas, w.ctas));
  }
  int sms = 0, per_sm = 0;
  int64_t cap = kMaxCtas;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, ScoreSegmentsKernel, kThreads, 0) ==
          cudaSuccess &&
      sms > 0 && per_sm > 0) {
    cap = std::min<int64_t>(cap, int64_t{sms} * per_sm);
  }
  cudaGetLastError();  // a failed query is not the launch's error
  if (waves.size() < 64) waves.push_back(Wave{device, cap});
  return std::max<int64_t>(1, std::min(ctas, cap));
}

}  // namespace

cudaError_t LaunchScoreSegments(const SegmentScoreParams& params, cudaStream_t stream) {
  const int64_t ctas = WaveCtas(params.total_rows);
  return LaunchKernel(ScoreSegmentsKernel, dim3(static_cast<unsigned>(ctas)), dim3(kThreads), 0,
                      stream, params);
}

}  // namespace kvtier::gpu
