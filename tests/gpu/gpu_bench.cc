// kvtier_gpu_bench: device-tier figures against anchors measured in the
// same run.
//
//   promotion   host -> HBM copies of scattered blocks through
//               CudaDeviceOps::SubmitToArena (one batch, and pipelined
//               batches of 32), as a ratio of one cudaMemcpyAsync of the same
//               bytes from the same pinned buffer (the peak). Goal >= 0.8.
//
// The Selector's device scoring is timed against its CPU descent by
// kvtier_gpu_select_conformance_test (TimingOfBatchesOnTheGpuAndTheCpu).
//
// Prints a table and "RESULT key=value" lines that tests/gpu/run.sh
// collects. Without a device prints "SKIPPED: <why>" and exits 0.
//
//   kvtier_gpu_bench [--quick]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/cuda/cuda_device_ops.h"

namespace kvtier::gpu {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

#define BENCH_CHECK(cond, what)                   \
  do {                                            \
    if (!(cond)) {                                \
      std::fprintf(stderr, "FAILED: %s\n", what); \
      return false;                               \
    }                                             \
  } while (0)

#define BENCH_CUDA(expr)                                                              \
  do {                                                                                \
    const cudaError_t bench_err = (expr);                                             \
    if (bench_err != cudaSuccess) {                                                   \
      std::fprintf(stderr, "FAILED: %s: %s\n", #expr, cudaGetErrorString(bench_err)); \
      return false;                                                                   \
    }                                                                                 \
  } while (0)

bool BenchPromotion(bool quick) {
  constexpr uint64_t kBlockBytes = 917504;  // Qwen2.5-7B fp16, 16 tokens
  const uint64_t blocks = quick ? 128 : 1024;
  const int reps = quick ? 3 : 7;
  const uint64_t total = blocks * kBlockBytes;

  CudaDeviceOpsOptions options;
  options.arena_bytes = total;
  std::unique_ptr<CudaDeviceOps> ops;
  GpuStatus status = CudaDeviceOps::Create(options, &ops);
  BENCH_CHECK(status.ok(), status.ToString().c_str());
  HostBuffer host;
  status = ops->AllocHost(total, &host);
  BENCH_CHECK(status.ok(), status.ToString().c_str());
  auto* src = static_cast<uint8_t*>(host.data);
  for (uint64_t i = 0; i < total; i += 4096) src[i] = static_cast<uint8_t>(i >> 12);

  // Block i goes to slot (i * 7919) mod blocks: neighbours in the batch are
  // never neighbours in the arena, so no copies merge.
  std::vector<HostToArenaCopy> copies;
  for (uint64_t i = 0; i < blocks; ++i) {
    copies.push_back({src + i * kBlockBytes, ((i * 7919) % blocks) * kBlockBytes, kBlockBytes});
  }

  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<double> peak, one_batch, pipelined;
  for (int rep = 0; rep < reps + 1; ++rep) {  // rep 0 warms up
    auto t0 = Clock::now();
    BENCH_CUDA(cudaMemcpyAsync(ops->arena_base(), src, total, cudaMemcpyHostToDevice, stream));
    BENCH_CUDA(cudaStreamSynchronize(stream));
    auto t1 = Clock::now();

    Fence fence;
    status = ops->SubmitToArena(copies, &fence);
    BENCH_CHECK(status.ok(), status.ToString().c_str());
    status = ops->Wait(fence, kWaitForever);
    BENCH_CHECK(status.ok(), status.ToString().c_str());
    auto t2 = Clock::now();

    constexpr size_t kBatch = 32;
    std::vector<Fence> fences;
    for (size_t i = 0; i < copies.size(); i += kBatch) {
      const size_t n = std::min(kBatch, copies.size() - i);
      status = ops->SubmitToArena(std::span(copies).subspan(i, n), &fence);
      BENCH_CHECK(status.ok(), status.ToString().c_str());
      fences.push_back(fence);
    }
    for (Fence f : fences) {
      status = ops->Wait(f, kWaitForever);
      BENCH_CHECK(status.ok(), status.ToString().c_str());
    }
    auto t3 = Clock::now();
    if (rep == 0) continue;
    peak.push_back(total / Seconds(t0, t1) / 1e9);
    one_batch.push_back(total / Seconds(t1, t2) / 1e9);
    pipelined.push_back(total / Seconds(t2, t3) / 1e9);
  }
  BENCH_CUDA(cudaStreamDestroy(stream));

  // The last promotion must have put block 1 where it belongs.
  std::vector<std::byte> back;
  status = ops->ReadArena(((1 * 7919) % blocks) * kBlockBytes, kBlockBytes, &back);
  BENCH_CHECK(status.ok(), status.ToString().c_str());
  BENCH_CHECK(std::memcmp(back.data(), src + kBlockBytes, kBlockBytes) == 0,
              "promoted block differs from its source");

  const double peak_gbps = Median(peak);
  const double batch_gbps = Median(one_batch);
  const double pipe_gbps = Median(pipelined);
  std::printf("\npromotion: %llu scattered blocks of %llu bytes (%.0f MiB), pinned, median of %d\n",
              static_cast<unsigned long long>(blocks), static_cast<unsigned long long>(kBlockBytes),
              total / 1048576.0, reps);
  std::printf("  %-44s %8.2f GB/s  (anchor)\n", "cudaMemcpyAsync, one contiguous copy", peak_gbps);
  std::printf("  %-44s %8.2f GB/s  ratio %.3f\n", "SubmitToArena, one batch", batch_gbps,
              batch_gbps / peak_gbps);
  std::printf("  %-44s %8.2f GB/s  ratio %.3f\n", "SubmitToArena, batches of 32 in flight",
              pipe_gbps, pipe_gbps / peak_gbps);
  std::printf("RESULT peak_memcpy_GBps=%.2f\n", peak_gbps);
  std::printf("RESULT promotion_GBps=%.2f\n", batch_gbps);
  std::printf("RESULT promotion_bandwidth_ratio=%.3f\n", batch_gbps / peak_gbps);
  std::printf("RESULT promotion_pipelined_ratio=%.3f\n", pipe_gbps / peak_gbps);
  return true;
}

}  // namespace
}  // namespace kvtier::gpu

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no usable CUDA device (%s)\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "none present");
    return 0;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device: cuda:0 %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  return kvtier::gpu::BenchPromotion(quick) ? 0 : 1;
}
