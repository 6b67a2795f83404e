// Exact top-K per anchor in one kernel: a radix select over order-preserving
// 32-bit keys by a thread-block cluster per anchor row.
//
// scores [B][N] fp32 -> indices [B][K] (and values [B][K]).
//
// Grid (C, B), cluster (C, 1, 1) on sm_90 (C = 1 and no cluster on older
// chips): the C CTAs of anchor a split its row into C contiguous slices.
// Three passes look at key bits [21, 32), [10, 21) and [0, 10) of the keys
// whose higher bits equal the prefix chosen so far. In each pass every CTA
// histograms its slice into its own shared memory, the cluster
// synchronises, CTA r sums slice r of the bins over all C histograms
// through distributed shared memory (a reduce-scatter), the cluster
// synchronises again, and every CTA reads the summed bins from their owners
// and finds, from the top bin down, the bin holding the k_remaining-th
// largest key; all CTAs compute the same bin, so no CTA waits for another's
// answer. Histograms alternate between two buffers (a buffer is cleared
// only after every CTA has passed the barrier that follows its last remote
// reads). Each CTA
// also adds up its own keys above the chosen bins: after the last pass it
// knows how many of its keys are greater than the K-th key and how many
// equal it, without reading the scores again. The gather then reads each
// slice once more: CTA r writes its greater keys after those of CTAs
// 0..r-1, in row order (a block scan), and equal keys in row order into the
// remaining slots until they are full, so ties go to the lowest rows and
// the output is the same on every run. Four reads of the row in all, the
// last three from L2.
//
// Key order: larger float -> larger key; -0.0 is read as +0.0 (they tie);
// NaN -> 0, below -Inf (whose key is 0x007fffff).
#include <cooperative_groups.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <mutex>

#include "gpu/cuda/kernel_launch.h"
#include "gpu/cuda/launch.cuh"

