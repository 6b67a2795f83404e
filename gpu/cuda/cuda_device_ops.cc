#include "gpu/cuda/cuda_device_ops.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "gpu/cuda/batch_copy.h"
#include "gpu/cuda/cuda_status.h"
#include "gpu/cuda/scoped_device.h"
#include "gpu/host_regions.h"

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
// Idle events kept for reuse; more are destroyed.
constexpr size_t kMaxPooledEvents = 4096;

uint64_t RandomArenaId() {
  std::random_device rd;
  uint64_t id = 0;
  while (id == 0) id = (uint64_t{rd()} << 32) ^ rd();
  return id;
}

}  // namespace

bool CudaDeviceOpsCompiled() { return true; }

struct CudaDeviceOps::Impl {
  // One submitted batch. Shared so that a waiter keeps the event alive while
  // another thread retires the batch; the event goes back to the pool when
  // the last holder lets go.
  struct Batch {
    Impl* owner = nullptr;
    cudaEvent_t event = nullptr;
    ~Batch() {
      if (event != nullptr) owner->ReleaseEvent(event);
    }
  };
  // What a paused stream's host function waits on.
  struct Gate {
    Impl* impl;
    int direction;
  };

  // Constant after construction.
  int device = -1;
  std::byte* base = nullptr;
  cudaStream_t streams[2] = {nullptr, nullptr};  // per CopyDirection
  ArenaInfo info;
  uint32_t max_inflight = 0;
  Gate gates[2] = {{this, 0}, {this, 1}};

  // Cleared for good when the driver refuses cudaMemcpyBatchAsync.
  std::atomic<bool> batch_api{BatchCopyCompiled()};

  std::mutex event_mu;
  std::vector<cudaEvent_t> free_events;  // guarded by event_mu

  std::mutex mu;
  uint64_t issued = 0;                                 // guarded by mu
  uint32_t submitting = 0;                             // guarded by mu
  std::map<uint64_t, std::shared_ptr<Batch>> pending;  // guarded by mu
  std::map<uint64_t, GpuStatus> failed;                // guarded by mu
  HostRegions regions;                                 // guarded by mu

  std::mutex pause_mu;
  std::condition_variable pause_cv;
  bool paused[2] = {false, false};  // guarded by pause_mu

  ~Impl();
  // A reusable event (DisableTiming); the device must be current.
  cudaError_t AcquireEvent(cudaEvent_t* event);
  void ReleaseEvent(cudaEvent_t event);
  // Cuts the copies' host sides at region boundaries and merges what may
  // be merged (gpu/host_regions.h). Takes mu.
  template <typename Copy, typename Addresses>
  std::vector<PlannedCopy> Plan(std::span<const Copy> copies, bool host_is_src,
                                Addresses addresses);
  // The device must be current (callers hold a ScopedDevice).
  GpuStatus Submit(CopyDirection direction, const std::vector<PlannedCopy>& plan, Fence* fence);
  cudaError_t Enqueue(CopyDirection direction, const std::vector<PlannedCopy>& plan);
  // Records the outcome of a finished batch; mu must not be held.
  void Retire(uint64_t fence, const GpuStatus& status);
  // The outstanding batch of `fence` in *batch, or null when it finished
  // well (OK); the batch's error when it failed, InvalidArgument when the
  // fence was never issued. Takes mu.
  GpuStatus PendingBatch(uint64_t fence, std::shared_ptr<Batch>* batch);
  // Retires finished batches among the oldest `limit` outstanding ones (all
  // when limit < 0). Requires mu and the device current.
  void ReapLocked(int limit);
  void Pause(int direction, bool pause);
  static void CUDART_CB BlockWhilePaused(void* gate);
};

