#include "storage/host/host_tier.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "storage/host/gpu_status.h"

namespace kvtier {
namespace {

// A random start in [1, 2^62] leaves room for 2^62 allocations before the
// counter could wrap, and makes generations of different runs unlikely to
// meet.
uint64_t RandomFirstGeneration() {
  std::random_device rd;
  const uint64_t r = (uint64_t{rd()} << 32) ^ rd();
  return (r & ((uint64_t{1} << 62) - 1)) + 1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostTier>> HostTier::Open(const HostTierOptions& options) {
  const uint64_t align = options.alignment_bytes;
  if (align == 0 || (align & (align - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host tier alignment_bytes must be a power of two, got ", align));
  }
  if (options.capacity_bytes == 0 || options.capacity_bytes % align != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host tier capacity_bytes must be a nonzero multiple of alignment_bytes (",
                     align, "), got ", options.capacity_bytes));
  }
  if (options.capacity_bytes > gpu::kMaxShmFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("host tier capacity_bytes above ", gpu::kMaxShmFileBytes));
  }
  std::unique_ptr<gpu::ShmFile> file;
  absl::Status created =
      GpuToStatus(gpu::ShmFile::Create(options.path, options.capacity_bytes, options.file, &file));
  if (!created.ok()) return created;
  if (options.device_ops != nullptr) {
    absl::Status pinned =
        GpuToStatus(options.device_ops->RegisterHost(file->data(), file->size_bytes()));
    if (!pinned.ok()) return pinned;
  }
  return std::unique_ptr<HostTier>(
      new HostTier(std::move(file), options.device_ops, align, RandomFirstGeneration()));
}

HostTier::HostTier(std::unique_ptr<gpu::ShmFile> file, gpu::DeviceOps* pinned_by,
                   uint64_t alignment_bytes, uint64_t first_generation)
    : file_(std::move(file)),
      pinned_by_(pinned_by),
      allocator_(file_->size_bytes(), alignment_bytes),
      next_generation_(first_generation) {}

HostTier::~HostTier() {
  if (pinned_by_ != nullptr) {
    // Nothing to do with a failure here: the mapping goes away next.
    (void)pinned_by_->UnregisterHost(file_->data());
  }
}

absl::StatusOr<HostSlot> HostTier::Allocate(uint64_t size_bytes) {
  if (size_bytes == 0) {
    return absl::InvalidArgumentError("host slot size_bytes must be > 0");
  }
  absl::MutexLock lock(&mu_);
  if (size_bytes > allocator_.capacity_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("host slot size_bytes ", size_bytes,
                                                   " exceeds host tier capacity ",
                                                   allocator_.capacity_bytes()));
  }
  std::optional<uint64_t> offset = allocator_.Allocate(size_bytes);
  if (!offset.has_value()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "host tier full: need ", allocator_.RoundUp(size_bytes), " bytes, largest free extent ",
        allocator_.largest_free_bytes(), " of ", allocator_.free_bytes(), " free"));
  }
  const HostSlot slot{*offset, size_bytes, next_generation_++};
  slots_.emplace(slot.offset, SlotState{slot.size_bytes, slot.generation});
  return slot;
}

bool HostTier::IsLiveLocked(const HostSlot& slot) const {
  mu_.AssertReaderHeld();  // shared: IsLive and Data read under a reader lock
  auto it = slots_.find(slot.offset);
  return it != slots_.end() && it->second.size_bytes == slot.size_bytes &&
         it->second.generation == slot.generation;
}

absl::Status HostTier::Free(const HostSlot& slot) {
  absl::MutexLock lock(&mu_);
  if (!IsLiveLocked(slot)) {
    return absl::FailedPreconditionError(absl::StrCat("host slot (offset ", slot.offset, ", size ",
                                                      slot.size_bytes, ", generation ",
                                                      slot.generation, ") is not live"));
  }
  slots_.erase(slot.offset);
  allocator_.Free(slot.offset, slot.size_bytes);
  return absl::OkStatus();
}

bool HostTier::IsLive(const HostSlot& slot) const {
  absl::ReaderMutexLock lock(&mu_);
  return IsLiveLocked(slot);
}

absl::StatusOr<std::span<std::byte>> HostTier::Data(const HostSlot& slot) const {
  absl::ReaderMutexLock lock(&mu_);
  if (!IsLiveLocked(slot)) {
    return absl::FailedPreconditionError(absl::StrCat("host slot (offset ", slot.offset, ", size ",
                                                      slot.size_bytes, ", generation ",
                                                      slot.generation, ") is not live"));
  }
  return std::span<std::byte>(file_->data() + slot.offset, static_cast<size_t>(slot.size_bytes));
}

HostTierStats HostTier::stats() const {
  absl::ReaderMutexLock lock(&mu_);
  HostTierStats s;
  s.capacity_bytes = allocator_.capacity_bytes();
  s.used_bytes = allocator_.used_bytes();
  s.live_slots = slots_.size();
  s.largest_free_bytes = allocator_.largest_free_bytes();
  return s;
}

}  // namespace kvtier
