#include "gpu/cpu/shm_device_ops.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

namespace kvtier::gpu {
namespace {

uint64_t RandomArenaId() {
  std::random_device rd;
  uint64_t id = 0;
  while (id == 0) id = (uint64_t{rd()} << 32) ^ rd();
  return id;
}

uint64_t PageRound(uint64_t size_bytes) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return (size_bytes + page - 1) / page * page;
}

// Waits beyond a year are treated as forever: steady_clock::now() + timeout
// must not overflow.
constexpr std::chrono::nanoseconds kLongestFiniteWait = std::chrono::hours(24 * 365);

}  // namespace

GpuStatus ShmDeviceOps::Create(const std::string& path, uint64_t size_bytes,
                               const ShmDeviceOpsOptions& options,
                               std::unique_ptr<ShmDeviceOps>* out) {
  if (options.max_inflight_batches == 0 || options.max_inflight_batches > 1'000'000) {
    return GpuStatus::Error(GpuStatus::kInvalidArgument,
                            "max_inflight_batches must be in 1..1000000");
  }
  std::unique_ptr<ShmFile> file;
  GpuStatus status = ShmFile::Create(path, size_bytes, options.file, &file);
  if (!status.ok()) return status;
  ArenaInfo info;
  info.arena_id = options.arena_id != 0 ? options.arena_id : RandomArenaId();
  info.size_bytes = size_bytes;
  info.backend = kShmArenaBackend;
  info.shm_path = path;
  out->reset(new ShmDeviceOps(std::move(file), std::move(info), options));
  return GpuStatus::Ok();
}

ShmDeviceOps::ShmDeviceOps(std::unique_ptr<ShmFile> file, ArenaInfo info,
                           const ShmDeviceOpsOptions& options)
    : file_(std::move(file)),
      info_(std::move(info)),
      async_copies_(options.async_copies),
      out_of_order_(options.async_copies && options.out_of_order),
      max_inflight_batches_(options.max_inflight_batches) {
  if (!async_copies_) return;
  for (int q = 0; q < (out_of_order_ ? 2 : 1); ++q) {
    workers_.emplace_back([this, q] { WorkerLoop(q); });
  }
}

ShmDeviceOps::~ShmDeviceOps() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    paused_[0] = paused_[1] = false;
  }
  cv_.notify_all();
  for (std::thread& worker : workers_) worker.join();
  for (const auto& [ptr, mapped_bytes] : mapped_bytes_) {
    munmap(ptr, static_cast<size_t>(mapped_bytes));
  }
}

GpuStatus ShmDeviceOps::SubmitToArena(std::span<const HostToArenaCopy> copies, Fence* fence) {
  if (GpuStatus status = CheckCopyBatchSize(copies.size()); !status.ok()) return status;
  std::vector<Move> moves;
  moves.reserve(copies.size());
  for (size_t i = 0; i < copies.size(); ++i) {
    const HostToArenaCopy& c = copies[i];
    GpuStatus status = CheckCopyRange(i, c.dst_offset, c.size_bytes, c.src, info_.size_bytes);
    if (!status.ok()) return status;
    moves.push_back({file_->data() + c.dst_offset, c.src, static_cast<size_t>(c.size_bytes)});
  }
  return Run(CopyDirection::kToArena, std::move(moves), fence);
}

GpuStatus ShmDeviceOps::SubmitToHost(std::span<const ArenaToHostCopy> copies, Fence* fence) {
  if (GpuStatus status = CheckCopyBatchSize(copies.size()); !status.ok()) return status;
  std::vector<Move> moves;
  moves.reserve(copies.size());
  for (size_t i = 0; i < copies.size(); ++i) {
    const ArenaToHostCopy& c = copies[i];
    GpuStatus status = CheckCopyRange(i, c.src_offset, c.size_bytes, c.dst, info_.size_bytes);
    if (!status.ok()) return status;
    moves.push_back({c.dst, file_->data() + c.src_offset, static_cast<size_t>(c.size_bytes)});
  }
  return Run(CopyDirection::kToHost, std::move(moves), fence);
}

GpuStatus ShmDeviceOps::Run(CopyDirection direction, std::vector<Move> moves, Fence* fence) {
  if (moves.empty()) {
    *fence = Fence{0};
    return GpuStatus::Ok();
  }
  if (!async_copies_) {
    // The copy is finished before its fence exists, so every issued fence
    // is complete even when concurrent submitters finish out of order.
    for (const Move& m : moves) {
      if (m.size_bytes > 0) std::memcpy(m.dst, m.src, m.size_bytes);
    }
    std::lock_guard<std::mutex> lock(mu_);
    *fence = Fence{++issued_};
    return GpuStatus::Ok();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (incomplete_.size() >= max_inflight_batches_) {
      return GpuStatus::Error(GpuStatus::kUnavailable, "max_inflight_batches (" +
                                                           std::to_string(max_inflight_batches_) +
                                                           ") copies already queued");
    }
    *fence = Fence{++issued_};
    incomplete_.insert(issued_);
    const int q = out_of_order_ && direction == CopyDirection::kToHost ? 1 : 0;
    queues_[q].push_back(Batch{issued_, direction, std::move(moves)});
  }
  cv_.notify_all();
  return GpuStatus::Ok();
}

