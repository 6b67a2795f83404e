// HostTier: the host DRAM tier. One region of memory, backed by a shared-
// memory file, carved into block slots by an ExtentAllocator with a hard
// capacity.
//
// The file backing is what makes the zero-copy put path work:
//   1. the daemon Allocates a slot and hands (offset, size_bytes,
//      generation) plus a descriptor of the file (OpenDescriptor) to the
//      client;
//   2. the client maps it read-write (client/shm/shm_mapping.h,
//      ShmStagingFile) and writes the block into the slot;
//   3. the client names the slot in its put; the daemon checks IsLive(slot),
//      verifies the checksum over Data(slot), and from then on the slot is
//      the block's host copy. Nothing is copied.
// A client can still write into a slot after handing it over: the block
// store must checksum (or copy) at the moment it trusts the bytes.
//
// Generations: every Allocate gets a new generation, distinct from every
// earlier one of this tier and (seeded at random) very likely from those of
// earlier daemon runs, so a slot reference kept after Free is detected as
// stale instead of aliasing the next block in that place.
//
// Thread safety: all methods may be called concurrently. The bytes of a
// slot are not protected: the caller (the block store, with its leases)
// makes sure nobody reads or writes a slot after freeing it.
#ifndef KVTIER_STORAGE_HOST_HOST_TIER_H_
#define KVTIER_STORAGE_HOST_HOST_TIER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gpu/cpu/shm_file.h"
#include "gpu/device_ops.h"
#include "storage/common/extent_allocator.h"

namespace kvtier {

struct HostTierOptions {
  std::string path;                 // backing file, e.g. "/dev/shm/kvtier-host"
  uint64_t capacity_bytes = 0;      // hard limit; a multiple of alignment_bytes
  uint64_t alignment_bytes = 4096;  // slot alignment, a power of two; 4096
                                    // lets NVMe O_DIRECT I/O use slots as is
  gpu::ShmFileOptions file;         // creation mode, replace/unlink policy
  // When set, the whole region is pinned with RegisterHost at Open and
  // unpinned when the tier dies. Must outlive the tier.
  gpu::DeviceOps* device_ops = nullptr;
};

// A slot handed out by Allocate. Plain value; compare all three fields.
struct HostSlot {
  uint64_t offset = 0;      // within the region (and the backing file)
  uint64_t size_bytes = 0;  // as requested (the slot may be larger by
                            // rounding up to alignment_bytes)
  uint64_t generation = 0;  // never 0 for a slot from Allocate
};

struct HostTierStats {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;  // including alignment rounding
  uint64_t live_slots = 0;
  uint64_t largest_free_bytes = 0;  // largest Allocate that would succeed
};

class HostTier {
 public:
  // Creates and maps the backing file. INVALID_ARGUMENT naming the field
  // for a bad option; RESOURCE_EXHAUSTED when the memory is not there.
  static absl::StatusOr<std::unique_ptr<HostTier>> Open(const HostTierOptions& options);

  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;
  // Unpins and unmaps the region (removing the file unless configured
  // otherwise). Every slot dies with it.
  ~HostTier();

  // A new slot of size_bytes (1..capacity_bytes). RESOURCE_EXHAUSTED when
  // no free extent is large enough (capacity or fragmentation).
  absl::StatusOr<HostSlot> Allocate(uint64_t size_bytes);

  // Returns a live slot. FAILED_PRECONDITION if slot is not live (already
  // freed, never allocated, or a different size/generation).
  absl::Status Free(const HostSlot& slot);

  // True iff slot is exactly a live slot (offset, size_bytes, generation).
  bool IsLive(const HostSlot& slot) const;

  // The slot's size_bytes bytes, writable. FAILED_PRECONDITION if the slot
  // is not live. The span is valid until the slot is freed.
  absl::StatusOr<std::span<std::byte>> Data(const HostSlot& slot) const;

  HostTierStats stats() const;

  // The backing file's path, or for a sealed file (options.file.sealed,
  // how staging tiers are made) only its name.
  const std::string& path() const { return file_->path(); }
  // A new descriptor of the backing file for a client (see
  // gpu::ShmFile::OpenDescriptor): -1 with errno set on failure.
  int OpenDescriptor(bool writable) const { return file_->OpenDescriptor(writable); }
  bool sealed() const { return file_->sealed(); }
  // The whole region, e.g. to register it with io_uring.
  std::span<std::byte> region() const {
    return {file_->data(), static_cast<size_t>(file_->size_bytes())};
  }

 private:
  struct SlotState {
    uint64_t size_bytes;
    uint64_t generation;
  };

  HostTier(std::unique_ptr<gpu::ShmFile> file, gpu::DeviceOps* pinned_by, uint64_t alignment_bytes,
           uint64_t first_generation);
  bool IsLiveLocked(const HostSlot& slot) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const std::unique_ptr<gpu::ShmFile> file_;
  gpu::DeviceOps* const pinned_by_;  // null when the region is not pinned

  mutable absl::Mutex mu_;
  ExtentAllocator allocator_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, SlotState> slots_ ABSL_GUARDED_BY(mu_);  // by offset
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier

#endif  // KVTIER_STORAGE_HOST_HOST_TIER_H_
