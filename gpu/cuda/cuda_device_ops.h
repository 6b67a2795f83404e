// The CUDA implementation of DeviceOps ("cuda:<ordinal>"): the device tier
// is one cudaMalloc arena on one GPU, exported to clients with
// cudaIpcGetMemHandle (see docs/GPU.md for the handle lifecycle).
//
// Copies: host -> arena batches run on one stream, arena -> host batches on
// another (both non-blocking), so promotions and demotions overlap, and a
// fence of one direction may complete before an earlier fence of the other
// (device_ops.h, Ordering). Each batch ends with a cudaEvent taken from a
// pool; its Fence completes when that event has completed. The host side of
// every copy is cut at the boundaries of this object's AllocHost buffers
// and RegisterHost ranges, and copies contiguous on both sides are merged
// only inside one of them (gpu/host_regions.h), because CUDA refuses a copy
// that runs from one pinned allocation into the next. A batch of several
// copies is queued with one cudaMemcpyBatchAsync where the runtime has it
// (CUDA 13); when the driver refuses it the batch is queued copy by copy
// and later batches skip it. At most max_inflight_batches batches are
// outstanding (submitted and not yet observed complete by IsComplete, Wait
// or an internal reap); beyond that Submit* returns kUnavailable.
//
// Wait: kWaitForever blocks in cudaEventSynchronize; a finite timeout polls
// cudaEventQuery with a backoff that starts with yields and grows to
// 200 us sleeps, never sleeping past the deadline.
//
// Host memory: AllocHost is cudaHostAlloc(portable) and zeroed;
// RegisterHost is cudaHostRegister(portable) after the same overlap check as
// the CPU implementation, run without the object's lock (pinning GiBs takes
// seconds; copies go on meanwhile).
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

// cudaStream_t is CUstream_st*; declared here so this header needs no CUDA
// headers.
struct CUstream_st;

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

  // Device-side ordering with work outside DeviceOps (no host wait):
  //   OrderStreamAfter   work queued on `stream` after this call runs after
  //                      the batch of `fence` (cudaStreamWaitEvent). Use it
  //                      before a kernel reads blocks just promoted. OK for
  //                      Fence{0} and batches already finished; the batch's
  //                      error if it failed; kInvalidArgument for a fence
  //                      never issued.
  //   OrderCopiesAfter   batches of both directions submitted after this
  //                      call run after the work queued on `stream` so far
  //                      (e.g. a kernel writing arena bytes that are then
  //                      demoted).
  // `stream` must belong to this object's device.
  GpuStatus OrderStreamAfter(Fence fence, CUstream_st* stream);
  GpuStatus OrderCopiesAfter(CUstream_st* stream);

  // Whether batches are queued with cudaMemcpyBatchAsync (false once the
  // driver refused it, or when the runtime lacks it).
  bool UsesBatchedCopies() const;

  // While paused, each copy stream is held by a host function queued on it,
  // so batches submitted afterwards stay incomplete until unpaused. Lets
  // tests observe incomplete fences, Wait timeouts and the in-flight limit
  // deterministically. The destructor unpauses.
  void PauseCopiesForTesting(bool paused);
  // The same for one direction's stream only; the other keeps running.
  void PauseDirectionForTesting(CopyDirection direction, bool paused);

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
