// kvtier_gpu_bench: device-tier figures against anchors measured in the
// same run.
//
//   promotion   host -> HBM copies of scattered blocks through
//               CudaDeviceOps::SubmitToArena (one batch, and pipelined
//               batches of 32), as a ratio of one cudaMemcpyAsync of the same
//               bytes from the same pinned buffer (the peak). Goal >= 0.8.
//   select      ScoreLevels + TopK over 64K stacked level vectors x D=128,
//               per call, timed with CUDA events over many calls. Goal
//               <= 20 us at B=1. Anchor: the CPU reference (1 thread).
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
#include <random>
#include <string>
#include <vector>

#include "gpu/cuda/cuda_device_ops.h"
#include "gpu/cuda/kernels.h"
#include "tests/gpu/half.h"
#include "tests/gpu/kernel_reference.h"

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

struct SelectCase {
  ElementType type;
  int32_t anchors;
  int32_t k;
};

// Returns microseconds per ScoreLevels + TopK call (and each part alone),
// and per replay of the same pair captured in a CUDA graph.
bool BenchSelect(const SelectCase& c, int iters, double* total_us, double* score_us,
                 double* topk_us, double* graph_us) {
  constexpr int64_t kRows = 65536;
  constexpr int32_t kDim = 128;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const size_t elem = ElementSizeBytes(c.type);
  std::vector<std::byte> levels(kRows * kDim * elem);
  for (int64_t i = 0; i < kRows * kDim; ++i) {
    const float x = dist(rng);
    if (c.type == ElementType::kFp32) {
      std::memcpy(levels.data() + i * 4, &x, 4);
    } else {
      const uint16_t h = testing::FloatToHalf(x);
      std::memcpy(levels.data() + i * 2, &h, 2);
    }
  }
  std::vector<float> anchors(static_cast<size_t>(c.anchors) * kDim);
  for (float& x : anchors) x = dist(rng);

  void *d_levels, *d_anchors, *d_scores, *d_indices;
  BENCH_CUDA(cudaMalloc(&d_levels, levels.size()));
  BENCH_CUDA(cudaMalloc(&d_anchors, anchors.size() * 4));
  BENCH_CUDA(cudaMalloc(&d_scores, static_cast<size_t>(c.anchors) * kRows * 4));
  BENCH_CUDA(cudaMalloc(&d_indices, static_cast<size_t>(c.anchors) * c.k * 4));
  BENCH_CUDA(cudaMemcpy(d_levels, levels.data(), levels.size(), cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(d_anchors, anchors.data(), anchors.size() * 4, cudaMemcpyHostToDevice));

  ScoreParams s;
  s.levels = d_levels;
  s.levels_type = c.type;
  s.num_rows = kRows;
  s.row_stride = kDim;
  s.dim = kDim;
  s.anchors = static_cast<const float*>(d_anchors);
  s.num_anchors = c.anchors;
  s.scores = static_cast<float*>(d_scores);
  TopKParams t;
  t.scores = static_cast<const float*>(d_scores);
  t.num_rows = kRows;
  t.num_anchors = c.anchors;
  t.k = c.k;
  t.indices = static_cast<int32_t*>(d_indices);
  BENCH_CHECK(CheckScoreParams(s).ok() && CheckTopKParams(t).ok(), "bench shapes");

  cudaStream_t stream;
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  auto time_us = [&](bool score, bool topk, double* us) {
    for (int i = 0; i < 20; ++i) {  // warm-up
      if (score) LaunchScoreLevels(s, stream);
      if (topk) LaunchTopK(t, stream);
    }
    cudaEventRecord(start, stream);
    for (int i = 0; i < iters; ++i) {
      if (score) LaunchScoreLevels(s, stream);
      if (topk) LaunchTopK(t, stream);
    }
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    *us = 1000.0 * ms / iters;
    return cudaGetLastError();
  };
  BENCH_CUDA(time_us(true, true, total_us));
  BENCH_CUDA(time_us(true, false, score_us));
  BENCH_CUDA(time_us(false, true, topk_us));

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  LaunchScoreLevels(s, stream);
  LaunchTopK(t, stream);
  BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
  BENCH_CUDA(cudaGraphInstantiateWithFlags(&exec, graph, 0));
  for (int i = 0; i < 20; ++i) BENCH_CUDA(cudaGraphLaunch(exec, stream));
  BENCH_CUDA(cudaEventRecord(start, stream));
  for (int i = 0; i < iters; ++i) BENCH_CUDA(cudaGraphLaunch(exec, stream));
  BENCH_CUDA(cudaEventRecord(stop, stream));
  BENCH_CUDA(cudaEventSynchronize(stop));
  float graph_ms = 0;
  BENCH_CUDA(cudaEventElapsedTime(&graph_ms, start, stop));
  *graph_us = 1000.0 * graph_ms / iters;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);

  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  for (void* p : {d_levels, d_anchors, d_scores, d_indices}) cudaFree(p);
  return true;
}

