// The CUDA implementation of DeviceOps ("cuda:<ordinal>"): the device tier
// is one cudaMalloc arena on one GPU, exported to clients with
// cudaIpcGetMemHandle (see docs/GPU.md for the handle lifecycle).
//
// Copies: host -> arena batches run on one stream, arena -> host batches on
// another (both non-blocking), so promotions and demotions overlap. Each
// batch ends with a cudaEvent; its Fence completes when that event has
// completed. Adjacent copies (contiguous on both sides) are merged into one
// cudaMemcpyAsync. At most max_inflight_batches batches are outstanding
// (submitted and not yet observed complete by IsComplete, Wait or an
// internal reap); beyond that Submit* returns kUnavailable.
//
// Wait: kWaitForever blocks in cudaEventSynchronize; a finite timeout polls
// cudaEventQuery with a backoff that starts with yields and grows to
// 200 us sleeps, never sleeping past the deadline.
//
// Host memory: AllocHost is cudaHostAlloc(portable) and zeroed;
// RegisterHost is cudaHostRegister(portable) after the same overlap check as
// the CPU implementation.
//
// Every call sets the arena's device as current for the duration of the
// call and restores the caller's device afterwards.
//
// Without CUDA compiled in (KVTIER_HAVE_CUDA undefined), Create returns
// kUnavailable, so callers need no #ifdef.
//
// Thread safety: all methods may be called concurrently.
#ifndef KVTIER_GPU_CUDA_CUDA_DEVICE_OPS_H_
#define KVTIER_GPU_CUDA_CUDA_DEVICE_OPS_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "gpu/device_ops.h"

namespace kvtier::gpu {

// Largest arena CudaDeviceOps allocates.
inline constexpr uint64_t kMaxCudaArenaBytes = uint64_t{1} << 40;  // 1 TiB

struct CudaDeviceOpsOptions {
  int device_ordinal = 0;    // 0..cudaGetDeviceCount()-1
  uint64_t arena_bytes = 0;  // 1..kMaxCudaArenaBytes
  uint64_t arena_id = 0;     // 0: a random nonzero id
  // Submit* returns kUnavailable while this many batches are outstanding.
  // 1..1'000'000.
  uint32_t max_inflight_batches = 1024;
};

// True when this build contains the CUDA implementation.
bool CudaDeviceOpsCompiled();

// OK, or kInvalidArgument naming the first field out of range. Needs no
// device.
GpuStatus ValidateCudaDeviceOpsOptions(const CudaDeviceOpsOptions& options);

class CudaDeviceOps final : public DeviceOps {
 public:
  // Validates options (kInvalidArgument naming the field), then allocates
  // and zeroes the arena on options.device_ordinal and exports it.
  // kUnavailable without a usable device or driver (or without CUDA in
  // this build), kOutOfMemory when the arena does not fit. *out is set only
  // on success.
  static GpuStatus Create(const CudaDeviceOpsOptions& options, std::unique_ptr<CudaDeviceOps>* out);

  // Finishes every queued copy, then frees the arena, unregisters
  // registered ranges and frees AllocHost buffers still outstanding.
  // CUDA leaves reads through a client's IPC mapping of a freed arena
  // undefined: the daemon frees the arena only at shutdown, and clients
  // close their view when the daemon goes away (docs/GPU.md); the next
  // daemon's arena has a new arena_id.
  ~CudaDeviceOps() override;

  const ArenaInfo& arena() const override;
  GpuStatus SubmitToArena(std::span<const HostToArenaCopy> copies, Fence* fence) override;
  GpuStatus SubmitToHost(std::span<const ArenaToHostCopy> copies, Fence* fence) override;
  bool IsComplete(Fence fence) override;
  GpuStatus Wait(Fence fence, std::chrono::nanoseconds timeout) override;
  GpuStatus AllocHost(uint64_t size_bytes, HostBuffer* out) override;
  GpuStatus FreeHost(const HostBuffer& buffer) override;
  GpuStatus RegisterHost(void* ptr, uint64_t size_bytes) override;
  GpuStatus UnregisterHost(void* ptr) override;

  // Device pointer of the arena base, for kernels that read blocks in place
  // (gpu/cuda/kernels.h). Valid while this object lives.
  void* arena_base() const;

  // While paused, each copy stream is held by a host function queued on it,
  // so batches submitted afterwards stay incomplete until unpaused. Lets
  // tests observe incomplete fences, Wait timeouts and the in-flight limit
  // deterministically. The destructor unpauses.
  void PauseCopiesForTesting(bool paused);

 private:
  struct Impl;
  explicit CudaDeviceOps(std::unique_ptr<Impl> impl);

  const std::unique_ptr<Impl> impl_;
};

// Same as CudaDeviceOps::Create, returning the interface.
GpuStatus NewCudaDeviceOps(const CudaDeviceOpsOptions& options, std::unique_ptr<DeviceOps>* out);

// One arena per device: options.device_ordinal is replaced by each of
// ordinals in turn. All or nothing: on error *out is unchanged and every
// arena created so far is freed.
GpuStatus NewCudaDeviceOpsPerDevice(std::span<const int> ordinals,
                                    const CudaDeviceOpsOptions& options,
                                    std::vector<std::unique_ptr<DeviceOps>>* out);

}  // namespace kvtier::gpu

#endif  // KVTIER_GPU_CUDA_CUDA_DEVICE_OPS_H_
