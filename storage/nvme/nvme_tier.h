// NvmeTier: the durable tier. Blocks live in a fixed set of preallocated
// files (directory/nvme-000.dat ...), read and written with O_DIRECT through
// io_uring, one ring per I/O thread, with registered (fixed) buffers.
//
// Contract:
//  - Capacity is num_files * file_size_bytes, a hard limit. Space is handed
//    out in multiples of alignment_bytes (4 KiB) per file (ExtentAllocator,
//    best fit). A block never spans files.
//  - Write stores a payload and returns its location (file, offset,
//    payload length). A payload whose size is not a multiple of 4 KiB is
//    padded with zeros on disk; the location keeps the payload length.
//  - A written block is durable only after a later Sync() returned OK.
//  - Read verifies the XXH3-64 of the bytes read against the caller's
//    checksum (computed with NvmeChecksum at put time and kept in the
//    catalog) and never hands back wrong bytes: on any error `out` is
//    zero-filled; a mismatch is DATA_LOSS naming the location.
//  - The tier does not remember what it stored across restarts: after
//    reopening, the owner (the catalog) calls Reserve for every live block
//    before writing new ones, then RemoveOrphanFiles.
//
// Errors: bad arguments INVALID_ARGUMENT naming the field; tier full
// RESOURCE_EXHAUSTED naming the capacity; ENOSPC RESOURCE_EXHAUSTED; EIO
// INTERNAL naming file, offset and length; checksum mismatch DATA_LOSS.
//
// Thread safety: all methods are thread-safe and block the calling thread
// until their I/O finished. Allocation bookkeeping is under one mutex held
// only for bookkeeping, never across I/O. I/O runs on io_threads worker
// threads, each owning one io_uring; a call's requests are spread over the
// workers round-robin, while copying, hashing and waiting happen on the
// calling thread. Sync calls are serialised.
//
// Buffers: a payload or `out` span that is 4 KiB-aligned with a size that is
// a multiple of 4 KiB is transferred in place (zero copy); other spans go
// through an aligned staging pool (staging_bytes) with one memcpy. Both
// the staging pool and options.registered_regions are registered with
// every ring, so in-place I/O on those regions uses READ_FIXED/WRITE_FIXED.
#ifndef KVTIER_STORAGE_NVME_NVME_TIER_H_
#define KVTIER_STORAGE_NVME_NVME_TIER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "storage/common/extent_allocator.h"
#include "storage/common/locked_stats.h"
#include "storage/env/aligned_buffer.h"
#include "storage/env/env.h"
#include "storage/nvme/io_worker.h"

namespace kvtier {

struct NvmeTierOptions {
  // Directory of the tier's files; created if missing. The tier owns every
  // file named nvme-*; other entries are left alone.
  std::string directory;
  uint32_t num_files = 4;                        // 1..1000
  uint64_t file_size_bytes = uint64_t{1} << 30;  // multiple of alignment
  uint64_t alignment_bytes = 4096;               // must be 4096
  uint32_t queue_depth = 32;                     // per ring, 1..4096
  uint32_t io_threads = 2;                       // rings, 1..64
  // O_DIRECT. If the file system refuses it, Open fails with
  // FAILED_PRECONDITION suggesting use_odirect = false (page-cache I/O,
  // e.g. for tests on odd file systems).
  bool use_odirect = true;
  // Largest payload accepted by Write, 1 byte..staging_bytes.
  uint64_t max_block_bytes = uint64_t{16} << 20;
  // Aligned staging memory for spans that cannot be transferred in place.
  uint64_t staging_bytes = uint64_t{64} << 20;
  // Caller memory (e.g. the host tier's slab) to register with every ring;
  // must stay mapped while the tier is open. Registration failure (e.g.
  // RLIMIT_MEMLOCK) is not fatal: stats().registered_buffers says false and
  // I/O uses ordinary buffers.
  std::vector<absl::Span<uint8_t>> registered_regions;
  Env* env = nullptr;  // Env::Default() when null; must outlive the tier.
};

// Where a block lives. length_bytes is the payload length (on disk the block
// occupies length rounded up to alignment).
struct NvmeLocation {
  uint32_t file_index = 0;
  uint64_t offset_bytes = 0;
  uint64_t length_bytes = 0;

  std::string ToString() const;  // "nvme-003.dat@8192+4000"
  friend bool operator==(const NvmeLocation&, const NvmeLocation&) = default;
};

struct NvmeReadRequest {
  NvmeLocation location;
  uint64_t expected_xxh3 = 0;
  absl::Span<uint8_t> out;  // exactly location.length_bytes long
};

struct NvmeTierStats {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;  // allocated, in alignment units
  uint64_t blocks = 0;      // allocated extents
  uint32_t files = 0;
  bool direct_io = false;
  bool registered_buffers = false;  // every ring has the fixed buffers
  uint64_t writes = 0;
  uint64_t write_bytes = 0;  // payload bytes
  uint64_t reads = 0;
  uint64_t read_bytes = 0;
  uint64_t zero_copy_ops = 0;
  uint64_t staged_ops = 0;
  uint64_t checksum_failures = 0;
  uint64_t io_errors = 0;
  uint64_t syncs = 0;  // fdatasync calls issued
  IoQueueStats queue;  // summed over rings
};

struct NvmeOrphanReport {
  std::vector<std::string> removed;  // nvme-* files that were not ours
  std::vector<std::string> foreign;  // other entries, kept
};

// XXH3-64 of a payload: the checksum Read expects.
uint64_t NvmeChecksum(absl::Span<const uint8_t> data);

class NvmeTier {
 public:
  // Validates options, creates the directory and the preallocated files (or
  // opens existing ones of the right size), and starts the I/O threads.
  static absl::StatusOr<std::unique_ptr<NvmeTier>> Open(const NvmeTierOptions& options);
  // Waits for in-flight I/O; does not Sync.
  ~NvmeTier();