bool BenchSelectAll(bool quick) {
  const int iters = quick ? 50 : 500;
  const SelectCase cases[] = {{ElementType::kFp32, 1, 1024},
                              {ElementType::kFp16, 1, 1024},
                              {ElementType::kFp32, 1, 6554},
                              {ElementType::kFp16, 8, 1024},
                              {ElementType::kFp16, 64, 1024}};
  std::printf("\nselect: 65536 level vectors x D=128, K of them per anchor, %d calls each\n",
              iters);
  std::printf("  %-6s %5s %6s %12s %10s %10s %12s\n", "levels", "B", "K", "score+topk", "score",
              "topk", "as a graph");
  double headline = 0;
  for (const SelectCase& c : cases) {
    double total = 0, score = 0, topk = 0, graph = 0;
    if (!BenchSelect(c, iters, &total, &score, &topk, &graph)) return false;
    const char* type = c.type == ElementType::kFp32 ? "fp32" : "fp16";
    std::printf("  %-6s %5d %6d %9.1f us %7.1f us %7.1f us %9.1f us\n", type, c.anchors, c.k, total,
                score, topk, graph);
    std::printf("RESULT score_topk_us_%s_B%d_K%d=%.1f\n", type, c.anchors, c.k, total);
    std::printf("RESULT score_topk_graph_us_%s_B%d_K%d=%.1f\n", type, c.anchors, c.k, graph);
    if (&c == &cases[0]) headline = total;
  }

  // Anchor: the CPU reference for fp32, B=1, K=1024 (double accumulation).
  constexpr int64_t kRows = 65536;
  constexpr int32_t kDim = 128;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> levels(kRows * kDim), anchor(kDim);
  for (float& x : levels) x = dist(rng);
  for (float& x : anchor) x = dist(rng);
  const auto t0 = Clock::now();
  const auto scores = testing::ScoreReference(levels.data(), ElementType::kFp32, kRows, kDim, kDim,
                                              anchor, 1, ScoreKind::kCosineUnit);
  const auto top = testing::TopKReferenceSelect(scores, kRows, 1, 1024);
  const double cpu_us = Seconds(t0, Clock::now()) * 1e6;
  std::printf("  %-6s %5d %6d %9.1f us  (anchor: CPU reference, 1 thread; GPU is %.0fx faster)\n",
              "fp32", 1, 1024, cpu_us, cpu_us / headline);
  std::printf("RESULT cpu_reference_select_us=%.1f\n", cpu_us);
  std::printf("RESULT score_topk_us=%.1f\n", headline);
  return top.indices.size() == 1024;
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
  bool ok = kvtier::gpu::BenchPromotion(quick);
  ok = kvtier::gpu::BenchSelectAll(quick) && ok;
  return ok ? 0 : 1;
}
