// HostRegions: the host memory a DeviceOps knows about (its AllocHost
// buffers and RegisterHost ranges), and how a batch's host ranges are cut
// into copies that each stay inside one of them.
//
// Why: CUDA treats a pinned range (cudaHostAlloc, cudaHostRegister) as one
// allocation. A single cudaMemcpyAsync whose host side runs from one pinned
// range into the next, or from a pinned range into pageable memory, is
// refused, so a batch would fail part-way after earlier copies were queued.
// PlanCopy therefore splits a copy at every region boundary and merges two
// copies only when the host side of both lies in the same region. Memory
// outside every known region (pageable, or pinned by someone else) is never
// merged: each such copy stays as the caller gave it.
//
// Registration is two-phase so that pinning (which takes ~1 s per 10 GiB)
// can run without the owner's lock: BeginRegister reserves the range
// (overlapping requests fail at once), then the owner pins without the lock
// and calls CommitRegister or AbortRegister. Unregistration marks the range
// first (BeginUnregister), unpins without the lock, then FinishUnregister
// drops it, or restores it when unpinning failed.
//
// Errors: kInvalidArgument naming what overlapped or was not found.
//
// Thread safety: not synchronised; the owning DeviceOps holds its mutex
// around every call.
#ifndef KVTIER_GPU_HOST_REGIONS_H_
#define KVTIER_GPU_HOST_REGIONS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "gpu/device_ops.h"

namespace kvtier::gpu {

class HostRegions {
 public:
  enum class Kind : uint8_t { kAllocated, kRegistered };
  enum class State : uint8_t { kPinning, kActive, kUnpinning };

  // A buffer from AllocHost; kInvalidArgument if it overlaps a region.
  GpuStatus AddAllocation(const void* ptr, uint64_t size_bytes);
  // Removes the allocation starting at ptr and returns its size;
  // kInvalidArgument when ptr starts no allocation.
  GpuStatus RemoveAllocation(const void* ptr, uint64_t* size_bytes);

  // Reserves [ptr, ptr + size_bytes) as a registration being pinned.
  // kInvalidArgument for null/empty/wrapping ranges, sizes above
  // kMaxHostAllocBytes, and overlaps with any region (in any state).
  GpuStatus BeginRegister(const void* ptr, uint64_t size_bytes);
  void CommitRegister(const void* ptr);  // kPinning -> kActive
  void AbortRegister(const void* ptr);   // drops a kPinning reservation

  // Marks the active registration starting at ptr as being unpinned;
  // kInvalidArgument when ptr starts no active registration.
  GpuStatus BeginUnregister(const void* ptr);
  // Drops it (unpinned) or makes it active again (unpinning failed).
  void FinishUnregister(const void* ptr, bool unpinned);

  // Every region still known (for the owner's destructor).
  template <typename Fn>  // fn(void* ptr, uint64_t size_bytes, Kind kind)
  void ForEach(Fn fn) const {
    for (const auto& [start, region] : regions_) {
      fn(reinterpret_cast<void*>(start), region.size_bytes, region.kind);
    }
  }

  // Identifies the region holding host byte `address`: a nonzero value
  // shared by every byte of that region, 0 outside all regions; *end is set
  // to the first byte past the region (outside: the start of the next
  // region, or UINTPTR_MAX). Regions being pinned or unpinned count as
  // outside (no copy may use them).
  uint64_t RegionOf(uintptr_t address, uintptr_t* end) const;

  size_t size() const { return regions_.size(); }

 private:
  struct Region {
    uint64_t size_bytes;
    Kind kind;
    State state;
  };
  GpuStatus CheckFree(uintptr_t start, uint64_t size_bytes) const;

  std::map<uintptr_t, Region> regions_;  // start -> region, non-overlapping
};

// One copy as queued on the device: dst and src as the copy engine sees
// them (one of them is an arena address).
struct PlannedCopy {
  void* dst = nullptr;
  const void* src = nullptr;
  uint64_t size_bytes = 0;
  uint64_t region = 0;  // HostRegions::RegionOf of the host side, 0 unknown
};

// One copy to plan: size_bytes bytes from src to dst, the host side being
// src (host_is_src) or dst.
struct CopyToPlan {
  void* dst = nullptr;
  const void* src = nullptr;
  uint64_t size_bytes = 0;
  bool host_is_src = false;
};

// Appends `copy` to *plan: cut at every region boundary of its host range,
// and each piece merged into the previous planned copy when both sides
// continue it and the host side is in the same known region. Empty copies
// add nothing.
void PlanCopy(const HostRegions& regions, const CopyToPlan& copy, std::vector<PlannedCopy>* plan);

}  // namespace kvtier::gpu

#endif  // KVTIER_GPU_HOST_REGIONS_H_
