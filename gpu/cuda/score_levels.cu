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
#include <cuda_fp16.h>

#include "gpu/cuda/kernel_launch.h"

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
                                             float row_norm) {
  if (kind == ScoreKind::kDot) return dot;
  const float denom = anchor_norm * row_norm;
  float cos = denom > 0.0f ? dot / denom : 0.0f;
  cos = fminf(1.0f, fmaxf(-1.0f, cos));
  return 0.5f * (1.0f + cos);
}

template <typename T>
__global__ void __launch_bounds__(kSmallThreads) ScoreRowsSmallKernel(ScoreParams p) {
  extern __shared__ float anchors_s[];  // [B][D]
  __shared__ float anchor_norm_s[kSmallBatch];
  const int dim = p.dim;
  const int num_anchors = p.num_anchors;
  for (int i = threadIdx.x; i < num_anchors * dim; i += blockDim.x) anchors_s[i] = p.anchors[i];
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  if (warp < num_anchors) {
    float n = 0.0f;
    for (int d = lane; d < dim; d += 32) n += anchors_s[warp * dim + d] * anchors_s[warp * dim + d];
    n = WarpSum(n);
    if (lane == 0) anchor_norm_s[warp] = sqrtf(n);
  }
  __syncthreads();

  const T* levels = static_cast<const T*>(p.levels);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * warps + warp; r < p.num_rows;
       r += static_cast<int64_t>(gridDim.x) * warps) {
    const T* row = levels + r * p.row_stride;
    float acc[kSmallBatch] = {};
    float norm = 0.0f;
#pragma unroll 4
    for (int d = lane; d < dim; d += 32) {
      const float x = ToFloat(row[d]);
      norm += x * x;
#pragma unroll
      for (int a = 0; a < kSmallBatch; ++a) {
        if (a < num_anchors) acc[a] += x * anchors_s[a * dim + d];
      }
    }
    norm = sqrtf(WarpSum(norm));
#pragma unroll
    for (int a = 0; a < kSmallBatch; ++a) {
      if (a < num_anchors) {
        const float dot = WarpSum(acc[a]);
        if (lane == 0) {
          p.scores[static_cast<int64_t>(a) * p.num_rows + r] =
              FinishScore(p.kind, dot, anchor_norm_s[a], norm);
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
  const int tid = threadIdx.x;
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
      rows_s[r][c] = (row < p.num_rows && c0 + c < p.dim)
                         ? ToFloat(levels[row * p.row_stride + c0 + c])
                         : 0.0f;
    }
    for (int idx = tid; idx < kTileAnchors * kTileChunk; idx += kTileThreads) {
      const int a = idx / kTileChunk, c = idx % kTileChunk;
      anchors_s[a][c] = (anchor0 + a < p.num_anchors && c0 + c < p.dim)
                            ? p.anchors[static_cast<int64_t>(anchor0 + a) * p.dim + c0 + c]
                            : 0.0f;
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
          FinishScore(p.kind, acc[i][j], anchor_norm_s[a], row_norm_s[r]);
    }
  }
}

template <typename T>
cudaError_t LaunchScoreTyped(const ScoreParams& p, cudaStream_t stream) {
  if (p.num_anchors <= kSmallBatch) {
    const int64_t warps = kSmallThreads / 32;
    int64_t ctas = (p.num_rows + warps - 1) / warps;
    if (ctas > kSmallMaxCtas) ctas = kSmallMaxCtas;
    const size_t smem_bytes = static_cast<size_t>(p.num_anchors) * p.dim * sizeof(float);
    ScoreRowsSmallKernel<T><<<static_cast<unsigned>(ctas), kSmallThreads, smem_bytes, stream>>>(p);
  } else {
    const dim3 grid(static_cast<unsigned>((p.num_rows + kTileRows - 1) / kTileRows),
                    static_cast<unsigned>((p.num_anchors + kTileAnchors - 1) / kTileAnchors));
    ScoreRowsTiledKernel<T><<<grid, kTileThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
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

}  // namespace kvtier::gpu
