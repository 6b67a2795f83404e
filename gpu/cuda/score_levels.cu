// Scoring of stacked level vectors (pages, chunks, grids of every context,
// one row each) against a batch of anchors: scores = f(anchors x levels^T).
//
// Two kernels, by batch size:
//   B <= kSmallBatch  ScoreRowsSmallKernel: one warp per row (grid-stride);
//                     lanes stride over D, the B anchors live in shared
//                     memory, partial dots and the row norm are reduced with
//                     warp shuffles. Memory bound: each row is read once.
//   B >  kSmallBatch  ScoreRowsTiledKernel: CTA tile of 64 rows x 32 anchors
//                     staged through shared memory in D chunks of 32; each
//                     of 128 threads accumulates a 4 x 4 block of dots.
// Output scores are [B][N] (anchor-major) so top-K reads rows contiguously.
// A row or anchor with a NaN or Inf element scores NaN (kernel_shapes.h).
//
// ScoreSegmentsKernel: the Selector's levels of many contexts in one launch;
// one warp per row (grid-stride over the stacked rows of all segments), the
// row's segment found by binary search over the out_offset prefix (cached
// while consecutive rows stay in one segment), the anchor read through L1.
#include <cuda_fp16.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "gpu/cuda/kernel_launch.h"
#include "gpu/cuda/launch.cuh"

