// Key pooling: per-block summaries of keys already in the arena.
//
// Grid: num_blocks CTAs (one per block). CTA: G x D threads; thread
// (g, d) = threadIdx.x / D, threadIdx.x % D owns dim d and reads rows
// g, g + G, ... of each layer's keys, where a layer's keys are the
// H x T rows of D elements at K[l] (block layout [L][2][H][T][D]). Reads of
// one row are coalesced across the D threads of a row group.
//
// Each thread keeps fp32 running sums / minima / maxima for its dim; the G
// row groups are combined in shared memory (per layer when layer outputs
// are wanted, once at the end otherwise). The reduction order is fixed, so
// the results are deterministic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "gpu/cuda/kernel_launch.h"
#include "gpu/cuda/launch.cuh"

namespace kvtier::gpu {
namespace {

constexpr int kPoolTargetThreads = 512;
constexpr int kPoolMaxGroups = 8;

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }

// Shared scratch: four arrays of G x D floats (sum, weighted sum, min, max).
struct PoolScratch {
  float* sum;
  float* wsum;
  float* min;
  float* max;
};

// Combines the G partials of dim d into row group 0's registers. All
// threads of the CTA must call it.
__device__ void ReduceGroups(PoolScratch s, int groups, int dim, int g, int d, float* sum,
                             float* wsum, float* mn, float* mx) {
  const int slot = g * dim + d;
  s.sum[slot] = *sum;
  s.wsum[slot] = *wsum;
  s.min[slot] = *mn;
  s.max[slot] = *mx;
  __syncthreads();
  if (g == 0) {
    for (int other = 1; other < groups; ++other) {
      const int o = other * dim + d;
      *sum += s.sum[o];
      *wsum += s.wsum[o];
      *mn = fminf(*mn, s.min[o]);
      *mx = fmaxf(*mx, s.max[o]);
    }
  }
  __syncthreads();
}

template <typename T>
__global__ void __launch_bounds__(1024) PoolKeysKernel(PoolKeysParams p) {
  extern __shared__ float smem[];
  const KvBlockShape& shape = p.shape;
  const int dim = shape.head_dim;
  const int groups = blockDim.x / dim;
  const int g = threadIdx.x / dim;
  const int d = threadIdx.x % dim;
  const int b = blockIdx.x;
  const int heads = shape.num_kv_heads;
  const int tokens = shape.block_tokens;
  const int layers = shape.num_layers;
  const int rows = heads * tokens;
  PoolScratch s{smem, smem + blockDim.x, smem + 2 * blockDim.x, smem + 3 * blockDim.x};
  __shared__ float weight_total;

  const uint64_t offset = p.block_offsets[b];
  const uint64_t block_bytes = static_cast<uint64_t>(shape.BlockBytes());
  const bool in_arena =
      offset % sizeof(T) == 0 && offset <= p.arena_bytes && block_bytes <= p.arena_bytes - offset;
  if (!in_arena) {
    // Uniform across the CTA: every thread returns here.
    const float nan = __int_as_float(0x7fc00000);
    if (g == 0) {
      p.mean[static_cast<int64_t>(b) * dim + d] = nan;
      if (p.weighted_mean) p.weighted_mean[static_cast<int64_t>(b) * dim + d] = nan;
      if (p.min) p.min[static_cast<int64_t>(b) * dim + d] = nan;
      if (p.max) p.max[static_cast<int64_t>(b) * dim + d] = nan;
      for (int l = 0; l < layers; ++l) {
        const int64_t o = (static_cast<int64_t>(b) * layers + l) * dim + d;
        if (p.layer_mean) p.layer_mean[o] = nan;
        if (p.layer_min) p.layer_min[o] = nan;
        if (p.layer_max) p.layer_max[o] = nan;
      }
    }
    if (threadIdx.x == 0) p.flags[b] = kPoolBadOffset;
    return;
  }

  if (p.head_weights != nullptr) {
    // sum w: strided partials, then added in thread order (deterministic).
    float partial = 0.0f;
    for (int i = threadIdx.x; i < layers * heads; i += blockDim.x) partial += p.head_weights[i];
    s.sum[threadIdx.x] = partial;
    __syncthreads();
    if (threadIdx.x == 0) {
      float total = 0.0f;
      for (int i = 0; i < static_cast<int>(blockDim.x); ++i) total += s.sum[i];
      weight_total = total;
    }
    __syncthreads();
  }

  const T* block = reinterpret_cast<const T*>(p.arena + offset);
  const bool per_layer = p.layer_mean || p.layer_min || p.layer_max;
  const float layer_count = static_cast<float>(rows);
  float total_sum = 0.0f, total_wsum = 0.0f;
  float total_min = INFINITY, total_max = -INFINITY;
  bool nonfinite = false;

  for (int l = 0; l < layers; ++l) {
    const T* keys = block + shape.KeyIndex(l, 0, 0, 0);  // [H][T][D]
    float sum = 0.0f, wsum = 0.0f, mn = INFINITY, mx = -INFINITY;
    const float* weights =
        p.head_weights ? p.head_weights + static_cast<int64_t>(l) * heads : nullptr;
    for (int h = 0; h < heads; ++h) {
      float head_sum = 0.0f;
#pragma unroll 4
      for (int t = g; t < tokens; t += groups) {
        const float x = ToFloat(keys[(static_cast<int64_t>(h) * tokens + t) * dim + d]);
        nonfinite |= !isfinite(x);
        head_sum += x;
        mn = fminf(mn, x);
        mx = fmaxf(mx, x);
      }
      sum += head_sum;
      if (weights) wsum += weights[h] * head_sum;
    }
    if (per_layer) {
      ReduceGroups(s, groups, dim, g, d, &sum, &wsum, &mn, &mx);
      if (g == 0) {
        const int64_t o = (static_cast<int64_t>(b) * layers + l) * dim + d;
        if (p.layer_mean) p.layer_mean[o] = sum / layer_count;
        if (p.layer_min) p.layer_min[o] = mn;
        if (p.layer_max) p.layer_max[o] = mx;
      }
    }
    // After ReduceGroups only g == 0 holds the layer totals; without it
    // every group adds its own partial and the groups are combined below.
    if (!per_layer || g == 0) {
      total_sum += sum;
      total_wsum += wsum;
      total_min = fminf(total_min, mn);
      total_max = fmaxf(total_max, mx);
    }
  }
  if (!per_layer) {
    ReduceGroups(s, groups, dim, g, d, &total_sum, &total_wsum, &total_min, &total_max);
  }
  const bool any_nonfinite = __syncthreads_or(nonfinite);
  if (g == 0) {
    const int64_t o = static_cast<int64_t>(b) * dim + d;
    p.mean[o] = total_sum / (layer_count * static_cast<float>(layers));
    if (p.weighted_mean) {
      // sum_{l,h} w * (sum_t K) / T / sum w
      p.weighted_mean[o] = total_wsum / static_cast<float>(tokens) / weight_total;
    }
    if (p.min) p.min[o] = total_min;
    if (p.max) p.max[o] = total_max;
  }
  if (threadIdx.x == 0) p.flags[b] = any_nonfinite ? kPoolNonFinite : kPoolOk;
}

}  // namespace

cudaError_t LaunchPoolKeys(const PoolKeysParams& params, cudaStream_t stream) {
  const int dim = params.shape.head_dim;
  int groups = kPoolTargetThreads / dim;
  if (groups < 1) groups = 1;
  if (groups > kPoolMaxGroups) groups = kPoolMaxGroups;
  const int threads = groups * dim;
  const size_t smem_bytes = 4 * static_cast<size_t>(threads) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(params.num_blocks));
  switch (params.shape.dtype) {
    case ElementType::kFp16:
      return LaunchKernel(PoolKeysKernel<__half>, grid, dim3(threads), smem_bytes, stream, params);
    case ElementType::kBf16:
      return LaunchKernel(PoolKeysKernel<__nv_bfloat16>, grid, dim3(threads), smem_bytes, stream,
                          params);
    case ElementType::kFp32:
      return LaunchKernel(PoolKeysKernel<float>, grid, dim3(threads), smem_bytes, stream, params);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace kvtier::gpu