bool ShmDeviceOps::Runnable(int q) const {
  return !queues_[q].empty() && !paused_[static_cast<int>(queues_[q].front().direction)];
}

void ShmDeviceOps::WorkerLoop(int q) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this, q] { return stopping_ || Runnable(q); });
    if (queues_[q].empty()) return;  // stopping_ and drained
    Batch batch = std::move(queues_[q].front());
    queues_[q].pop_front();
    lock.unlock();
    for (const Move& m : batch.moves) {
      if (m.size_bytes > 0) std::memcpy(m.dst, m.src, m.size_bytes);
    }
    lock.lock();
    incomplete_.erase(batch.fence);
    cv_.notify_all();
  }
}

bool ShmDeviceOps::IsComplete(Fence fence) {
  std::lock_guard<std::mutex> lock(mu_);
  return fence.value <= issued_ && incomplete_.count(fence.value) == 0;
}

GpuStatus ShmDeviceOps::Wait(Fence fence, std::chrono::nanoseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (fence.value > issued_) {
    return GpuStatus::Error(GpuStatus::kInvalidArgument,
                            "fence " + std::to_string(fence.value) + " was never issued");
  }
  auto done = [&] { return incomplete_.count(fence.value) == 0; };
  if (timeout > kLongestFiniteWait) {
    cv_.wait(lock, done);
    return GpuStatus::Ok();
  }
  if (!cv_.wait_for(lock, timeout, done)) {
    return GpuStatus::Error(GpuStatus::kDeadlineExceeded,
                            "fence " + std::to_string(fence.value) + " not complete");
  }
  return GpuStatus::Ok();
}

GpuStatus ShmDeviceOps::AllocHost(uint64_t size_bytes, HostBuffer* out) {
  if (size_bytes == 0 || size_bytes > kMaxHostAllocBytes) {
    return GpuStatus::Error(
        GpuStatus::kInvalidArgument,
        "AllocHost size_bytes must be in 1..kMaxHostAllocBytes, got " + std::to_string(size_bytes));
  }
  const uint64_t mapped_bytes = PageRound(size_bytes);
  void* ptr = mmap(nullptr, static_cast<size_t>(mapped_bytes), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (ptr == MAP_FAILED) {
    return ErrnoToGpuStatus(errno, "AllocHost mmap " + std::to_string(mapped_bytes));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    GpuStatus status = regions_.AddAllocation(ptr, mapped_bytes);
    if (!status.ok()) {  // a fresh mapping overlaps a registered range
      munmap(ptr, static_cast<size_t>(mapped_bytes));
      return GpuStatus::Error(GpuStatus::kInternal, "AllocHost: new mapping " + status.message);
    }
    mapped_bytes_.emplace(ptr, mapped_bytes);
  }
  *out = HostBuffer{ptr, size_bytes, /*pinned=*/false};
  return GpuStatus::Ok();
}

GpuStatus ShmDeviceOps::FreeHost(const HostBuffer& buffer) {
  uint64_t mapped_bytes = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (GpuStatus status = regions_.RemoveAllocation(buffer.data, &mapped_bytes); !status.ok()) {
      return status;
    }
    mapped_bytes_.erase(buffer.data);
  }
  if (munmap(buffer.data, static_cast<size_t>(mapped_bytes)) != 0) {
    return ErrnoToGpuStatus(errno, "FreeHost munmap");
  }
  return GpuStatus::Ok();
}

GpuStatus ShmDeviceOps::RegisterHost(void* ptr, uint64_t size_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  GpuStatus status = regions_.BeginRegister(ptr, size_bytes);
  if (status.ok()) regions_.CommitRegister(ptr);  // nothing to pin
  return status;
}

GpuStatus ShmDeviceOps::UnregisterHost(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  GpuStatus status = regions_.BeginUnregister(ptr);
  if (status.ok()) regions_.FinishUnregister(ptr, /*unpinned=*/true);
  return status;
}

void ShmDeviceOps::PauseCopiesForTesting(bool paused) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    paused_[0] = paused_[1] = paused;
  }
  cv_.notify_all();
}

void ShmDeviceOps::PauseDirectionForTesting(CopyDirection direction, bool paused) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    paused_[static_cast<int>(direction)] = paused;
  }
  cv_.notify_all();
}

GpuStatus NewShmDeviceOps(const std::string& path, uint64_t size_bytes,
                          const ShmDeviceOpsOptions& options, std::unique_ptr<DeviceOps>* out) {
  std::unique_ptr<ShmDeviceOps> ops;
  GpuStatus status = ShmDeviceOps::Create(path, size_bytes, options, &ops);
  if (status.ok()) *out = std::move(ops);
  return status;
}

}  // namespace kvtier::gpu
