// Exact top-K per anchor by radix select over order-preserving 32-bit keys.
//
// scores [B][N] fp32 -> indices [B][K] (and values [B][K]), unordered.
//
// Per anchor a, a TopKState in the workspace carries the selection:
//   pass p = 0, 1, 2 looks at key bits [shift_p, shift_p + bits_p) of the
//   keys whose higher bits equal `prefix` (11, 11 and 10 bits). Grid
//   (tiles, B): each CTA histograms its tile of 4096 scores in shared
//   memory and adds the non-zero bins to the anchor's global histogram; the
//   last CTA to arrive (atomic ticket) scans the bins from the top, finds
//   the bin holding the k_remaining-th largest key, appends it to `prefix`,
//   subtracts the keys above it from k_remaining, and clears the histogram
//   for the next pass. After pass 2, prefix is the exact key of the K-th
//   largest score and k_remaining says how many keys equal to it belong to
//   the top K.
//   Gather, grid (tiles, B): keys above the K-th go to slots
//   [0, K - k_remaining) and keys equal to it to the remaining slots (first
//   come, first served), with warp-aggregated atomic slot counters.
#include <cub/block/block_scan.cuh>

#include "gpu/cuda/kernel_launch.h"

namespace kvtier::gpu {
namespace {

constexpr int kTopKThreads = 256;
constexpr int kTopKTile = kTopKThreads * 16;
constexpr int kTopKMaxBins = 2048;
constexpr int kTopKPasses = 3;
__constant__ int kPassShift[kTopKPasses] = {21, 10, 0};
__constant__ int kPassBits[kTopKPasses] = {11, 11, 10};

struct TopKState {
  uint32_t hist[kTopKMaxBins];
  uint32_t arrived;      // CTAs of the current pass done
  uint32_t prefix;       // selected high bits so far
  uint32_t k_remaining;  // rank still to find below prefix
  uint32_t num_greater;  // gather slot counters
  uint32_t num_equal;
  uint32_t reserved[3];
};
static_assert(sizeof(TopKState) % 16 == 0, "TopKState keeps 16-byte alignment");

// Larger float -> larger key; NaN -> 0 (below -Inf, whose key is 0x007fffff).
__device__ __forceinline__ uint32_t OrderedKey(float x) {
  if (isnan(x)) return 0;
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(kTopKThreads) TopKHistogramKernel(TopKParams p, int pass) {
  using BlockScan = cub::BlockScan<uint32_t, kTopKThreads>;
  __shared__ uint32_t hist_s[kTopKMaxBins];
  __shared__ typename BlockScan::TempStorage scan_storage;
  __shared__ bool is_last;
  TopKState* state = static_cast<TopKState*>(p.workspace) + blockIdx.y;
  const int shift = kPassShift[pass];
  const int bins = 1 << kPassBits[pass];
  const uint32_t digit_mask = static_cast<uint32_t>(bins - 1);
  // Read before the barriers below: the last CTA rewrites both fields.
  const uint32_t prefix = pass == 0 ? 0u : state->prefix;
  const uint32_t k_remaining = pass == 0 ? static_cast<uint32_t>(p.k) : state->k_remaining;
  const uint32_t prefix_mask = pass == 0 ? 0u : (0xffffffffu << kPassShift[pass - 1]);

  for (int i = threadIdx.x; i < bins; i += blockDim.x) hist_s[i] = 0;
  __syncthreads();
  const float* scores = p.scores + static_cast<int64_t>(blockIdx.y) * p.num_rows;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kTopKTile;
  const int64_t end = begin + kTopKTile < p.num_rows ? begin + kTopKTile : p.num_rows;
  // Scores cluster (cosine scores share a few exponents), so pass 0 puts
  // most keys of a warp into one bin: lanes with the same bin add once,
  // through their lowest lane. Every thread runs the same number of
  // iterations, so the warp vote sees full warps.
  const int lane = threadIdx.x % 32;
  for (int64_t base = begin; base < end; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    uint32_t bin = 0xffffffffu;  // no bin
    if (i < end) {
      const uint32_t key = OrderedKey(scores[i]);
      if ((key & prefix_mask) == prefix) bin = (key >> shift) & digit_mask;
    }
    const uint32_t peers = __match_any_sync(0xffffffffu, bin);
    if (bin != 0xffffffffu && lane == __ffs(peers) - 1) {
      atomicAdd(&hist_s[bin], static_cast<uint32_t>(__popc(peers)));
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < bins; i += blockDim.x) {
    if (hist_s[i] != 0) atomicAdd(&state->hist[i], hist_s[i]);
  }
  // Publish this CTA's bins before taking a ticket.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(&state->arrived, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();

  // Thread t owns the per_thread bins just below bins - t * per_thread, so
  // an exclusive scan in thread order counts the keys in higher bins.
  const int per_thread = bins / kTopKThreads;  // 8 or 4
  const int top = bins - static_cast<int>(threadIdx.x) * per_thread;
  uint32_t counts[kTopKMaxBins / kTopKThreads];
  uint32_t local = 0;
  for (int j = 0; j < per_thread; ++j) {
    counts[j] = __ldcg(&state->hist[top - 1 - j]);
    local += counts[j];
  }
  uint32_t above = 0;
  BlockScan(scan_storage).ExclusiveSum(local, above);
  uint32_t running = above;
  for (int j = 0; j < per_thread; ++j) {
    if (running < k_remaining && running + counts[j] >= k_remaining) {
      state->prefix = prefix | (static_cast<uint32_t>(top - 1 - j) << shift);
      state->k_remaining = k_remaining - running;
    }
    running += counts[j];
    state->hist[top - 1 - j] = 0;
  }
  if (threadIdx.x == 0) state->arrived = 0;
}

__global__ void __launch_bounds__(kTopKThreads) TopKGatherKernel(TopKParams p) {
  const TopKState* state = static_cast<const TopKState*>(p.workspace) + blockIdx.y;
  TopKState* counters = static_cast<TopKState*>(p.workspace) + blockIdx.y;
  const uint32_t kth = state->prefix;
  const uint32_t k_equal = state->k_remaining;
  const uint32_t k_greater = static_cast<uint32_t>(p.k) - k_equal;
  const float* scores = p.scores + static_cast<int64_t>(blockIdx.y) * p.num_rows;
  int32_t* indices = p.indices + static_cast<int64_t>(blockIdx.y) * p.k;
  float* values = p.values ? p.values + static_cast<int64_t>(blockIdx.y) * p.k : nullptr;
  const int lane = threadIdx.x % 32;
  const uint32_t lanes_below = (1u << lane) - 1;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kTopKTile;
  const int64_t end = begin + kTopKTile < p.num_rows ? begin + kTopKTile : p.num_rows;
  // Every thread runs the same number of iterations, so the warp votes
  // below always see full warps.
  for (int64_t base = begin; base < end; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const bool valid = i < end;
    const float x = valid ? scores[i] : 0.0f;
    const uint32_t key = valid ? OrderedKey(x) : 0u;
    const bool greater = valid && key > kth;
    const bool equal = valid && key == kth;

    const uint32_t greater_mask = __ballot_sync(0xffffffffu, greater);
    if (greater_mask != 0) {
      const int leader = __ffs(greater_mask) - 1;
      uint32_t slot0 = 0;
      if (lane == leader) slot0 = atomicAdd(&counters->num_greater, __popc(greater_mask));
      slot0 = __shfl_sync(0xffffffffu, slot0, leader);
      if (greater) {
        const uint32_t slot = slot0 + __popc(greater_mask & lanes_below);
        indices[slot] = static_cast<int32_t>(i);
        if (values) values[slot] = x;
      }
    }
    const uint32_t equal_mask = __ballot_sync(0xffffffffu, equal);
    if (equal_mask != 0) {
      const int leader = __ffs(equal_mask) - 1;
      uint32_t slot0 = 0;
      if (lane == leader) slot0 = atomicAdd(&counters->num_equal, __popc(equal_mask));
      slot0 = __shfl_sync(0xffffffffu, slot0, leader);
      const uint32_t slot = slot0 + __popc(equal_mask & lanes_below);
      if (equal && slot < k_equal) {
        indices[k_greater + slot] = static_cast<int32_t>(i);
        if (values) values[k_greater + slot] = x;
      }
    }
  }
}

}  // namespace

size_t TopKWorkspaceBytes(int32_t num_anchors) {
  return num_anchors <= 0 ? 0 : static_cast<size_t>(num_anchors) * sizeof(TopKState);
}

cudaError_t LaunchTopK(const TopKParams& params, cudaStream_t stream) {
  cudaError_t err =
      cudaMemsetAsync(params.workspace, 0, TopKWorkspaceBytes(params.num_anchors), stream);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>((params.num_rows + kTopKTile - 1) / kTopKTile),
                  static_cast<unsigned>(params.num_anchors));
  for (int pass = 0; pass < kTopKPasses; ++pass) {
    TopKHistogramKernel<<<grid, kTopKThreads, 0, stream>>>(params, pass);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  TopKGatherKernel<<<grid, kTopKThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace kvtier::gpu
