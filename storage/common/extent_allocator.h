// ExtentAllocator hands out aligned byte ranges of one fixed-size region
// (a host slab, the device arena, an NVMe file). It never touches the region
// itself; it only does the bookkeeping.
//
// Policy: best fit (smallest free extent that fits, lowest offset on ties);
// freed extents coalesce with their neighbours, so a region that is fully
// freed is again one extent.
//
// Thread safety: none. The owner (a tier) serialises calls under its mutex.
#ifndef KVTIER_STORAGE_COMMON_EXTENT_ALLOCATOR_H_
#define KVTIER_STORAGE_COMMON_EXTENT_ALLOCATOR_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace kvtier {

class ExtentAllocator {
 public:
  // capacity_bytes is rounded down to a multiple of alignment_bytes, which
  // must be a power of two.
  ExtentAllocator(uint64_t capacity_bytes, uint64_t alignment_bytes);

  ExtentAllocator(const ExtentAllocator&) = delete;
  ExtentAllocator& operator=(const ExtentAllocator&) = delete;

  // Returns the offset of a free range of RoundUp(size_bytes) bytes, or
  // nullopt when no free extent is large enough (or size_bytes == 0).
  std::optional<uint64_t> Allocate(uint64_t size_bytes);

  // Marks [offset, offset + RoundUp(size_bytes)) used; used when rebuilding
  // from a catalog after a restart. Returns false (and changes nothing) if
  // any part of the range is not free or lies outside the region.
  bool Reserve(uint64_t offset, uint64_t size_bytes);

  // Returns a range obtained from Allocate or Reserve. Freeing a range that
  // is not in use is a programming error (checked with assert).
  void Free(uint64_t offset, uint64_t size_bytes);

  uint64_t RoundUp(uint64_t size_bytes) const {
    return (size_bytes + alignment_bytes_ - 1) & ~(alignment_bytes_ - 1);
  }
  uint64_t capacity_bytes() const { return capacity_bytes_; }
  uint64_t used_bytes() const { return used_bytes_; }
  uint64_t free_bytes() const { return capacity_bytes_ - used_bytes_; }
  uint64_t alignment_bytes() const { return alignment_bytes_; }
  // Largest single allocation that would succeed now.
  uint64_t largest_free_bytes() const;

 private:
  void InsertFree(uint64_t offset, uint64_t length);
  void EraseFree(std::map<uint64_t, uint64_t>::iterator it);

  const uint64_t alignment_bytes_;
  const uint64_t capacity_bytes_;
  uint64_t used_bytes_ = 0;
  std::map<uint64_t, uint64_t> free_by_offset_;             // offset -> length
  std::set<std::pair<uint64_t, uint64_t>> free_by_length_;  // (length, offset)
};

}  // namespace kvtier

#endif  // KVTIER_STORAGE_COMMON_EXTENT_ALLOCATOR_H_
