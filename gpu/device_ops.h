// DeviceOps: everything storage needs from the device tier's memory.
//
// The device tier is one arena of size_bytes bytes (GPU HBM, or a shared-
// memory file on hosts without a GPU). Storage carves it into block slots
// itself; DeviceOps only moves bytes between host memory and arena offsets,
// allocates or pins the host memory that takes part in those copies, and
// describes the arena so that it can be exported to clients.
//
// gpu/ is the bottom floor of the build: this header uses only the C++
// standard library. Errors are GpuStatus values; storage converts them to
// absl::Status in one helper (storage/host/gpu_status.h).
//
// Implementations:
//   gpu/cpu/shm_device_ops.h  "shm-arena": a file in /dev/shm, mapped
//                             read-write here and read-only by clients.
//   a CUDA implementation     "cuda:N": cudaMalloc arena exported by
//                             cudaIpcGetMemHandle, copies by cudaMemcpyAsync
//                             on streams, fences by cudaEvent.
//
// Ordering: a batch is ordered only by its own fence. Batches of the two
// directions (host -> arena, arena -> host) run independently and complete
// in any order relative to each other (CUDA: two streams; the shared-memory
// arena models this with ShmDeviceOpsOptions::out_of_order). So a caller
// that demotes slot X (arena -> host) and then promotes another block into
// X (host -> arena) must wait for the demotion's fence before submitting the
// promotion, or the demotion may read the new bytes. Device work that reads
// or writes the arena outside DeviceOps (kernels on a caller's stream) is
// ordered with copies by CudaDeviceOps::OrderStreamAfter / OrderCopiesAfter
// (gpu/cuda/cuda_device_ops.h), never by a host Wait alone.
//
// Thread safety: every method of every implementation is safe to call
// concurrently from any number of threads without external locking.
// Concurrent copies that write overlapping arena (or host) ranges leave
// those bytes unspecified; keeping writers apart is the caller's job (the
// block store owns slot allocation).
#ifndef KVTIER_GPU_DEVICE_OPS_H_
#define KVTIER_GPU_DEVICE_OPS_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvtier::gpu {

// Outcome of a DeviceOps call. The codes map one-to-one onto absl codes
// (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE, DEADLINE_EXCEEDED,
// INTERNAL).
struct GpuStatus {
  enum Code : uint8_t {
    kOk = 0,
    kInvalidArgument,   // bad offset, size, pointer, fence or option
    kOutOfMemory,       // host or device memory (or tmpfs space) exhausted
    kUnavailable,       // try again later (e.g. too many copies in flight)
    kDeadlineExceeded,  // Wait() timed out; the copies are still running
    kInternal,          // driver or OS failure; the message says which
  };

  Code code = kOk;
  std::string message;

  static GpuStatus Ok() { return GpuStatus{}; }
  static GpuStatus Error(Code code, std::string message) {
    return GpuStatus{code, std::move(message)};
  }
  bool ok() const { return code == kOk; }
  // "OK" or "<CODE>: <message>".
  inline std::string ToString() const;
};

// "OK", "INVALID_ARGUMENT", ... Never fails.
inline const char* GpuStatusCodeName(GpuStatus::Code code) {
  switch (code) {
    case GpuStatus::kOk:
      return "OK";
    case GpuStatus::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case GpuStatus::kOutOfMemory:
      return "OUT_OF_MEMORY";
    case GpuStatus::kUnavailable:
      return "UNAVAILABLE";
    case GpuStatus::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case GpuStatus::kInternal:
      return "INTERNAL";
  }
  return "UNKNOWN";
}

std::string GpuStatus::ToString() const {
  if (ok()) return "OK";
  return std::string(GpuStatusCodeName(code)) + ": " + message;
}

// Describes the arena. Constant for the lifetime of a DeviceOps.
struct ArenaInfo {
  // Random, nonzero, new for every arena: a client holding a block handle
  // (arena_id, offset, size_bytes, generation) from an earlier daemon run
  // sees a different arena_id and must reopen.
  uint64_t arena_id = 0;
  uint64_t size_bytes = 0;
  std::string backend;  // "shm-arena" or "cuda:<ordinal>"

  // shm-arena: the file clients map read-only (client/shm/shm_mapping.h).
  std::string shm_path;

