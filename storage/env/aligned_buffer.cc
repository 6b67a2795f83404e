#include "storage/env/aligned_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "storage/common/errno_status.h"

namespace kvtier {

absl::StatusOr<AlignedBuffer> AlignedBuffer::Allocate(uint64_t size_bytes) {
  if (size_bytes == 0) {
    return absl::InvalidArgumentError("AlignedBuffer: size_bytes must be > 0");
  }
  const uint64_t rounded = RoundUpToDirectIo(size_bytes);
  // mmap gives page-aligned, zeroed memory that is never shared with the
  // malloc heap, which suits memory pinned by io_uring registration.
  void* data = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) {
    return ErrnoToStatus(errno, absl::StrCat("mmap of ", rounded, " aligned bytes"));
  }
  return AlignedBuffer(static_cast<uint8_t*>(data), rounded);
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, size_bytes_);
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() {
  if (data_ != nullptr) munmap(data_, size_bytes_);
}

absl::StatusOr<std::unique_ptr<AlignedBufferPool>> AlignedBufferPool::Create(
    uint64_t capacity_bytes) {
  absl::StatusOr<AlignedBuffer> buffer = AlignedBuffer::Allocate(capacity_bytes);
  if (!buffer.ok()) return buffer.status();
  return std::unique_ptr<AlignedBufferPool>(new AlignedBufferPool(std::move(buffer).value()));
}

AlignedBufferPool::AlignedBufferPool(AlignedBuffer buffer)
    : buffer_(std::move(buffer)), allocator_(buffer_.size(), kDirectIoAlignmentBytes) {}

std::optional<absl::Span<uint8_t>> AlignedBufferPool::TryAcquire(uint64_t size_bytes) {
  if (size_bytes == 0 || size_bytes > buffer_.size()) return std::nullopt;
  absl::MutexLock lock(&mu_);
  std::optional<uint64_t> offset = allocator_.Allocate(size_bytes);
  if (!offset.has_value()) return std::nullopt;
  return absl::Span<uint8_t>(buffer_.data() + *offset, RoundUpToDirectIo(size_bytes));
}

absl::Span<uint8_t> AlignedBufferPool::Acquire(uint64_t size_bytes) {
  if (size_bytes == 0 || size_bytes > buffer_.size()) return {};
  const uint64_t rounded = RoundUpToDirectIo(size_bytes);
  absl::MutexLock lock(&mu_);
  // A Condition must have no side effects (absl may evaluate it several
  // times, on other threads), so it only tests for a large enough extent;
  // the allocation happens once the wait is over, still under the lock.
  auto fits = [this, rounded]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return allocator_.largest_free_bytes() >= rounded;
  };
  mu_.Await(absl::Condition(&fits));
  const std::optional<uint64_t> offset = allocator_.Allocate(rounded);
  return absl::Span<uint8_t>(buffer_.data() + *offset, rounded);
}

void AlignedBufferPool::Release(absl::Span<uint8_t> slice) {
  if (slice.empty()) return;
  absl::MutexLock lock(&mu_);
  allocator_.Free(static_cast<uint64_t>(slice.data() - buffer_.data()), slice.size());
}

bool AlignedBufferPool::Contains(const void* data, uint64_t size_bytes) const {
  const auto* begin = static_cast<const uint8_t*>(data);
  return begin >= buffer_.data() && size_bytes <= buffer_.size() &&
         begin - buffer_.data() <= static_cast<ptrdiff_t>(buffer_.size() - size_bytes);
}

uint64_t AlignedBufferPool::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return allocator_.used_bytes();
}

}  // namespace kvtier