namespace kvtier::gpu {
namespace {

namespace cg = cooperative_groups;

constexpr int kTopKThreads = 512;
constexpr int kTopKMaxBins = 2048;
constexpr int kTopKPasses = 3;
constexpr int kGatherItems = 4;  // consecutive rows per thread in the gather
constexpr int kHistItems = 4;    // keys per thread per histogram step
// Rows per CTA the cluster size aims at; C = ceil(N / kRowsPerCta), capped.
constexpr int64_t kRowsPerCta = 4096;
constexpr int kCtasPerSm = 2;        // of kTopKThreads threads: the grid a batch aims at per SM
constexpr int kMaxClusterCtas = 16;  // the largest cluster ClusterSupportOf tries
constexpr int kMaxBinsPerThread = kTopKMaxBins / kTopKThreads;
constexpr int kMaxDevices = 64;

__device__ __forceinline__ int PassShift(int pass) { return pass == 0 ? 21 : pass == 1 ? 10 : 0; }
__device__ __forceinline__ int PassBits(int pass) { return pass == 2 ? 10 : 11; }

__device__ __forceinline__ uint32_t OrderedKey(float x) {
  if (isnan(x)) return 0;
  if (x == 0.0f) x = 0.0f;  // -0.0 ties with +0.0
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Cluster primitives; on chips without clusters the cluster is this CTA.
__device__ __forceinline__ unsigned ClusterRank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cg::this_cluster().block_rank();
#else
  return 0;
#endif
}
__device__ __forceinline__ void ClusterSync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cg::this_cluster().sync();
#else
  __syncthreads();
#endif
}
template <typename T>
__device__ __forceinline__ T* ClusterMap(T* local, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cg::this_cluster().map_shared_rank(local, rank);
#else
  return local;
#endif
}

__global__ void __launch_bounds__(kTopKThreads) TopKClusterKernel(TopKParams p, int ctas) {
  using Scan32 = cub::BlockScan<uint32_t, kTopKThreads>;
  using Scan64 = cub::BlockScan<unsigned long long, kTopKThreads>;
  using Reduce32 = cub::BlockReduce<uint32_t, kTopKThreads>;
  __shared__ uint32_t hist[2][kTopKMaxBins];
  __shared__ uint32_t summed[kTopKMaxBins];  // this CTA's slice of the cluster-wide histogram
  __shared__ uint32_t published[2];          // this CTA's keys greater than / equal to the K-th
  __shared__ union {
    typename Scan32::TempStorage scan32;
    typename Scan64::TempStorage scan64;
    typename Reduce32::TempStorage reduce32;
  } temp;
  __shared__ uint32_t s_prefix, s_k_remaining, s_bin, s_above, s_greater, s_equal;
  __shared__ unsigned long long s_base_greater, s_base_equal;

  const unsigned rank = ClusterRank();
  const int tid = threadIdx.x;
  const int64_t n = p.num_rows;
  const int64_t begin = n * rank / ctas;
  const int64_t end = n * (rank + 1) / ctas;
  const float* scores = p.scores + static_cast<int64_t>(blockIdx.y) * n;

  for (int i = tid; i < 2 * kTopKMaxBins; i += kTopKThreads) (&hist[0][0])[i] = 0;
  if (tid == 0) {
    s_prefix = 0;
    s_k_remaining = static_cast<uint32_t>(p.k);
    s_greater = 0;
    s_equal = 0;
  }
  __syncthreads();

  const int lane = tid % 32;
  for (int pass = 0; pass < kTopKPasses; ++pass) {
    const int shift = PassShift(pass);
    const int bins = 1 << PassBits(pass);
    const uint32_t digit_mask = static_cast<uint32_t>(bins - 1);
    const uint32_t prefix = s_prefix;
    const uint32_t k_remaining = s_k_remaining;
    const uint32_t prefix_mask = pass == 0 ? 0u : (0xffffffffu << PassShift(pass - 1));
    uint32_t* h = hist[pass & 1];

    // Histogram of this slice, kHistItems keys per thread per step (their
    // loads are issued together). Scores cluster (cosine scores share a
    // few exponents), so lanes with the same bin add once, through their
    // lowest lane; every thread runs the same number of steps, so the warp
    // vote sees full warps.
    for (int64_t base = begin; base < end; base += int64_t{kTopKThreads} * kHistItems) {
      uint32_t bin[kHistItems];
#pragma unroll
      for (int j = 0; j < kHistItems; ++j) {
        const int64_t i = base + int64_t{j} * kTopKThreads + tid;
        bin[j] = 0xffffffffu;  // no bin
        if (i < end) {
          const uint32_t key = OrderedKey(scores[i]);
          if ((key & prefix_mask) == prefix) bin[j] = (key >> shift) & digit_mask;
        }
      }
#pragma unroll
      for (int j = 0; j < kHistItems; ++j) {
        const uint32_t peers = __match_any_sync(0xffffffffu, bin[j]);
        if (bin[j] != 0xffffffffu && lane == __ffs(peers) - 1) {
          atomicAdd(&h[bin[j]], static_cast<uint32_t>(__popc(peers)));
        }
      }
    }
    __syncthreads();
    ClusterSync();  // every CTA's histogram of this pass is complete

    // Thread t owns the per_thread bins just below bins - t * per_thread, so
    // an exclusive scan in thread order counts the keys in higher bins.
    // Reduce-scatter, then gather: CTA r adds up, over every CTA's
    // histogram, the bins of its own slice into `summed` (slice x C remote
    // reads per CTA in all), the cluster synchronises, and each thread then
    // reads its bins of the cluster-wide histogram from the CTA that owns
    // them. Per CTA that is 2 x bins remote reads, not bins x C.
    const int slice = (bins + ctas - 1) / ctas;
    const int slice_begin = static_cast<int>(rank) * slice;
    const int slice_end = min(bins, slice_begin + slice);
    for (int b = slice_begin + tid; b < slice_end; b += kTopKThreads) {
      uint32_t c = 0;
#pragma unroll
      for (int r = 0; r < kMaxClusterCtas; ++r) {  // loads issued together; ranks past C masked
        const uint32_t v = ClusterMap(h, r < ctas ? static_cast<unsigned>(r) : 0u)[b];
        c += r < ctas ? v : 0u;
      }
      summed[b] = c;
    }
    __syncthreads();
    ClusterSync();  // every slice of the cluster-wide histogram is complete
    const int per_thread = bins / kTopKThreads;  // 4 or 2
    const int top = bins - tid * per_thread;
    uint32_t counts[kMaxBinsPerThread] = {};
    uint32_t total = 0;
#pragma unroll
    for (int j = 0; j < kMaxBinsPerThread; ++j) {
      if (j < per_thread) {
        const int bin = top - 1 - j;
        counts[j] = ClusterMap(summed, static_cast<unsigned>(bin / slice))[bin];
        total += counts[j];
      }
    }
    uint32_t above = 0;
    Scan32(temp.scan32).ExclusiveSum(total, above);
    uint32_t running = above;
#pragma unroll
    for (int j = 0; j < kMaxBinsPerThread; ++j) {
      if (j >= per_thread) break;
      if (running < k_remaining && running + counts[j] >= k_remaining) {
        s_bin = static_cast<uint32_t>(top - 1 - j);
        s_above = running;
      }
      running += counts[j];
    }
    __syncthreads();
    const uint32_t chosen = s_bin;
    // This CTA's own keys above the chosen bin are greater than the K-th.
    uint32_t mine = 0;
    for (int j = 0; j < per_thread; ++j) {
      const int bin = top - 1 - j;
      if (static_cast<uint32_t>(bin) > chosen) mine += h[bin];
    }
    const uint32_t mine_total = Reduce32(temp.reduce32).Sum(mine);
    if (tid == 0) {
      s_greater += mine_total;
      if (pass == kTopKPasses - 1) s_equal = h[chosen];
      s_prefix = prefix | (chosen << shift);
      s_k_remaining = k_remaining - s_above;
    }
    // Every CTA passed this pass's barrier, so none still reads the other
    // buffer (last read remotely in the previous pass): clear it for the
    // next one.
    for (int i = tid; i < kTopKMaxBins; i += kTopKThreads) hist[(pass + 1) & 1][i] = 0;
    __syncthreads();
  }

  const uint32_t kth = s_prefix;
  const uint32_t k_equal = s_k_remaining;
  const uint32_t k_greater = static_cast<uint32_t>(p.k) - k_equal;
  if (tid == 0) {
    published[0] = s_greater;
    published[1] = s_equal;
  }
  __syncthreads();
  ClusterSync();
  if (tid == 0) {
    unsigned long long greater = 0, equal = 0;
    for (unsigned r = 0; r < rank; ++r) {
      const uint32_t* other = ClusterMap(published, r);
      greater += other[0];
      equal += other[1];
    }
    s_base_greater = greater;
    s_base_equal = equal;
  }
  // No CTA may exit while another still reads its shared memory.
  ClusterSync();

  int32_t* indices = p.indices + static_cast<int64_t>(blockIdx.y) * p.k;
  float* values = p.values ? p.values + static_cast<int64_t>(blockIdx.y) * p.k : nullptr;
  unsigned long long run_greater = s_base_greater, run_equal = s_base_equal;
  for (int64_t tile = begin; tile < end; tile += int64_t{kTopKThreads} * kGatherItems) {
    const int64_t first = tile + static_cast<int64_t>(tid) * kGatherItems;
    float x[kGatherItems];
    uint32_t key[kGatherItems];
    uint32_t greater = 0, equal = 0;
#pragma unroll
    for (int j = 0; j < kGatherItems; ++j) {
      const int64_t i = first + j;
      x[j] = i < end ? scores[i] : 0.0f;
      key[j] = i < end ? OrderedKey(x[j]) : 0u;
      const bool valid = i < end;
      greater += valid && key[j] > kth;
      equal += valid && key[j] == kth;
    }
    const unsigned long long packed = (static_cast<unsigned long long>(greater) << 32) | equal;
    unsigned long long before = 0, aggregate = 0;
    Scan64(temp.scan64).ExclusiveSum(packed, before, aggregate);
    unsigned long long greater_slot = run_greater + (before >> 32);
    unsigned long long equal_rank = run_equal + (before & 0xffffffffull);
#pragma unroll
    for (int j = 0; j < kGatherItems; ++j) {
      const int64_t i = first + j;
      if (i >= end) break;
      if (key[j] > kth) {
        indices[greater_slot] = static_cast<int32_t>(i);
        if (values) values[greater_slot] = x[j];
        ++greater_slot;
      } else if (key[j] == kth) {
        if (equal_rank < k_equal) {
          indices[k_greater + equal_rank] = static_cast<int32_t>(i);
          if (values) values[k_greater + equal_rank] = x[j];
        }
        ++equal_rank;
      }
    }
    run_greater += aggregate >> 32;
    run_equal += aggregate & 0xffffffffull;
    __syncthreads();  // temp storage is reused by the next tile
  }
}

// How the device runs TopKClusterKernel: with thread-block clusters (sm_90
// and later) of up to max_ctas CTAs (16, non-portable, or fewer where 16
// CTAs of 512 threads cannot be resident at once), else one CTA per anchor.
// Probed once per device.
struct ClusterSupport {
  bool clusters = false;
  int max_ctas = 1;
  int sms = 0;  // multiprocessors of the device
};

ClusterSupport ClusterSupportOf(int device) {
  static std::mutex mu;
  static bool probed[kMaxDevices] = {};
  static ClusterSupport cached[kMaxDevices];
  if (device < 0 || device >= kMaxDevices) return ClusterSupport{};
  std::lock_guard<std::mutex> lock(mu);
  if (probed[device]) return cached[device];
  int major = 0, cluster_launch = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, device);
  ClusterSupport support;
  cudaDeviceGetAttribute(&support.sms, cudaDevAttrMultiProcessorCount, device);
  if (major >= 9 && cluster_launch != 0) {
    support.clusters = true;
    cudaFuncSetAttribute(TopKClusterKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    for (int c : {16, 8, 4, 2}) {
      cudaLaunchAttribute attribute[1];
      attribute[0].id = cudaLaunchAttributeClusterDimension;
      attribute[0].val.clusterDim.x = c;
      attribute[0].val.clusterDim.y = 1;
      attribute[0].val.clusterDim.z = 1;
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(c, 1);
      config.blockDim = dim3(kTopKThreads);
      config.attrs = attribute;
      config.numAttrs = 1;
      int clusters = 0;
      if (cudaOccupancyMaxActiveClusters(&clusters, TopKClusterKernel, &config) == cudaSuccess &&
          clusters > 0) {
        support.max_ctas = c;
        break;
      }
    }
  }
  // A refused attribute or query leaves a non-sticky error in the thread's
  // last-error slot; it is not the caller's to see.
  cudaGetLastError();
  probed[device] = true;
  cached[device] = support;
  return support;
}

}  // namespace