  // cuda: raw bytes of cudaIpcMemHandle_t (64 bytes) for the arena base,
  // the device UUID (16 bytes, cudaDeviceProp::uuid) so a client opens the
  // handle on the right device, and the daemon's device ordinal.
  std::string ipc_handle;
  std::string device_uuid;
  int device_ordinal = -1;
};

// The two copy directions; each runs in submission order, independently
// of the other (see Ordering above).
enum class CopyDirection : uint8_t { kToArena = 0, kToHost = 1 };

// One contiguous copy from host memory into the arena.
struct HostToArenaCopy {
  const void* src = nullptr;
  uint64_t dst_offset = 0;  // arena offset
  uint64_t size_bytes = 0;
};

// One contiguous copy from the arena into host memory.
struct ArenaToHostCopy {
  uint64_t src_offset = 0;  // arena offset
  void* dst = nullptr;
  uint64_t size_bytes = 0;
};

// Names one submitted batch of copies. Fences are issued in increasing
// order by each DeviceOps; value 0 is never issued and counts as complete.
struct Fence {
  uint64_t value = 0;
  friend bool operator==(Fence a, Fence b) { return a.value == b.value; }
};

// Host memory returned by AllocHost.
struct HostBuffer {
  void* data = nullptr;
  uint64_t size_bytes = 0;  // as requested; the mapping may be larger
  bool pinned = false;      // page-locked for DMA (CUDA only)
};

// Wait() timeout that never expires.
inline constexpr std::chrono::nanoseconds kWaitForever = std::chrono::nanoseconds::max();

// Limits shared by all implementations; larger requests fail with
// kInvalidArgument before anything is copied.
inline constexpr size_t kMaxCopiesPerBatch = 65536;
inline constexpr uint64_t kMaxHostAllocBytes = uint64_t{1} << 40;  // 1 TiB

