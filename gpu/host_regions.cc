#include "gpu/host_regions.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <string>

namespace kvtier::gpu {
namespace {

GpuStatus Invalid(std::string message) {
  return GpuStatus::Error(GpuStatus::kInvalidArgument, std::move(message));
}

uintptr_t Address(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr); }

}  // namespace

GpuStatus HostRegions::CheckFree(uintptr_t start, uint64_t size_bytes) const {
  auto next = regions_.lower_bound(start);
  if (next != regions_.end() && next->first - start < size_bytes) {
    return Invalid(next->second.kind == Kind::kAllocated ? "range overlaps a buffer from AllocHost"
                                                         : "range overlaps a registered range");
  }
  if (next != regions_.begin()) {
    auto prev = std::prev(next);
    if (start - prev->first < prev->second.size_bytes) {
      return Invalid(prev->second.kind == Kind::kAllocated
                         ? "range overlaps a buffer from AllocHost"
                         : "range overlaps a registered range");
    }
  }
  return GpuStatus::Ok();
}

GpuStatus HostRegions::AddAllocation(const void* ptr, uint64_t size_bytes) {
  const uintptr_t start = Address(ptr);
  if (ptr == nullptr || size_bytes == 0 || start + size_bytes < start) {
    return Invalid("AddAllocation needs a non-null, non-empty range");
  }
  if (GpuStatus status = CheckFree(start, size_bytes); !status.ok()) return status;
  regions_.emplace(start, Region{size_bytes, Kind::kAllocated, State::kActive});
  return GpuStatus::Ok();
}

GpuStatus HostRegions::RemoveAllocation(const void* ptr, uint64_t* size_bytes) {
  auto it = regions_.find(Address(ptr));
  if (it == regions_.end() || it->second.kind != Kind::kAllocated) {
    return Invalid("FreeHost: buffer was not allocated by AllocHost");
  }
  *size_bytes = it->second.size_bytes;
  regions_.erase(it);
  return GpuStatus::Ok();
}

GpuStatus HostRegions::BeginRegister(const void* ptr, uint64_t size_bytes) {
  if (ptr == nullptr || size_bytes == 0 || size_bytes > kMaxHostAllocBytes) {
    return Invalid("RegisterHost needs a non-null range of 1..kMaxHostAllocBytes");
  }
  const uintptr_t start = Address(ptr);
  if (start + size_bytes < start) return Invalid("RegisterHost range wraps");
  if (GpuStatus status = CheckFree(start, size_bytes); !status.ok()) {
    return Invalid("RegisterHost " + status.message);
  }
  regions_.emplace(start, Region{size_bytes, Kind::kRegistered, State::kPinning});
  return GpuStatus::Ok();
}

void HostRegions::CommitRegister(const void* ptr) {
  auto it = regions_.find(Address(ptr));
  if (it != regions_.end() && it->second.state == State::kPinning) {
    it->second.state = State::kActive;
  }
}

void HostRegions::AbortRegister(const void* ptr) {
  auto it = regions_.find(Address(ptr));
  if (it != regions_.end() && it->second.state == State::kPinning) regions_.erase(it);
}

GpuStatus HostRegions::BeginUnregister(const void* ptr) {
  auto it = regions_.find(Address(ptr));
  if (it == regions_.end() || it->second.kind != Kind::kRegistered ||
      it->second.state != State::kActive) {
    return Invalid("UnregisterHost: pointer was not registered");
  }
  it->second.state = State::kUnpinning;
  return GpuStatus::Ok();
}

void HostRegions::FinishUnregister(const void* ptr, bool unpinned) {
  auto it = regions_.find(Address(ptr));
  if (it == regions_.end() || it->second.state != State::kUnpinning) return;
  if (unpinned) {
    regions_.erase(it);
  } else {
    it->second.state = State::kActive;
  }
}

uint64_t HostRegions::RegionOf(uintptr_t address, uintptr_t* end) const {
  auto next = regions_.upper_bound(address);
  if (next != regions_.begin()) {
    auto holder = std::prev(next);
    const uintptr_t start = holder->first;
    if (address - start < holder->second.size_bytes) {
      *end = start + holder->second.size_bytes;
      // Ranges being pinned or unpinned are no copy's business.
      if (holder->second.state == State::kActive) return start;
      return 0;
    }
  }
  *end = next == regions_.end() ? std::numeric_limits<uintptr_t>::max() : next->first;
  return 0;
}

void PlanCopy(const HostRegions& regions, const CopyToPlan& copy, std::vector<PlannedCopy>* plan) {
  auto* d = static_cast<std::byte*>(copy.dst);
  const auto* s = static_cast<const std::byte*>(copy.src);
  uint64_t size_bytes = copy.size_bytes;
  const bool host_is_src = copy.host_is_src;
  while (size_bytes > 0) {
    const uintptr_t host = reinterpret_cast<uintptr_t>(host_is_src ? static_cast<const void*>(s)
                                                                   : static_cast<const void*>(d));
    uintptr_t end = 0;
    const uint64_t region = regions.RegionOf(host, &end);
    const uint64_t piece = std::min<uint64_t>(size_bytes, end - host);
    if (!plan->empty()) {
      PlannedCopy& last = plan->back();
      if (region != 0 && last.region == region &&
          static_cast<std::byte*>(last.dst) + last.size_bytes == d &&
          static_cast<const std::byte*>(last.src) + last.size_bytes == s) {
        last.size_bytes += piece;
        d += piece;
        s += piece;
        size_bytes -= piece;
        continue;
      }
    }
    plan->push_back(PlannedCopy{d, s, piece, region});
    d += piece;
    s += piece;
    size_bytes -= piece;
  }
}

}  // namespace kvtier::gpu