int TopKCtasPerAnchor(int64_t num_rows, int device, int64_t num_anchors) {
  const ClusterSupport support = ClusterSupportOf(device);
  int64_t ctas = (num_rows + kRowsPerCta - 1) / kRowsPerCta;
  if (ctas > support.max_ctas) ctas = support.max_ctas;
  // A batch of anchors fills the device by itself: keep the grid to about
  // kCtasPerSm CTAs per SM (one wave) rather than splitting rows further.
  if (num_anchors > 1 && support.sms > 0) {
    const int64_t wave = int64_t{support.sms} * kCtasPerSm / num_anchors;
    if (ctas > wave) ctas = wave;
  }
  if (ctas < 1) ctas = 1;
  return static_cast<int>(ctas);
}

cudaError_t LaunchTopK(const TopKParams& params, cudaStream_t stream) {
  // Launches go to the current device, so it is the stream's.
  int device = 0;
  const cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const ClusterSupport support = ClusterSupportOf(device);
  const int ctas = TopKCtasPerAnchor(params.num_rows, device, params.num_anchors);
  const dim3 grid(static_cast<unsigned>(ctas), static_cast<unsigned>(params.num_anchors));
  if (support.clusters) {
    return LaunchClusterKernel(TopKClusterKernel, grid, dim3(kTopKThreads),
                               static_cast<unsigned>(ctas), 0, stream, params, ctas);
  }
  return LaunchKernel(TopKClusterKernel, grid, dim3(kTopKThreads), 0, stream, params, 1);
}

}  // namespace kvtier::gpu
