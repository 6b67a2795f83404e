// Plain records the block store keeps under its mutex (BlockStoreImpl,
// block_store_impl.h). Internal to storage/store; no behaviour, no locking
// of their own: BlockStoreImpl's mu_ guards every instance it holds.
#ifndef KVTIER_STORAGE_STORE_STORE_RECORDS_H_
#define KVTIER_STORAGE_STORE_STORE_RECORDS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu/device_ops.h"
#include "storage/catalog/records.h"
#include "storage/common/extent_allocator.h"
#include "storage/host/host_tier.h"
#include "storage/nvme/nvme_tier.h"
#include "storage/store/block_store_types.h"
#include "storage/store/entry.h"

namespace kvtier::store_internal {

// What InsertNewLocked's fill wrote: the payload's checksum and summary.
struct FilledCopy {
  uint64_t checksum = 0;
  std::string summary;
  bool summary_deferred = false;  // to the summary thread (defer_summaries)
};

// The memory clients map: a device arena with its slot allocator and a
// staging file. One shared space in single-tenant mode; one per tenant
// (created on first use) in multi-tenant mode.
struct MemorySpace {
  gpu::DeviceOps* device = nullptr;
  std::unique_ptr<gpu::DeviceOps> owned_device;
  std::unique_ptr<ExtentAllocator> device_alloc;
  uint64_t capacity_bytes = 0;
  HostTier* staging = nullptr;
  std::unique_ptr<HostTier> owned_staging;
};

// Limits and what a tenant holds.
struct TenantState {
  TenantLimits limits;
  TenantUsage usage;
  // Copies being written without mu_ (a put's host copy, a promotion, a
  // persist), counted against the quota before they land so concurrent
  // writers of one tenant cannot overshoot it together.
  uint64_t host_in_flight = 0;
  uint64_t nvme_in_flight = 0;
  // Count-type quotas taken by calls that drop mu_ before their insert
  // (a profile's catalog write, a lease's promotions): counted as used
  // until the call ends, so concurrent calls cannot pass the quota together.
  uint64_t profiles_pending = 0;
  uint64_t leases_pending = 0;
};

// A staging slot handed out by ReserveSlots, until its put or deadline.
struct StagingReservation {
  HostSlot slot;
  std::string tenant;
  uint64_t profile_id = 0;
  uint64_t deadline_micros = 0;
  HostTier* staging = nullptr;  // the file the slot lives in
};

// One persist's write, done without the store's mutex while the entry is
// busy: what PersistLocked snapshots under the mutex (in) and what the write
// found and did (out).
struct PersistWrite {
  BlockKey key;                          // in
  BlockRecord record;                    // in: the entry's record
  uint64_t size = 0;                     // in
  std::optional<HostSlot> host;          // in: read from when set
  std::optional<DeviceSlot> device;      // in: read from otherwise
  gpu::DeviceOps* device_ops = nullptr;  // in: the device copy's arena
  std::vector<uint8_t> device_copy;      // out: the device copy's bytes
  const uint8_t* src = nullptr;          // out: the copy's bytes (size)
  bool intact = false;                   // out: src matched record.checksum
  absl::Status status;                   // out: the persist's outcome
  absl::StatusOr<NvmeLocation> loc = absl::UnknownError("not written");  // out
  absl::Status freed;  // out: not OK when loc could not be freed after a failure
};

// NVMe extents of evicted blocks, in eviction order (tickets never
// decrease), each freed once catalog_->synced_through() >= its ticket.
struct PendingFree {
  NvmeLocation location;
  uint64_t ticket = 0;  // catalog_->writes_done() after the removal
  BlockKey key;
  uint64_t size_bytes = 0;
};

}  // namespace kvtier::store_internal

#endif  // KVTIER_STORAGE_STORE_STORE_RECORDS_H_
