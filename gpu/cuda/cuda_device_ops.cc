#include "gpu/cuda/cuda_device_ops.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "gpu/cuda/cuda_status.h"

namespace kvtier::gpu {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == 64, "ArenaInfo documents 64 handle bytes");
static_assert(sizeof(cudaUUID_t) == 16, "ArenaInfo documents 16 UUID bytes");

// Failed fences remembered for Wait; older failures are forgotten (their
// Wait then reports OK-or-sticky-error from the context, see device_ops.h).
constexpr size_t kMaxRememberedFailures = 4096;
// Waits beyond a year are treated as forever (no deadline overflow).
constexpr std::chrono::nanoseconds kLongestFiniteWait = std::chrono::hours(24 * 365);
constexpr std::chrono::microseconds kMaxPollSleep{200};
constexpr int kPollYields = 32;
// Submit* checks this many of the oldest outstanding batches for completion
// so that callers that never wait do not run into the in-flight limit.
constexpr int kReapPerSubmit = 4;

uint64_t RandomArenaId() {
  std::random_device rd;
  uint64_t id = 0;
  while (id == 0) id = (uint64_t{rd()} << 32) ^ rd();
  return id;
}

// Makes `device` current for one scope and restores the previous device.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) {
      status_ = cudaSetDevice(device);
    }
  }
  ~ScopedDevice() {
    if (previous_ >= 0 && status_ == cudaSuccess) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

// One submitted batch. Shared so that a waiter keeps the event alive while
// another thread retires the batch.
struct Batch {
  cudaEvent_t event = nullptr;
  ~Batch() {
    if (event != nullptr) cudaEventDestroy(event);
  }
};

// A copy after merging adjacent ones.
struct Move {
  void* dst;
  const void* src;
  size_t size_bytes;
};

void AppendMerged(std::vector<Move>* moves, void* dst, const void* src, uint64_t size_bytes) {
  if (size_bytes == 0) return;
  if (!moves->empty()) {
    Move& last = moves->back();
    if (static_cast<std::byte*>(last.dst) + last.size_bytes == dst &&
        static_cast<const std::byte*>(last.src) + last.size_bytes == src) {
      last.size_bytes += static_cast<size_t>(size_bytes);
      return;
    }
  }
  moves->push_back({dst, src, static_cast<size_t>(size_bytes)});
}

}  // namespace

bool CudaDeviceOpsCompiled() { return true; }

struct CudaDeviceOps::Impl {
  enum Direction { kToArena = 0, kToHost = 1 };

  // Constant after construction.
  int device = -1;
  std::byte* base = nullptr;
  cudaStream_t streams[2] = {nullptr, nullptr};
  ArenaInfo info;
  uint32_t max_inflight = 0;

  std::mutex mu;
  uint64_t issued = 0;                                 // guarded by mu
  uint32_t submitting = 0;                             // guarded by mu
  std::map<uint64_t, std::shared_ptr<Batch>> pending;  // guarded by mu
  std::map<uint64_t, GpuStatus> failed;                // guarded by mu
  std::map<void*, uint64_t> host_allocs;               // guarded by mu
  std::map<uintptr_t, uint64_t> registered;            // guarded by mu

  std::mutex pause_mu;
  std::condition_variable pause_cv;
  bool paused = false;  // guarded by pause_mu

  ~Impl();
  GpuStatus Submit(Direction direction, const std::vector<Move>& moves, Fence* fence);
  // Records the outcome of a finished batch; mu must not be held.
  void Retire(uint64_t fence, const GpuStatus& status);
  // Retires finished batches among the oldest `limit` outstanding ones (all
  // when limit < 0). Requires mu.
  void ReapLocked(int limit);
  static void CUDART_CB BlockWhilePaused(void* impl);
};

CudaDeviceOps::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> lock(pause_mu);
    paused = false;
  }
  pause_cv.notify_all();
  ScopedDevice scoped(device);
  for (cudaStream_t stream : streams) {
    if (stream != nullptr) cudaStreamSynchronize(stream);
  }
  pending.clear();
  for (const auto& [ptr, size_bytes] : host_allocs) cudaFreeHost(ptr);
  for (const auto& [start, size_bytes] : registered) {
    cudaHostUnregister(reinterpret_cast<void*>(start));
  }
  if (base != nullptr) cudaFree(base);
  for (cudaStream_t stream : streams) {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
}


