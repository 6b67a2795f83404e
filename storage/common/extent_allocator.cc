#include "storage/common/extent_allocator.h"

#include <cassert>
#include <iterator>

namespace kvtier {

ExtentAllocator::ExtentAllocator(uint64_t capacity_bytes, uint64_t alignment_bytes)
    : alignment_bytes_(alignment_bytes), capacity_bytes_(capacity_bytes & ~(alignment_bytes - 1)) {
  assert(alignment_bytes != 0 && (alignment_bytes & (alignment_bytes - 1)) == 0);
  if (capacity_bytes_ > 0) InsertFree(0, capacity_bytes_);
}

void ExtentAllocator::InsertFree(uint64_t offset, uint64_t length) {
  free_by_offset_.emplace(offset, length);
  free_by_length_.emplace(length, offset);
}

void ExtentAllocator::EraseFree(std::map<uint64_t, uint64_t>::iterator it) {
  free_by_length_.erase({it->second, it->first});
  free_by_offset_.erase(it);
}

std::optional<uint64_t> ExtentAllocator::Allocate(uint64_t size_bytes) {
  if (size_bytes == 0) return std::nullopt;
  const uint64_t length = RoundUp(size_bytes);
  auto fit = free_by_length_.lower_bound({length, 0});
  if (fit == free_by_length_.end()) return std::nullopt;
  const uint64_t extent_length = fit->first;
  const uint64_t offset = fit->second;
  EraseFree(free_by_offset_.find(offset));
  if (extent_length > length) InsertFree(offset + length, extent_length - length);
  used_bytes_ += length;
  return offset;
}

bool ExtentAllocator::Reserve(uint64_t offset, uint64_t size_bytes) {
  const uint64_t length = RoundUp(size_bytes);
  if (length == 0 || offset % alignment_bytes_ != 0 || offset > capacity_bytes_ ||
      length > capacity_bytes_ - offset) {
    return false;
  }
  // The free extent containing offset is the last one starting at or before it.
  auto it = free_by_offset_.upper_bound(offset);
  if (it == free_by_offset_.begin()) return false;
  --it;
  const uint64_t start = it->first;
  const uint64_t end = it->first + it->second;
  if (offset + length > end) return false;
  EraseFree(it);
  if (offset > start) InsertFree(start, offset - start);
  if (offset + length < end) InsertFree(offset + length, end - (offset + length));
  used_bytes_ += length;
  return true;
}

void ExtentAllocator::Free(uint64_t offset, uint64_t size_bytes) {
  uint64_t length = RoundUp(size_bytes);
  assert(length <= used_bytes_);
  used_bytes_ -= length;
  auto next = free_by_offset_.lower_bound(offset);
  assert(next == free_by_offset_.end() || next->first >= offset + length);
  if (next != free_by_offset_.end() && next->first == offset + length) {
    length += next->second;
    auto victim = next++;
    EraseFree(victim);
  }
  if (next != free_by_offset_.begin()) {
    auto prev = std::prev(next);
    assert(prev->first + prev->second <= offset);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      length += prev->second;
      EraseFree(prev);
    }
  }
  InsertFree(offset, length);
}

uint64_t ExtentAllocator::largest_free_bytes() const {
  return free_by_length_.empty() ? 0 : free_by_length_.rbegin()->first;
}

}  // namespace kvtier
