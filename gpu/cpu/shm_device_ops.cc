#include "gpu/cpu/shm_device_ops.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>
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
      max_inflight_batches_(options.max_inflight_batches) {
  if (async_copies_) worker_ = std::thread([this] { WorkerLoop(); });
}

ShmDeviceOps::~ShmDeviceOps() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    paused_ = false;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  for (const auto& [ptr, mapped_bytes] : host_allocs_) {
    munmap(ptr, static_cast<size_t>(mapped_bytes));
  }
}


GpuStatus ShmDeviceOps::SubmitToArena(std::span<const HostToArenaCopy> copies,
                                      Fence* fence) {
  if (GpuStatus status = CheckCopyBatchSize(copies.size()); !status.ok()) return status;
  std::vector<Move> moves;
  moves.reserve(copies.size());
  for (size_t i = 0; i < copies.size(); ++i) {
    const HostToArenaCopy& c = copies[i];
    GpuStatus status = CheckCopyRange(i, c.dst_offset, c.size_bytes, c.src, info_.size_bytes);
    if (!status.ok()) return status;
    moves.push_back({file_->data() + c.dst_offset, c.src,
                     static_cast<size_t>(c.size_bytes)});
  }
  return Run(std::move(moves), fence);
}

GpuStatus ShmDeviceOps::SubmitToHost(std::span<const ArenaToHostCopy> copies,
                                     Fence* fence) {
  if (GpuStatus status = CheckCopyBatchSize(copies.size()); !status.ok()) return status;
  std::vector<Move> moves;
  moves.reserve(copies.size());
  for (size_t i = 0; i < copies.size(); ++i) {
    const ArenaToHostCopy& c = copies[i];
    GpuStatus status = CheckCopyRange(i, c.src_offset, c.size_bytes, c.dst, info_.size_bytes);
    if (!status.ok()) return status;
    moves.push_back({c.dst, file_->data() + c.src_offset,
                     static_cast<size_t>(c.size_bytes)});
  }
  return Run(std::move(moves), fence);
}

GpuStatus ShmDeviceOps::Run(std::vector<Move> moves, Fence* fence) {
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
    completed_through_ = issued_;
    return GpuStatus::Ok();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() >= max_inflight_batches_) {
      return GpuStatus::Error(GpuStatus::kUnavailable,
                              "max_inflight_batches (" +
                                  std::to_string(max_inflight_batches_) +
                                  ") copies already queued");
    }
    *fence = Fence{++issued_};
    queue_.emplace_back(issued_, std::move(moves));
  }
  cv_.notify_all();
  return GpuStatus::Ok();
}

void ShmDeviceOps::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stopping_ || (!paused_ && !queue_.empty()); });
    if (queue_.empty()) return;  // stopping_ and drained
    auto [fence, moves] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    for (const Move& m : moves) {
      if (m.size_bytes > 0) std::memcpy(m.dst, m.src, m.size_bytes);
    }
    lock.lock();
    completed_through_ = fence;
    cv_.notify_all();
  }
}

bool ShmDeviceOps::IsComplete(Fence fence) {
  std::lock_guard<std::mutex> lock(mu_);
  return fence.value <= completed_through_;
}

GpuStatus ShmDeviceOps::Wait(Fence fence, std::chrono::nanoseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (fence.value > issued_) {
    return GpuStatus::Error(GpuStatus::kInvalidArgument,
                            "fence " + std::to_string(fence.value) + " was never issued");
  }
  auto done = [&] { return fence.value <= completed_through_; };
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
    return GpuStatus::Error(GpuStatus::kInvalidArgument,
                            "AllocHost size_bytes must be in 1..kMaxHostAllocBytes, got " +
                                std::to_string(size_bytes));
  }
  const uint64_t mapped_bytes = PageRound(size_bytes);
  void* ptr = mmap(nullptr, static_cast<size_t>(mapped_bytes), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (ptr == MAP_FAILED) {
    return ErrnoToGpuStatus(errno, "AllocHost mmap " + std::to_string(mapped_bytes));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    host_allocs_.emplace(ptr, mapped_bytes);
  }
  *out = HostBuffer{ptr, size_bytes, /*pinned=*/false};
  return GpuStatus::Ok();
}

GpuStatus ShmDeviceOps::FreeHost(const HostBuffer& buffer) {
  uint64_t mapped_bytes = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = host_allocs_.find(buffer.data);
    if (it == host_allocs_.end()) {
      return GpuStatus::Error(GpuStatus::kInvalidArgument,
                              "FreeHost: buffer was not allocated by AllocHost");
    }
    mapped_bytes = it->second;
    host_allocs_.erase(it);
  }
  if (munmap(buffer.data, static_cast<size_t>(mapped_bytes)) != 0) {
    return ErrnoToGpuStatus(errno, "FreeHost munmap");
  }
  return GpuStatus::Ok();
}

GpuStatus ShmDeviceOps::RegisterHost(void* ptr, uint64_t size_bytes) {
  if (ptr == nullptr || size_bytes == 0 || size_bytes > kMaxHostAllocBytes) {
    return GpuStatus::Error(GpuStatus::kInvalidArgument,
                            "RegisterHost needs a non-null range of 1..kMaxHostAllocBytes");
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(ptr);
  if (start + size_bytes < start) {
    return GpuStatus::Error(GpuStatus::kInvalidArgument, "RegisterHost range wraps");
  }
  std::lock_guard<std::mutex> lock(mu_);
  // Overlap with the first range starting at or after start, or with the
  // last one starting before it.
  auto next = registered_.lower_bound(start);
  if (next != registered_.end() && next->first < start + size_bytes) {
    return GpuStatus::Error(GpuStatus::kInvalidArgument,
                            "RegisterHost range overlaps a registered range");
  }
  if (next != registered_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > start) {
      return GpuStatus::Error(GpuStatus::kInvalidArgument,
                              "RegisterHost range overlaps a registered range");
    }
  }
  registered_.emplace(start, size_bytes);
  return GpuStatus::Ok();
}

GpuStatus ShmDeviceOps::UnregisterHost(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  if (registered_.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) {
    return GpuStatus::Error(GpuStatus::kInvalidArgument,
                            "UnregisterHost: pointer was not registered");
  }
  return GpuStatus::Ok();
}

void ShmDeviceOps::PauseCopiesForTesting(bool paused) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    paused_ = paused;
  }
  cv_.notify_all();
}

GpuStatus NewShmDeviceOps(const std::string& path, uint64_t size_bytes,
                          const ShmDeviceOpsOptions& options,
                          std::unique_ptr<DeviceOps>* out) {
  std::unique_ptr<ShmDeviceOps> ops;
  GpuStatus status = ShmDeviceOps::Create(path, size_bytes, options, &ops);
  if (status.ok()) *out = std::move(ops);
  return status;
}

}  // namespace kvtier::gpu