void CudaDeviceOps::Impl::ReapLocked(int limit) {
  int checked = 0;
  for (auto it = pending.begin(); it != pending.end();) {
    if (limit >= 0 && checked++ >= limit) break;
    const cudaError_t err = cudaEventQuery(it->second->event);
    if (err == cudaErrorNotReady) {
      ++it;
      continue;
    }
    if (err != cudaSuccess) {
      if (failed.size() >= kMaxRememberedFailures) failed.erase(failed.begin());
      failed.emplace(it->first,
                     CudaErrorToGpuStatus(err, "copy batch " + std::to_string(it->first)));
    }
    it = pending.erase(it);
  }
}

void CudaDeviceOps::Impl::Retire(uint64_t fence, const GpuStatus& status) {
  std::lock_guard<std::mutex> lock(mu);
  if (pending.erase(fence) == 0) return;  // another thread retired it
  if (!status.ok()) {
    if (failed.size() >= kMaxRememberedFailures) failed.erase(failed.begin());
    failed.emplace(fence, status);
  }
}

GpuStatus CudaDeviceOps::Impl::Submit(Direction direction, const std::vector<Move>& moves,
                                      Fence* fence) {
  if (moves.empty()) {
    *fence = Fence{0};
    return GpuStatus::Ok();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    ReapLocked(kReapPerSubmit);
    if (pending.size() + submitting >= max_inflight) ReapLocked(-1);
    if (pending.size() + submitting >= max_inflight) {
      return GpuStatus::Error(GpuStatus::kUnavailable, "max_inflight_batches (" +
                                                           std::to_string(max_inflight) +
                                                           ") copy batches already outstanding");
    }
    ++submitting;
  }
  auto batch = std::make_shared<Batch>();
  cudaError_t err = cudaSuccess;
  const char* step = "cudaSetDevice";
  {
    ScopedDevice scoped(device);
    err = scoped.status();
    if (err == cudaSuccess) {
      step = "cudaEventCreateWithFlags";
      err = cudaEventCreateWithFlags(&batch->event, cudaEventDisableTiming);
    }
    const cudaStream_t stream = streams[direction];
    const cudaMemcpyKind kind =
        direction == kToArena ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    for (size_t i = 0; err == cudaSuccess && i < moves.size(); ++i) {
      step = "cudaMemcpyAsync";
      err = cudaMemcpyAsync(moves[i].dst, moves[i].src, moves[i].size_bytes, kind, stream);
    }
    if (err == cudaSuccess) {
      step = "cudaEventRecord";
      err = cudaEventRecord(batch->event, stream);
    }
    // Copies queued before the failure still use the caller's memory, which
    // the caller may free once we return: let them finish first.
    if (err != cudaSuccess) cudaStreamSynchronize(stream);
  }
  std::lock_guard<std::mutex> lock(mu);
  --submitting;
  if (err != cudaSuccess) return CudaErrorToGpuStatus(err, step);
  *fence = Fence{++issued};
  pending.emplace(issued, std::move(batch));
  return GpuStatus::Ok();
}

void CUDART_CB CudaDeviceOps::Impl::BlockWhilePaused(void* arg) {
  Impl* impl = static_cast<Impl*>(arg);
  std::unique_lock<std::mutex> lock(impl->pause_mu);
  impl->pause_cv.wait(lock, [impl] { return !impl->paused; });
}

GpuStatus CudaDeviceOps::Create(const CudaDeviceOpsOptions& options,
                                std::unique_ptr<CudaDeviceOps>* out) {
  GpuStatus valid = ValidateCudaDeviceOpsOptions(options);
  if (!valid.ok()) return valid;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return CudaErrorToGpuStatus(err, "cudaGetDeviceCount");
  if (options.device_ordinal >= count) {
    return GpuStatus::Error(count == 0 ? GpuStatus::kUnavailable : GpuStatus::kInvalidArgument,
                            "device_ordinal " + std::to_string(options.device_ordinal) + " but " +
                                std::to_string(count) + " CUDA devices are visible");
  }

  auto impl = std::make_unique<Impl>();
  impl->device = options.device_ordinal;
  impl->max_inflight = options.max_inflight_batches;
  ScopedDevice scoped(impl->device);
  if (scoped.status() != cudaSuccess) return CudaErrorToGpuStatus(scoped.status(), "cudaSetDevice");

  cudaDeviceProp prop{};
  err = cudaGetDeviceProperties(&prop, impl->device);
  if (err != cudaSuccess) return CudaErrorToGpuStatus(err, "cudaGetDeviceProperties");
  for (cudaStream_t& stream : impl->streams) {
    err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) return CudaErrorToGpuStatus(err, "cudaStreamCreateWithFlags");
  }
  void* base = nullptr;
  err = cudaMalloc(&base, static_cast<size_t>(options.arena_bytes));
  if (err != cudaSuccess) {
    return CudaErrorToGpuStatus(
        err, "cudaMalloc arena of " + std::to_string(options.arena_bytes) + " bytes");
  }
  impl->base = static_cast<std::byte*>(base);
  // cudaMalloc does not promise zeroed memory; an arena never shows bytes
  // that were not written through it.
  err = cudaMemset(base, 0, static_cast<size_t>(options.arena_bytes));
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) return CudaErrorToGpuStatus(err, "cudaMemset arena");
  cudaIpcMemHandle_t handle;
  err = cudaIpcGetMemHandle(&handle, base);
  if (err != cudaSuccess) return CudaErrorToGpuStatus(err, "cudaIpcGetMemHandle");

  ArenaInfo& info = impl->info;
  info.arena_id = options.arena_id != 0 ? options.arena_id : RandomArenaId();
  info.size_bytes = options.arena_bytes;
  info.backend = "cuda:" + std::to_string(impl->device);
  info.ipc_handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  info.device_uuid.assign(reinterpret_cast<const char*>(&prop.uuid), sizeof(prop.uuid));
  info.device_ordinal = impl->device;
  out->reset(new CudaDeviceOps(std::move(impl)));
  return GpuStatus::Ok();
}

