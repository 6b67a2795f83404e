// Page-aligned memory for O_DIRECT and io_uring fixed buffers.
//
//   AlignedBuffer      one owned region (mmap), move-only.
//   AlignedBufferPool  one AlignedBuffer carved into aligned slices with an
//                      ExtentAllocator; register pool.region() with an
//                      IoQueue so slices use fixed-buffer I/O.
#ifndef KVTIER_STORAGE_ENV_ALIGNED_BUFFER_H_
#define KVTIER_STORAGE_ENV_ALIGNED_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "storage/common/extent_allocator.h"
#include "storage/env/env.h"

namespace kvtier {

// Rounds up to a multiple of kDirectIoAlignmentBytes.
inline uint64_t RoundUpToDirectIo(uint64_t size_bytes) {
  return (size_bytes + kDirectIoAlignmentBytes - 1) & ~(kDirectIoAlignmentBytes - 1);
}

// True when address and size both satisfy O_DIRECT alignment.
inline bool IsDirectIoAligned(const void* data, uint64_t size_bytes) {
  return reinterpret_cast<uintptr_t>(data) % kDirectIoAlignmentBytes == 0 &&
         size_bytes % kDirectIoAlignmentBytes == 0;
}

// Zero-initialised, kDirectIoAlignmentBytes-aligned memory. Not thread-safe
// beyond what plain memory is.
class AlignedBuffer {
 public:
  // size_bytes is rounded up to a multiple of 4 KiB; 0 is INVALID_ARGUMENT,
  // an mmap failure RESOURCE_EXHAUSTED.
  static absl::StatusOr<AlignedBuffer> Allocate(uint64_t size_bytes);

  AlignedBuffer() = default;
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_bytes_; }
  absl::Span<uint8_t> span() const { return {data_, size_bytes_}; }

 private:
  AlignedBuffer(uint8_t* data, uint64_t size_bytes) : data_(data), size_bytes_(size_bytes) {}

  uint8_t* data_ = nullptr;
  uint64_t size_bytes_ = 0;
};

// A fixed arena of aligned slices. Thread-safe.
//
// Invariant: the sum of live slices never exceeds capacity_bytes(); a slice
// is returned to the pool exactly once with Release.
class AlignedBufferPool {
 public:
  // capacity_bytes is rounded up to 4 KiB.
  static absl::StatusOr<std::unique_ptr<AlignedBufferPool>> Create(uint64_t capacity_bytes);

  AlignedBufferPool(const AlignedBufferPool&) = delete;
  AlignedBufferPool& operator=(const AlignedBufferPool&) = delete;

  // A slice of RoundUpToDirectIo(size_bytes) bytes, or nullopt when no free
  // extent is large enough now (or size_bytes is 0 or above capacity).
  std::optional<absl::Span<uint8_t>> TryAcquire(uint64_t size_bytes);
  // Like TryAcquire but blocks until space is released. Precondition:
  // 0 < size_bytes <= capacity_bytes() (else it would wait forever; checked,
  // returns an empty span).
  absl::Span<uint8_t> Acquire(uint64_t size_bytes);
  // Returns a slice from TryAcquire/Acquire.
  void Release(absl::Span<uint8_t> slice);

  // True when [data, data + size_bytes) lies inside the arena.
  bool Contains(const void* data, uint64_t size_bytes) const;
  // The whole arena, for IoQueue::RegisterBuffers.
  absl::Span<uint8_t> region() const { return buffer_.span(); }
  uint64_t capacity_bytes() const { return buffer_.size(); }
  uint64_t used_bytes() const;

 private:
  explicit AlignedBufferPool(AlignedBuffer buffer);

  const AlignedBuffer buffer_;
  mutable absl::Mutex mu_;
  ExtentAllocator allocator_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier

#endif  // KVTIER_STORAGE_ENV_ALIGNED_BUFFER_H_