namespace kvtier::gpu {
namespace {

constexpr int kSmallBatch = 8;
constexpr int kSmallThreads = 256;
constexpr int kSmallMaxCtas = 4096;
constexpr int kTileRows = 64;
constexpr int kTileAnchors = 32;
constexpr int kTileChunk = 32;
constexpr int kTileThreads = 128;  // 16 row groups x 8 anchor groups

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float FinishScore(ScoreKind kind, float dot, float anchor_norm,
                                             float row_norm, bool nonfinite) {
  if (nonfinite) return __int_as_float(0x7fc00000);  // NaN, as the CPU reference
  if (kind == ScoreKind::kDot) return dot;
  const float denom = anchor_norm * row_norm;
  float cos = denom > 0.0f ? dot / denom : 0.0f;
  cos = fminf(1.0f, fmaxf(-1.0f, cos));
  return 0.5f * (1.0f + cos);
}

// kMaxAnchors: 1 (B = 1, no per-anchor loop) or kSmallBatch.
template <typename T, int kMaxAnchors>
__global__ void __launch_bounds__(kSmallThreads) ScoreRowsSmallKernel(ScoreParams p) {
  extern __shared__ float anchors_s[];  // [B][D]
  __shared__ float anchor_norm_s[kSmallBatch];
  __shared__ bool anchor_bad_s[kSmallBatch];
  const int dim = p.dim;
  const int num_anchors = p.num_anchors;
  for (int i = threadIdx.x; i < num_anchors * dim; i += blockDim.x) anchors_s[i] = p.anchors[i];
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  if (warp < num_anchors) {
    float n = 0.0f;
    bool bad = false;
    for (int d = lane; d < dim; d += 32) {
      const float x = anchors_s[warp * dim + d];
      bad |= !isfinite(x);
      n += x * x;
    }
    n = WarpSum(n);
    bad = __any_sync(0xffffffffu, bad);
    if (lane == 0) {
      anchor_norm_s[warp] = sqrtf(n);
      anchor_bad_s[warp] = bad;
    }
  }
  __syncthreads();

  const T* levels = static_cast<const T*>(p.levels);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * warps + warp; r < p.num_rows;
       r += static_cast<int64_t>(gridDim.x) * warps) {
    const T* row = levels + r * p.row_stride;
    float acc[kMaxAnchors] = {};
    float norm = 0.0f;
    bool bad = false;
#pragma unroll 4
    for (int d = lane; d < dim; d += 32) {
      const float x = ToFloat(row[d]);
      bad |= !isfinite(x);
      norm += x * x;
#pragma unroll
      for (int a = 0; a < kMaxAnchors; ++a) {
        if (a < num_anchors) acc[a] += x * anchors_s[a * dim + d];
      }
    }
    norm = sqrtf(WarpSum(norm));
    bad = __any_sync(0xffffffffu, bad);
#pragma unroll
    for (int a = 0; a < kMaxAnchors; ++a) {
      if (a < num_anchors) {
        const float dot = WarpSum(acc[a]);
        if (lane == 0) {
          p.scores[static_cast<int64_t>(a) * p.num_rows + r] =
              FinishScore(p.kind, dot, anchor_norm_s[a], norm, bad || anchor_bad_s[a]);
        }
      }
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kTileThreads) ScoreRowsTiledKernel(ScoreParams p) {
  // +1 column of padding keeps the per-thread column reads on distinct banks.
  __shared__ float rows_s[kTileRows][kTileChunk + 1];
  __shared__ float anchors_s[kTileAnchors][kTileChunk + 1];
  __shared__ float row_norm_s[kTileRows];
  __shared__ float anchor_norm_s[kTileAnchors];
  __shared__ int row_bad_s[kTileRows];
  __shared__ int anchor_bad_s[kTileAnchors];
  const int tid = threadIdx.x;
  if (tid < kTileRows) row_bad_s[tid] = 0;
  if (tid < kTileAnchors) anchor_bad_s[tid] = 0;
  __syncthreads();
  const int tx = tid % 8;  // anchors tx, tx + 8, tx + 16, tx + 24
  const int ty = tid / 8;  // rows ty, ty + 16, ty + 32, ty + 48
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kTileRows;
  const int anchor0 = blockIdx.y * kTileAnchors;
  const T* levels = static_cast<const T*>(p.levels);

  float acc[4][4] = {};
  float row_sq[4] = {};
  float anchor_sq[4] = {};
  for (int c0 = 0; c0 < p.dim; c0 += kTileChunk) {
    for (int idx = tid; idx < kTileRows * kTileChunk; idx += kTileThreads) {
      const int r = idx / kTileChunk, c = idx % kTileChunk;
      const int64_t row = row0 + r;
      const float x = (row < p.num_rows && c0 + c < p.dim)
                          ? ToFloat(levels[row * p.row_stride + c0 + c])
                          : 0.0f;
      if (!isfinite(x)) row_bad_s[r] = 1;  // every writer stores 1
      rows_s[r][c] = x;
    }
    for (int idx = tid; idx < kTileAnchors * kTileChunk; idx += kTileThreads) {
      const int a = idx / kTileChunk, c = idx % kTileChunk;
      const float x = (anchor0 + a < p.num_anchors && c0 + c < p.dim)
                          ? p.anchors[static_cast<int64_t>(anchor0 + a) * p.dim + c0 + c]
                          : 0.0f;
      if (!isfinite(x)) anchor_bad_s[a] = 1;
      anchors_s[a][c] = x;
    }
    __syncthreads();
#pragma unroll 8
    for (int c = 0; c < kTileChunk; ++c) {
      float rv[4], av[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) rv[i] = rows_s[ty + 16 * i][c];
#pragma unroll
      for (int j = 0; j < 4; ++j) av[j] = anchors_s[tx + 8 * j][c];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += rv[i] * av[j];
      }
      if (tx == 0) {
#pragma unroll
        for (int i = 0; i < 4; ++i) row_sq[i] += rv[i] * rv[i];
      }
      if (ty == 0) {
#pragma unroll
        for (int j = 0; j < 4; ++j) anchor_sq[j] += av[j] * av[j];
      }
    }
    __syncthreads();
  }
  if (tx == 0) {
    for (int i = 0; i < 4; ++i) row_norm_s[ty + 16 * i] = sqrtf(row_sq[i]);
  }
  if (ty == 0) {
    for (int j = 0; j < 4; ++j) anchor_norm_s[tx + 8 * j] = sqrtf(anchor_sq[j]);
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int a = tx + 8 * j;
    if (anchor0 + a >= p.num_anchors) continue;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = ty + 16 * i;
      if (row0 + r >= p.num_rows) continue;
      p.scores[static_cast<int64_t>(anchor0 + a) * p.num_rows + row0 + r] =
          FinishScore(p.kind, acc[i][j], anchor_norm_s[a], row_norm_s[r],
                      row_bad_s[r] != 0 || anchor_bad_s[a] != 0);
    }
  }
}

// One warp per row of the stacked segments. See the file comment.
__global__ void __launch_bounds__(kSmallThreads) ScoreSegmentsKernel(SegmentScoreParams p) {
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

// CTAs for a one-warp-per-row launch of `kernel` over num_rows rows:
// enough for one full wave on the current device (as many CTAs as its SMs
// hold at once) and no more, so each warp walks several rows and every
// CTA's set-up (anchors into shared memory) is paid once per wave rather
// than once per 8 rows. The wave size is queried once per (kernel, device,
// shared memory size); kSmallMaxCtas if the queries fail.
template <typename Kernel>
int64_t RowWarpCtas(Kernel kernel, int64_t num_rows, size_t smem_bytes) {
  struct Wave {
    const void* kernel;
    int device;
    size_t smem_bytes;
    int64_t ctas;
  };
  static std::mutex mu;
  static std::vector<Wave> waves;
  const int64_t warps = kSmallThreads / 32;
  const int64_t ctas = (num_rows + warps - 1) / warps;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return std::max<int64_t>(1, std::min<int64_t>(ctas, kSmallMaxCtas));
  }
  const void* key = reinterpret_cast<const void*>(kernel);
  std::lock_guard<std::mutex> lock(mu);
  for (const Wave& w : waves) {
    if (w.kernel == key && w.device == device && w.smem_bytes == smem_bytes) {
      return std::max<int64_t>(1, std::min(ctas, w.ctas));
    }
  }
  int sms = 0, per_sm = 0;
  int64_t cap = kSmallMaxCtas;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kSmallThreads, smem_bytes) ==
          cudaSuccess &&
      sms > 0 && per_sm > 0) {
    cap = std::min<int64_t>(cap, int64_t{sms} * per_sm);
  }
  cudaGetLastError();  // a failed query is not the launch's error
  if (waves.size() < 64) waves.push_back(Wave{key, device, smem_bytes, cap});
  return std::max<int64_t>(1, std::min(ctas, cap));
}