CudaDeviceOps::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> lock(pause_mu);
    paused[0] = paused[1] = false;
  }
  pause_cv.notify_all();
  ScopedDevice scoped(device);
  for (cudaStream_t stream : streams) {
    if (stream != nullptr) cudaStreamSynchronize(stream);
  }
  pending.clear();
  for (cudaEvent_t event : free_events) cudaEventDestroy(event);
  free_events.clear();
  regions.ForEach([](void* ptr, uint64_t, HostRegions::Kind kind) {
    if (kind == HostRegions::Kind::kAllocated) {
      cudaFreeHost(ptr);
    } else {
      cudaHostUnregister(ptr);
    }
  });
  if (base != nullptr) cudaFree(base);
  for (cudaStream_t stream : streams) {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
}

cudaError_t CudaDeviceOps::Impl::AcquireEvent(cudaEvent_t* event) {
  {
    std::lock_guard<std::mutex> lock(event_mu);
    if (!free_events.empty()) {
      *event = free_events.back();
      free_events.pop_back();
      return cudaSuccess;
    }
  }
  return cudaEventCreateWithFlags(event, cudaEventDisableTiming);
}

void CudaDeviceOps::Impl::ReleaseEvent(cudaEvent_t event) {
  {
    std::lock_guard<std::mutex> lock(event_mu);
    if (free_events.size() < kMaxPooledEvents) {
      free_events.push_back(event);
      return;
    }
  }
  cudaEventDestroy(event);
}

