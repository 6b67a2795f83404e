// The CPU implementation of DeviceOps ("shm-arena"): the device arena is a
// shared-memory file that the daemon maps read-write and clients map
// read-only (client/shm/shm_mapping.h), so every device-tier path runs on
// machines without a GPU.
//
// Copies are memcpy. By default they run inside Submit* (fences are
// complete when returned). With async_copies one worker thread runs the
// batches in submission order, which models a single CUDA stream: callers
// that read a destination before waiting for its fence see it fail in
// tests. With out_of_order as well, each direction has its own worker (as
// CUDA has a stream per direction), so a fence of one direction may complete
// before an earlier fence of the other: callers that order a demotion and a
// promotion of the same slot by submission order alone see it fail in tests
// (device_ops.h, Ordering).
//
// Host memory: AllocHost is an anonymous mmap (never pinned); RegisterHost
// records the range (overlaps with registrations and AllocHost buffers are
// refused, like cudaHostRegister) and pins nothing.
//
// Thread safety: all methods may be called concurrently.
#ifndef KVTIER_GPU_CPU_SHM_DEVICE_OPS_H_
#define KVTIER_GPU_CPU_SHM_DEVICE_OPS_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gpu/cpu/shm_file.h"
#include "gpu/device_ops.h"
#include "gpu/host_regions.h"

namespace kvtier::gpu {

inline constexpr char kShmArenaBackend[] = "shm-arena";

struct ShmDeviceOpsOptions {
  uint64_t arena_id = 0;  // 0: a random nonzero id
  ShmFileOptions file;    // how the arena file is created and removed
  // Run copies on a worker thread instead of inside Submit*.
  bool async_copies = false;
  // With async_copies: one worker per direction; fences of different
  // directions complete in any order.
  bool out_of_order = false;
  // Submit* returns kUnavailable while this many batches are queued
  // (async_copies only). 1..1'000'000.
  uint32_t max_inflight_batches = 1024;
};

class ShmDeviceOps final : public DeviceOps {
 public:
  // Creates the arena file at path (e.g. "/dev/shm/kvtier-arena") with
  // exactly size_bytes bytes of zeros and maps it. *out is set only on
  // success.
  static GpuStatus Create(const std::string& path, uint64_t size_bytes,
                          const ShmDeviceOpsOptions& options, std::unique_ptr<ShmDeviceOps>* out);

  // Finishes every queued copy, then unmaps (and by default removes) the
  // arena file and releases AllocHost buffers still outstanding.
  ~ShmDeviceOps() override;

  const ArenaInfo& arena() const override { return info_; }
  std::span<std::byte> HostMapping() const override {
    return {file_->data(), static_cast<size_t>(file_->size_bytes())};
  }
  GpuStatus SubmitToArena(std::span<const HostToArenaCopy> copies, Fence* fence) override;
  GpuStatus SubmitToHost(std::span<const ArenaToHostCopy> copies, Fence* fence) override;
  bool IsComplete(Fence fence) override;
  GpuStatus Wait(Fence fence, std::chrono::nanoseconds timeout) override;
  GpuStatus AllocHost(uint64_t size_bytes, HostBuffer* out) override;
  GpuStatus FreeHost(const HostBuffer& buffer) override;
  GpuStatus RegisterHost(void* ptr, uint64_t size_bytes) override;
  GpuStatus UnregisterHost(void* ptr) override;

  // While paused the workers start no batch (async_copies only), so tests
  // can observe incomplete fences and Wait timeouts deterministically.
  void PauseCopiesForTesting(bool paused);
  // Pauses one direction only. With out_of_order the other direction keeps
  // running; without it batches of both directions share one queue, so a
  // paused batch at its head holds back everything behind it.
  void PauseDirectionForTesting(CopyDirection direction, bool paused);

 private:
  struct Move {
    void* dst;
    const void* src;
    size_t size_bytes;
  };
  struct Batch {
    uint64_t fence;
    CopyDirection direction;
    std::vector<Move> moves;
  };

  ShmDeviceOps(std::unique_ptr<ShmFile> file, ArenaInfo info, const ShmDeviceOpsOptions& options);

  GpuStatus Run(CopyDirection direction, std::vector<Move> moves, Fence* fence);
  // Worker for queue q (0: both directions, or to-arena with out_of_order;
  // 1: to-host with out_of_order).
  void WorkerLoop(int q);
  bool Runnable(int q) const;  // requires mu_

  // Constant after construction.
  const std::unique_ptr<ShmFile> file_;
  const ArenaInfo info_;
  const bool async_copies_;
  const bool out_of_order_;
  const uint32_t max_inflight_batches_;

  // Fences are issued 1, 2, ...; fence f is complete iff f <= issued_ and f
  // is not in incomplete_ (the queued and running batches).
  std::mutex mu_;
  std::condition_variable cv_;              // any change of the fields below
  uint64_t issued_ = 0;                     // guarded by mu_
  std::set<uint64_t> incomplete_;           // guarded by mu_
  std::deque<Batch> queues_[2];             // guarded by mu_
  bool paused_[2] = {false, false};         // per CopyDirection; guarded by mu_
  bool stopping_ = false;                   // guarded by mu_
  HostRegions regions_;                     // guarded by mu_
  std::map<void*, uint64_t> mapped_bytes_;  // AllocHost ptr -> mmap size; mu_
  std::vector<std::thread> workers_;        // 1 (or 2 with out_of_order) iff async
};

// Same as ShmDeviceOps::Create, returning the interface.
GpuStatus NewShmDeviceOps(const std::string& path, uint64_t size_bytes,
                          const ShmDeviceOpsOptions& options, std::unique_ptr<DeviceOps>* out);

}  // namespace kvtier::gpu

#endif  // KVTIER_GPU_CPU_SHM_DEVICE_OPS_H_