template <typename T>
cudaError_t LaunchScoreTyped(const ScoreParams& p, cudaStream_t stream) {
  if (p.num_anchors <= kSmallBatch) {
    const size_t smem_bytes = static_cast<size_t>(p.num_anchors) * p.dim * sizeof(float);
    if (p.num_anchors == 1) {
      const int64_t ctas = RowWarpCtas(ScoreRowsSmallKernel<T, 1>, p.num_rows, smem_bytes);
      return LaunchKernel(ScoreRowsSmallKernel<T, 1>, dim3(static_cast<unsigned>(ctas)),
                          dim3(kSmallThreads), smem_bytes, stream, p);
    }
    const int64_t ctas = RowWarpCtas(ScoreRowsSmallKernel<T, kSmallBatch>, p.num_rows, smem_bytes);
    return LaunchKernel(ScoreRowsSmallKernel<T, kSmallBatch>, dim3(static_cast<unsigned>(ctas)),
                        dim3(kSmallThreads), smem_bytes, stream, p);
  }
  const dim3 grid(static_cast<unsigned>((p.num_rows + kTileRows - 1) / kTileRows),
                  static_cast<unsigned>((p.num_anchors + kTileAnchors - 1) / kTileAnchors));
  return LaunchKernel(ScoreRowsTiledKernel<T>, grid, dim3(kTileThreads), 0, stream, p);
}

}  // namespace

cudaError_t LaunchScoreLevels(const ScoreParams& params, cudaStream_t stream) {
  switch (params.levels_type) {
    case ElementType::kFp32:
      return LaunchScoreTyped<float>(params, stream);
    case ElementType::kFp16:
      return LaunchScoreTyped<__half>(params, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchScoreSegments(const SegmentScoreParams& params, cudaStream_t stream) {
  const int64_t ctas = RowWarpCtas(ScoreSegmentsKernel, params.total_rows, 0);
  return LaunchKernel(ScoreSegmentsKernel, dim3(static_cast<unsigned>(ctas)), dim3(kSmallThreads),
                      0, stream, params);
}

}  // namespace kvtier::gpu