CudaDeviceOps::CudaDeviceOps(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CudaDeviceOps::~CudaDeviceOps() = default;

const ArenaInfo& CudaDeviceOps::arena() const { return impl_->info; }

void* CudaDeviceOps::arena_base() const { return impl_->base; }

GpuStatus CudaDeviceOps::SubmitToArena(std::span<const HostToArenaCopy> copies, Fence* fence) {
  if (GpuStatus status = CheckCopyBatchSize(copies.size()); !status.ok()) return status;
  std::vector<Move> moves;
  moves.reserve(copies.size());
  for (size_t i = 0; i < copies.size(); ++i) {
    const HostToArenaCopy& c = copies[i];
    GpuStatus status = CheckCopyRange(i, c.dst_offset, c.size_bytes, c.src, impl_->info.size_bytes);
    if (!status.ok()) return status;
    AppendMerged(&moves, impl_->base + c.dst_offset, c.src, c.size_bytes);
  }
  return impl_->Submit(Impl::kToArena, moves, fence);
}

GpuStatus CudaDeviceOps::SubmitToHost(std::span<const ArenaToHostCopy> copies, Fence* fence) {
  if (GpuStatus status = CheckCopyBatchSize(copies.size()); !status.ok()) return status;
  std::vector<Move> moves;
  moves.reserve(copies.size());
  for (size_t i = 0; i < copies.size(); ++i) {
    const ArenaToHostCopy& c = copies[i];
    GpuStatus status = CheckCopyRange(i, c.src_offset, c.size_bytes, c.dst, impl_->info.size_bytes);
    if (!status.ok()) return status;
    AppendMerged(&moves, c.dst, impl_->base + c.src_offset, c.size_bytes);
  }
  return impl_->Submit(Impl::kToHost, moves, fence);
}

bool CudaDeviceOps::IsComplete(Fence fence) {
  if (fence.value == 0) return true;
  std::shared_ptr<Batch> batch;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (fence.value > impl_->issued) return false;
    auto it = impl_->pending.find(fence.value);
    if (it == impl_->pending.end()) return true;
    batch = it->second;
  }
  const cudaError_t err = cudaEventQuery(batch->event);
  if (err == cudaErrorNotReady) return false;
  impl_->Retire(fence.value,
                CudaErrorToGpuStatus(err, "copy batch " + std::to_string(fence.value)));
  return true;
}

GpuStatus CudaDeviceOps::Wait(Fence fence, std::chrono::nanoseconds timeout) {
  if (fence.value == 0) return GpuStatus::Ok();
  std::shared_ptr<Batch> batch;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (fence.value > impl_->issued) {
      return GpuStatus::Error(GpuStatus::kInvalidArgument,
                              "fence " + std::to_string(fence.value) + " was never issued");
    }
    auto failed = impl_->failed.find(fence.value);
    if (failed != impl_->failed.end()) return failed->second;
    auto it = impl_->pending.find(fence.value);
    if (it == impl_->pending.end()) return GpuStatus::Ok();
    batch = it->second;
  }
  const std::string context = "copy batch " + std::to_string(fence.value);
  cudaError_t err = cudaSuccess;
  if (timeout > kLongestFiniteWait) {
    err = cudaEventSynchronize(batch->event);
  } else {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::chrono::microseconds sleep{2};
    for (int polls = 0;; ++polls) {
      err = cudaEventQuery(batch->event);
      if (err != cudaErrorNotReady) break;
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        return GpuStatus::Error(GpuStatus::kDeadlineExceeded,
                                "fence " + std::to_string(fence.value) + " not complete");
      }
      if (polls < kPollYields) {
        std::this_thread::yield();
        continue;
      }
      std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(sleep, deadline - now));
      sleep = std::min(sleep * 2, kMaxPollSleep);
    }
  }
  GpuStatus status = CudaErrorToGpuStatus(err, context);
  impl_->Retire(fence.value, status);
  return status;
}