// Checks shared by every implementation before a batch is queued: the batch
// size, and for copy `index` that [offset, offset + size_bytes) lies inside
// an arena of arena_bytes (overflow-safe) and that the host pointer is set
// when bytes move. kInvalidArgument naming the copy, else OK.
inline GpuStatus CheckCopyBatchSize(size_t copies) {
  if (copies > kMaxCopiesPerBatch) {
    return GpuStatus::Error(GpuStatus::kInvalidArgument,
                            "batch holds more than kMaxCopiesPerBatch copies");
  }
  return GpuStatus::Ok();
}
inline GpuStatus CheckCopyRange(size_t index, uint64_t offset, uint64_t size_bytes,
                                const void* host, uint64_t arena_bytes) {
  if (offset > arena_bytes || size_bytes > arena_bytes - offset) {
    return GpuStatus::Error(GpuStatus::kInvalidArgument,
                            "copy " + std::to_string(index) + ": arena range [" +
                                std::to_string(offset) + ", +" + std::to_string(size_bytes) +
                                ") outside arena of " + std::to_string(arena_bytes) + " bytes");
  }
  if (host == nullptr && size_bytes > 0) {
    return GpuStatus::Error(GpuStatus::kInvalidArgument,
                            "copy " + std::to_string(index) + ": host pointer is null");
  }
  return GpuStatus::Ok();
}

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;

  // The arena this object copies to and from.
  virtual const ArenaInfo& arena() const = 0;
  // The arena's bytes as this process maps them, when it maps them in host
  // memory (the CPU arena's shared-memory file), so that they can be
  // pre-faulted; empty for device memory.
  virtual std::span<std::byte> HostMapping() const { return {}; }

  // ---- Asynchronous batched copies -------------------------------------
  //
  // Validate the whole batch first: every range must lie inside the arena
  // (overflow-safe), pointers must be non-null when size_bytes > 0, and the
  // batch must hold at most kMaxCopiesPerBatch copies. On any error nothing
  // is copied, *fence is left unchanged, and the error names the copy
  // index. An empty batch succeeds with an already-complete fence.
  //
  // On success the copies are queued (or, in implementations that copy
  // synchronously, already done) and *fence names the batch. Until the
  // fence completes the caller must keep every source range unchanged and
  // every destination range untouched, and keep all host memory alive.
  // Copies from pageable (unpinned) host memory are correct but may be
  // synchronous in the CUDA implementation.
  // Returns kUnavailable when the implementation's in-flight limit is
  // reached; nothing is queued in that case.
  virtual GpuStatus SubmitToArena(std::span<const HostToArenaCopy> copies, Fence* fence) = 0;
  virtual GpuStatus SubmitToHost(std::span<const ArenaToHostCopy> copies, Fence* fence) = 0;

  // True when every copy of the batch has finished (successfully or not;
  // Wait reports which). Fence{0} and fences of finished batches are
  // complete. A fence never issued by this object is not complete.
  virtual bool IsComplete(Fence fence) = 0;

  // Blocks until the batch is complete or timeout elapses (timeout 0
  // polls, kWaitForever never times out). Returns OK when the copies
  // succeeded, kDeadlineExceeded on timeout (the copies keep running; wait
  // again), the copy error if they failed (reported to every Wait on that
  // fence while the implementation remembers it; a CUDA copy error is
  // sticky for the whole context anyway), and kInvalidArgument for a fence
  // this object never issued. Batches may complete out of submission
  // order: wait for each fence you depend on.
  virtual GpuStatus Wait(Fence fence, std::chrono::nanoseconds timeout) = 0;

  // ---- Synchronous copies ----------------------------------------------
  //
  // Submit + Wait(kWaitForever). Same validation as above.
  GpuStatus CopyToArena(std::span<const HostToArenaCopy> copies) {
    Fence fence;
    GpuStatus status = SubmitToArena(copies, &fence);
    if (!status.ok()) return status;
    return Wait(fence, kWaitForever);
  }
  GpuStatus CopyToHost(std::span<const ArenaToHostCopy> copies) {
    Fence fence;
    GpuStatus status = SubmitToHost(copies, &fence);
    if (!status.ok()) return status;
    return Wait(fence, kWaitForever);
  }

  // Reads arena bytes [offset, offset + size_bytes) into *out (resized),
  // for verification and admin tools. Not for the data path.
  GpuStatus ReadArena(uint64_t offset, uint64_t size_bytes, std::vector<std::byte>* out) {
    if (size_bytes > kMaxHostAllocBytes) {
      return GpuStatus::Error(GpuStatus::kInvalidArgument,
                              "ReadArena: size_bytes above kMaxHostAllocBytes");
    }
    out->resize(static_cast<size_t>(size_bytes));
    const ArenaToHostCopy copy{offset, out->data(), size_bytes};
    GpuStatus status = CopyToHost(std::span<const ArenaToHostCopy>(&copy, 1));
    if (!status.ok()) out->clear();
    return status;
  }

  // ---- Host memory -----------------------------------------------------
  //
  // Allocates size_bytes (1..kMaxHostAllocBytes) of zeroed host memory,
  // page aligned, pinned when the implementation has a GPU. *out is set
  // only on success. kOutOfMemory when the memory is not available.
  virtual GpuStatus AllocHost(uint64_t size_bytes, HostBuffer* out) = 0;

  // Releases a buffer from AllocHost of this object (kInvalidArgument for
  // any other pointer). The caller guarantees no copy still uses it.
  virtual GpuStatus FreeHost(const HostBuffer& buffer) = 0;

  // Pins an existing mapping [ptr, ptr + size_bytes) (e.g. the host tier's
  // shared-memory region) so copies from and to it run at DMA speed.
  // kInvalidArgument for null/empty ranges and ranges overlapping an
  // already registered one or a buffer from AllocHost. Pinning runs without
  // the object's lock: copies and other calls proceed meanwhile. A copy may
  // span several registrations and buffers (it is cut at their boundaries,
  // gpu/host_regions.h). The CPU implementation only records the range.
  virtual GpuStatus RegisterHost(void* ptr, uint64_t size_bytes) = 0;

  // Undoes RegisterHost(ptr, ...); kInvalidArgument if ptr was not
  // registered (or is being unregistered by another call). The range stays
  // known until it is unpinned, and stays registered if unpinning fails.
  // The caller guarantees no copy still uses the range.
  virtual GpuStatus UnregisterHost(void* ptr) = 0;
};

}  // namespace kvtier::gpu

#endif  // KVTIER_GPU_DEVICE_OPS_H_