template <typename Copy, typename Addresses>
std::vector<PlannedCopy> CudaDeviceOps::Impl::Plan(std::span<const Copy> copies, bool host_is_src,
                                                   Addresses addresses) {
  std::vector<PlannedCopy> plan;
  plan.reserve(copies.size());
  std::lock_guard<std::mutex> lock(mu);
  for (const Copy& c : copies) {
    const auto [dst, src] = addresses(c);
    PlanCopy(regions, {dst, src, c.size_bytes, host_is_src}, &plan);
  }
  return plan;
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

GpuStatus CudaDeviceOps::Impl::PendingBatch(uint64_t fence, std::shared_ptr<Batch>* batch) {
  std::lock_guard<std::mutex> lock(mu);
  if (fence > issued) {
    return GpuStatus::Error(GpuStatus::kInvalidArgument,
                            "fence " + std::to_string(fence) + " was never issued");
  }
  auto failed_it = failed.find(fence);
  if (failed_it != failed.end()) return failed_it->second;
  auto it = pending.find(fence);
  if (it != pending.end()) *batch = it->second;
  return GpuStatus::Ok();
}

cudaError_t CudaDeviceOps::Impl::Enqueue(CopyDirection direction,
                                         const std::vector<PlannedCopy>& plan) {
  return EnqueueCopies(plan, direction, device, streams[static_cast<int>(direction)], &batch_api);
}

GpuStatus CudaDeviceOps::Impl::Submit(CopyDirection direction, const std::vector<PlannedCopy>& plan,
                                      Fence* fence) {
  if (plan.empty()) {
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
  batch->owner = this;
  const char* step = "cudaEventCreateWithFlags";
  cudaError_t err = AcquireEvent(&batch->event);
  if (err != cudaSuccess) batch->event = nullptr;
  if (err == cudaSuccess) {
    step = plan.size() > 1 && batch_api.load() ? "cudaMemcpyBatchAsync" : "cudaMemcpyAsync";
    err = Enqueue(direction, plan);
  }
  const cudaStream_t stream = streams[static_cast<int>(direction)];
  if (err == cudaSuccess) {
    step = "cudaEventRecord";
    err = cudaEventRecord(batch->event, stream);
  }
  // Copies queued before the failure still use the caller's memory, which
  // the caller may free once we return: let them finish first.
  if (err != cudaSuccess) cudaStreamSynchronize(stream);
  std::lock_guard<std::mutex> lock(mu);
  --submitting;
  if (err != cudaSuccess) return CudaErrorToGpuStatus(err, step);
  *fence = Fence{++issued};
  pending.emplace(issued, std::move(batch));
  return GpuStatus::Ok();
}

void CUDART_CB CudaDeviceOps::Impl::BlockWhilePaused(void* arg) {
  const Gate* gate = static_cast<const Gate*>(arg);
  Impl* impl = gate->impl;
  std::unique_lock<std::mutex> lock(impl->pause_mu);
  impl->pause_cv.wait(lock, [impl, gate] { return !impl->paused[gate->direction]; });
}

void CudaDeviceOps::Impl::Pause(int direction, bool pause) {
  {
    std::lock_guard<std::mutex> lock(pause_mu);
    if (paused[direction] == pause) return;
    paused[direction] = pause;
  }
  if (!pause) {
    pause_cv.notify_all();
    return;
  }
  ScopedDevice scoped(device);
  cudaLaunchHostFunc(streams[direction], &Impl::BlockWhilePaused, &gates[direction]);
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
  for (size_t i = 0; i < copies.size(); ++i) {
    const HostToArenaCopy& c = copies[i];
    GpuStatus status = CheckCopyRange(i, c.dst_offset, c.size_bytes, c.src, impl_->info.size_bytes);
    if (!status.ok()) return status;
  }
  std::byte* base = impl_->base;
  const std::vector<PlannedCopy> plan =
      impl_->Plan(copies, /*host_is_src=*/true, [base](const HostToArenaCopy& c) {
        return std::pair<void*, const void*>(base + c.dst_offset, c.src);
      });
  ScopedDevice scoped(impl_->device);
  if (scoped.status() != cudaSuccess) return CudaErrorToGpuStatus(scoped.status(), "cudaSetDevice");
  return impl_->Submit(CopyDirection::kToArena, plan, fence);
}

GpuStatus CudaDeviceOps::SubmitToHost(std::span<const ArenaToHostCopy> copies, Fence* fence) {
  if (GpuStatus status = CheckCopyBatchSize(copies.size()); !status.ok()) return status;
  for (size_t i = 0; i < copies.size(); ++i) {
    const ArenaToHostCopy& c = copies[i];
    GpuStatus status = CheckCopyRange(i, c.src_offset, c.size_bytes, c.dst, impl_->info.size_bytes);
    if (!status.ok()) return status;
  }
  std::byte* base = impl_->base;
  const std::vector<PlannedCopy> plan =
      impl_->Plan(copies, /*host_is_src=*/false, [base](const ArenaToHostCopy& c) {
        return std::pair<void*, const void*>(c.dst, base + c.src_offset);
      });
  ScopedDevice scoped(impl_->device);
  if (scoped.status() != cudaSuccess) return CudaErrorToGpuStatus(scoped.status(), "cudaSetDevice");
  return impl_->Submit(CopyDirection::kToHost, plan, fence);
}

bool CudaDeviceOps::IsComplete(Fence fence) {
  if (fence.value == 0) return true;
  ScopedDevice scoped(impl_->device);
  std::shared_ptr<Impl::Batch> batch;
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
  ScopedDevice scoped(impl_->device);
  std::shared_ptr<Impl::Batch> batch;
  if (GpuStatus s = impl_->PendingBatch(fence.value, &batch); !s.ok() || batch == nullptr) {
    return s;
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

GpuStatus CudaDeviceOps::OrderStreamAfter(Fence fence, CUstream_st* stream) {
  if (fence.value == 0) return GpuStatus::Ok();
  ScopedDevice scoped(impl_->device);
  std::shared_ptr<Impl::Batch> batch;
  if (GpuStatus s = impl_->PendingBatch(fence.value, &batch); !s.ok() || batch == nullptr) {
    return s;
  }
  // The wait binds to the event's current record: reusing the event for a
  // later batch afterwards does not change what `stream` waits for.
  return CudaErrorToGpuStatus(cudaStreamWaitEvent(stream, batch->event, 0),
                              "OrderStreamAfter cudaStreamWaitEvent");
}

GpuStatus CudaDeviceOps::OrderCopiesAfter(CUstream_st* stream) {
  ScopedDevice scoped(impl_->device);
  cudaEvent_t event = nullptr;
  cudaError_t err = impl_->AcquireEvent(&event);
  if (err != cudaSuccess) return CudaErrorToGpuStatus(err, "OrderCopiesAfter cudaEventCreate");
  err = cudaEventRecord(event, stream);
  for (cudaStream_t copies : impl_->streams) {
    if (err == cudaSuccess) err = cudaStreamWaitEvent(copies, event, 0);
  }
  impl_->ReleaseEvent(event);
  return CudaErrorToGpuStatus(err, "OrderCopiesAfter");
}

bool CudaDeviceOps::UsesBatchedCopies() const { return impl_->batch_api.load(); }

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
  GpuStatus status;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    status = impl_->regions.AddAllocation(ptr, size_bytes);
  }
  if (!status.ok()) {  // the fresh allocation lies in a range registered here
    ScopedDevice scoped(impl_->device);
    cudaFreeHost(ptr);
    return GpuStatus::Error(GpuStatus::kInternal, "AllocHost: new buffer " + status.message);
  }
  *out = HostBuffer{ptr, size_bytes, /*pinned=*/true};
  return GpuStatus::Ok();
}

GpuStatus CudaDeviceOps::FreeHost(const HostBuffer& buffer) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    uint64_t size_bytes = 0;
    GpuStatus status = impl_->regions.RemoveAllocation(buffer.data, &size_bytes);
    if (!status.ok()) return status;
  }
  ScopedDevice scoped(impl_->device);
  return CudaErrorToGpuStatus(cudaFreeHost(buffer.data), "FreeHost cudaFreeHost");
}