GpuStatus CudaDeviceOps::AllocHost(uint64_t size_bytes, HostBuffer* out) {
  if (size_bytes == 0 || size_bytes > kMaxHostAllocBytes) {
    return GpuStatus::Error(
        GpuStatus::kInvalidArgument,
        "AllocHost size_bytes must be in 1..kMaxHostAllocBytes, got " + std::to_string(size_bytes));
  }
  void* ptr = nullptr;
  {
    ScopedDevice scoped(impl_->device);
    const cudaError_t err =
        cudaHostAlloc(&ptr, static_cast<size_t>(size_bytes), cudaHostAllocPortable);
    if (err != cudaSuccess) {
      return CudaErrorToGpuStatus(err, "AllocHost cudaHostAlloc " + std::to_string(size_bytes));
    }
  }
  std::memset(ptr, 0, static_cast<size_t>(size_bytes));
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->host_allocs.emplace(ptr, size_bytes);
  }
  *out = HostBuffer{ptr, size_bytes, /*pinned=*/true};
  return GpuStatus::Ok();
}

GpuStatus CudaDeviceOps::FreeHost(const HostBuffer& buffer) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->host_allocs.erase(buffer.data) == 0) {
      return GpuStatus::Error(GpuStatus::kInvalidArgument,
                              "FreeHost: buffer was not allocated by AllocHost");
    }
  }
  ScopedDevice scoped(impl_->device);
  return CudaErrorToGpuStatus(cudaFreeHost(buffer.data), "FreeHost cudaFreeHost");
}

GpuStatus CudaDeviceOps::RegisterHost(void* ptr, uint64_t size_bytes) {
  if (ptr == nullptr || size_bytes == 0 || size_bytes > kMaxHostAllocBytes) {
    return GpuStatus::Error(GpuStatus::kInvalidArgument,
                            "RegisterHost needs a non-null range of 1..kMaxHostAllocBytes");
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(ptr);
  if (start + size_bytes < start) {
    return GpuStatus::Error(GpuStatus::kInvalidArgument, "RegisterHost range wraps");
  }
  // The overlap check and the registration happen under one lock so two
  // overlapping registrations cannot both pass the check.
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto next = impl_->registered.lower_bound(start);
  if (next != impl_->registered.end() && next->first < start + size_bytes) {
    return GpuStatus::Error(GpuStatus::kInvalidArgument,
                            "RegisterHost range overlaps a registered range");
  }
  if (next != impl_->registered.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > start) {
      return GpuStatus::Error(GpuStatus::kInvalidArgument,
                              "RegisterHost range overlaps a registered range");
    }
  }
  ScopedDevice scoped(impl_->device);
  const cudaError_t err =
      cudaHostRegister(ptr, static_cast<size_t>(size_bytes), cudaHostRegisterPortable);
  if (err != cudaSuccess) return CudaErrorToGpuStatus(err, "RegisterHost cudaHostRegister");
  impl_->registered.emplace(start, size_bytes);
  return GpuStatus::Ok();
}

GpuStatus CudaDeviceOps::UnregisterHost(void* ptr) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->registered.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == impl_->registered.end()) {
    return GpuStatus::Error(GpuStatus::kInvalidArgument,
                            "UnregisterHost: pointer was not registered");
  }
  impl_->registered.erase(it);
  ScopedDevice scoped(impl_->device);
  return CudaErrorToGpuStatus(cudaHostUnregister(ptr), "UnregisterHost cudaHostUnregister");
}

void CudaDeviceOps::PauseCopiesForTesting(bool paused) {
  {
    std::lock_guard<std::mutex> lock(impl_->pause_mu);
    if (impl_->paused == paused) return;
    impl_->paused = paused;
  }
  if (!paused) {
    impl_->pause_cv.notify_all();
    return;
  }
  ScopedDevice scoped(impl_->device);
  for (cudaStream_t stream : impl_->streams) {
    cudaLaunchHostFunc(stream, &Impl::BlockWhilePaused, impl_.get());
  }
}

}  // namespace kvtier::gpu