  NvmeTier(const NvmeTier&) = delete;
  NvmeTier& operator=(const NvmeTier&) = delete;

  // Stores one payload (1..max_block_bytes). The data must not change until
  // the call returns.
  absl::StatusOr<NvmeLocation> Write(absl::Span<const uint8_t> data);
  // Stores many payloads with their I/O overlapped; result i belongs to
  // blocks[i]. A failed block leaves no allocation behind.
  std::vector<absl::StatusOr<NvmeLocation>> WriteBatch(
      absl::Span<const absl::Span<const uint8_t>> blocks);

  // Reads a block into out (out.size() == location.length_bytes) and checks
  // its XXH3-64.
  absl::Status Read(const NvmeLocation& location, uint64_t expected_xxh3, absl::Span<uint8_t> out);
  std::vector<absl::Status> ReadBatch(absl::Span<const NvmeReadRequest> requests);

  // fdatasync of every file written since the last successful Sync. A
  // failed Sync counts in sync_failures() and leaves its files to be synced
  // again by the next Sync, which may succeed although the kernel dropped
  // pages the failed one covered. So a block is durable only when its
  // Write and a later successful Sync saw no sync failure in between: read
  // sync_failures() before the Write and compare it after the Sync.
  absl::Status Sync();
  // Failed Syncs so far.
  uint64_t sync_failures() const { return sync_failures_.load(std::memory_order_acquire); }
  // The error of the latest failed Sync (OK before the first).
  absl::Status last_sync_error() const;

  // Returns a block's space. NOT_FOUND unless `location` is exactly an
  // allocated block. The caller makes sure no read of it is in flight (a
  // read racing with reuse fails its checksum, it never returns wrong
  // bytes).
  absl::Status Free(const NvmeLocation& location);
  // Marks a block from the catalog as allocated (after a restart).
  // ALREADY_EXISTS if it overlaps an allocated block.
  absl::Status Reserve(const NvmeLocation& location);

  // Deletes entries of the directory named nvme-* that are not this tier's
  // files (left by a larger configuration or a crash) and reports other
  // entries without touching them.
  absl::StatusOr<NvmeOrphanReport> RemoveOrphanFiles();

  // Paths of the tier's files, index order.
  std::vector<std::string> FilePaths() const;
  static std::string FileName(uint32_t file_index);  // "nvme-007.dat"

  NvmeTierStats stats() const;
  const NvmeTierOptions& options() const { return options_; }

  // True for the RESOURCE_EXHAUSTED of Write/WriteBatch that means "no free
  // extent" (the owner may evict and retry), as opposed to an I/O error
  // such as ENOSPC from the file system.
  static bool IsTierFull(const absl::Status& status);
  static constexpr char kTierFullPayload[] = "kvtier.nvme/tier_full";

 private:
  class Batch;
  struct File;

  NvmeTier(const NvmeTierOptions& options, Env* env);
  absl::Status Init();

  absl::Status CheckLocation(const NvmeLocation& location) const;
  absl::StatusOr<NvmeLocation> Allocate(uint64_t length_bytes);
  void Release(const NvmeLocation& location);
  // Spreads requests over the workers starting at a rotating worker.
  void Dispatch(absl::Span<IoRequest* const> requests);
  // Runs the prepared requests of `batch` (those marked active): acquires
  // staging for requests without a buffer and calls stage(i, span) to fill
  // it, submits, and calls done(i, request, staging) on this thread as each
  // finishes. Keeps as many in flight as staging allows, and never waits for
  // staging while holding any.
  template <typename Stage, typename Done>
  void RunBatch(Batch& batch, const std::vector<bool>& active, Stage stage, Done done);

  // Constant after Open.
  const NvmeTierOptions options_;
  Env* const env_;
  std::vector<std::unique_ptr<File>> files_;
  std::unique_ptr<AlignedBufferPool> staging_;
  std::vector<std::unique_ptr<IoWorker>> workers_;
  bool registered_buffers_ = false;

  mutable absl::Mutex mu_;
  // Per file: best-fit free space, and offset -> payload length of every
  // allocated block.
  std::deque<ExtentAllocator> space_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::flat_hash_map<uint64_t, uint64_t>> blocks_ ABSL_GUARDED_BY(mu_);
  uint32_t next_file_ ABSL_GUARDED_BY(mu_) = 0;

  mutable absl::Mutex sync_mu_;
  std::atomic<uint64_t> sync_failures_{0};
  absl::Status last_sync_error_ ABSL_GUARDED_BY(sync_mu_);

  std::atomic<uint32_t> next_worker_{0};
  // The I/O counters of NvmeTierStats (writes .. syncs); the other fields
  // are filled by stats().
  LockedStats<NvmeTierStats> stats_;
};

}  // namespace kvtier

#endif  // KVTIER_STORAGE_NVME_NVME_TIER_H_