GpuStatus CudaDeviceOps::RegisterHost(void* ptr, uint64_t size_bytes) {
  // Reserve under the lock (overlapping registrations fail at once), pin
  // without it: pinning GiBs takes seconds and copies must go on.
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (GpuStatus status = impl_->regions.BeginRegister(ptr, size_bytes); !status.ok()) {
      return status;
    }
  }
  cudaError_t err = cudaSuccess;
  {
    ScopedDevice scoped(impl_->device);
    err = scoped.status();
    if (err == cudaSuccess) {
      err = cudaHostRegister(ptr, static_cast<size_t>(size_bytes), cudaHostRegisterPortable);
    }
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (err != cudaSuccess) {
    impl_->regions.AbortRegister(ptr);
    return CudaErrorToGpuStatus(err, "RegisterHost cudaHostRegister");
  }
  impl_->regions.CommitRegister(ptr);
  return GpuStatus::Ok();
}

GpuStatus CudaDeviceOps::UnregisterHost(void* ptr) {
  // The range stays known (and refuses overlapping registrations) until it
  // is unpinned; if unpinning fails it stays registered.
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (GpuStatus status = impl_->regions.BeginUnregister(ptr); !status.ok()) return status;
  }
  cudaError_t err = cudaSuccess;
  {
    ScopedDevice scoped(impl_->device);
    err = scoped.status();
    if (err == cudaSuccess) err = cudaHostUnregister(ptr);
  }
  // Not registered with CUDA (any more) is as good as unpinned.
  const bool unpinned = err == cudaSuccess || err == cudaErrorHostMemoryNotRegistered;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->regions.FinishUnregister(ptr, unpinned);
  }
  if (unpinned) return GpuStatus::Ok();
  return CudaErrorToGpuStatus(err, "UnregisterHost cudaHostUnregister");
}

void CudaDeviceOps::PauseCopiesForTesting(bool paused) {
  impl_->Pause(0, paused);
  impl_->Pause(1, paused);
}

void CudaDeviceOps::PauseDirectionForTesting(CopyDirection direction, bool paused) {
  impl_->Pause(static_cast<int>(direction), paused);
}

}  // namespace kvtier::gpu
