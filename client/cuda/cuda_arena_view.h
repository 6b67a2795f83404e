// Client-side view of the daemon's CUDA arena: opens the arena's IPC handle
// once, on the local device whose UUID matches the daemon's, and turns block
// handles (arena_id, offset, size_bytes) into device pointers that kernels
// of this process can read.
//
// Depends only on the C++ standard library and the CUDA runtime. The
// descriptor comes from OpenArena (proto OpenArenaResponse / gpu ArenaInfo).
//
// Lifetime: the mapping lives until the view is destroyed
// (cudaIpcCloseMemHandle). A block's bytes are only meaningful while the
// daemon's lease on the block holds. When the daemon restarts its arena has
// a new arena_id: Block() refuses handles of any other arena_id, and the
// client must Open the new descriptor.
//
// The process must not be the one that exported the handle (CUDA refuses to
// open an IPC handle in its own process).
//
// Thread safety: all methods are const and may be called concurrently.
#ifndef KVTIER_CLIENT_CUDA_CUDA_ARENA_VIEW_H_
#define KVTIER_CLIENT_CUDA_CUDA_ARENA_VIEW_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>

namespace kvtier::client {

// What a client needs to open the daemon's CUDA arena.
struct CudaArenaDescriptor {
  uint64_t arena_id = 0;    // nonzero
  uint64_t size_bytes = 0;  // > 0
  std::string ipc_handle;   // raw cudaIpcMemHandle_t, exactly 64 bytes
  // The daemon's device: 16 raw bytes (cudaDeviceProp::uuid), or text as
  // accepted by ParseDeviceUuid.
  std::string device_uuid;
};

using DeviceUuid = std::array<uint8_t, 16>;

// Accepts 16 raw bytes, 32 hex digits, or the nvidia-smi form
// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (the "GPU-" prefix and dashes
// optional). False on anything else.
bool ParseDeviceUuid(const std::string& text, DeviceUuid* out);
// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", lower-case hex.
std::string FormatDeviceUuid(const DeviceUuid& uuid);

// A device range of the arena.
struct DeviceRange {
  void* data = nullptr;  // device pointer, on the view's device
  uint64_t size_bytes = 0;
};

class CudaArenaView {
 public:
  // Finds the visible device with the descriptor's UUID and opens the IPC
  // handle there (cudaIpcMemLazyEnablePeerAccess). On failure returns null
  // and stores a message naming the cause in *error: malformed descriptor,
  // no visible device with that UUID (e.g. hidden by CUDA_VISIBLE_DEVICES),
  // or the CUDA error of cudaIpcOpenMemHandle.
  static std::unique_ptr<CudaArenaView> Open(const CudaArenaDescriptor& descriptor,
                                             std::string* error);

  CudaArenaView(const CudaArenaView&) = delete;
  CudaArenaView& operator=(const CudaArenaView&) = delete;
  // Closes the IPC mapping on its device. Device pointers from Block()
  // become invalid.
  ~CudaArenaView();

  uint64_t arena_id() const { return arena_id_; }
  uint64_t size_bytes() const { return size_bytes_; }
  // Local ordinal of the device holding the arena (may differ from the
  // daemon's ordinal when the processes see different device orders).
  int device_ordinal() const { return device_ordinal_; }
  void* base() const { return base_; }

  // The device range of block handle (arena_id, offset, size_bytes), or an
  // empty range with *error set when arena_id is not this arena's ("stale
  // arena: reopen") or [offset, offset + size_bytes) is empty or outside
  // the arena (overflow-safe). The handle's generation is the daemon's to
  // check (leases); the view does not see it.
  DeviceRange Block(uint64_t arena_id, uint64_t offset, uint64_t size_bytes,
                    std::string* error) const;

 private:
  CudaArenaView(uint64_t arena_id, uint64_t size_bytes, int device_ordinal, void* base)
      : arena_id_(arena_id),
        size_bytes_(size_bytes),
        device_ordinal_(device_ordinal),
        base_(base) {}

  const uint64_t arena_id_;
  const uint64_t size_bytes_;
  const int device_ordinal_;
  void* const base_;
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_CUDA_CUDA_ARENA_VIEW_H_
