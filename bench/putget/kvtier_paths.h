// The kvtier side of kvtier_putget_bench: an in-process kvtierd
// (daemon::Server on a Unix socket in a temporary data directory) and the
// client paths that move a WorkingSet through it.
//
//   bytes path    PutBlocks with the payload in the messages (one client
//                 stream, `batch` blocks per message); GetBlocks in
//                 RETURN_MODE_BYTES, one call per `batch` ids, payload
//                 copied into the working set's destination.
//   direct path   Client::PutBlockData / GetBlockData: the same calls as
//                 the bytes path, their messages written from the working
//                 set's memory and parsed into its destination in place
//                 (no protobuf objects), `batch` blocks per message / call.
//   staging path  ReserveSlots per batch, memcpy of each block into its
//                 shared-memory slot, PutBlocks naming the slots (one
//                 stream); GetBlocks in RETURN_MODE_HANDLES per batch, bytes
//                 copied out of the mapped device arena (shm backend), then
//                 Release of the lease.
//
// Every client-side copy is inside the timed call: it is part of what a
// client pays. Thread safety: none; one thread drives a KvtierPaths.
#ifndef KVTIER_BENCH_PUTGET_KVTIER_PATHS_H_
#define KVTIER_BENCH_PUTGET_KVTIER_PATHS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/putget/bench_util.h"
#include "client/client.h"
#include "client/shm/shm_mapping.h"
#include "daemon/server.h"

namespace kvtier::bench {

struct KvtierOptions {
  std::string data_dir;  // created; removed by the destructor
  uint64_t host_bytes = uint64_t{2} << 30;
  uint64_t staging_bytes = uint64_t{512} << 20;
  uint64_t device_bytes = uint64_t{256} << 20;
  uint64_t nvme_file_bytes = uint64_t{64} << 20;  // x 2 files
  uint64_t max_batch_blocks = 4096;
  // Further "section.key=value" daemon settings, applied last.
  std::vector<std::string> extra_overrides;
};

// A fp16 profile of exactly block_bytes: head_dim 128, 8 KV heads, 16
// tokens and block_bytes / 64 KiB layers when that divides, else head_dim
// 64, 1 head, 16 tokens and block_bytes / 4 KiB layers. INVALID_ARGUMENT
// when block_bytes is not a multiple of 4 KiB.
absl::StatusOr<v1::ModelProfile> ProfileForBlockBytes(uint64_t block_bytes);

class KvtierPaths {
 public:
  // Starts the daemon (write_through off, shm device backend) and connects.
  static absl::StatusOr<std::unique_ptr<KvtierPaths>> Start(const KvtierOptions& options);
  ~KvtierPaths();  // shuts the daemon down, removes data_dir

  // Registers the profile for block_bytes and returns its id.
  absl::StatusOr<uint64_t> RegisterBlockSize(uint64_t block_bytes);
  // Registers any profile; returns its id and stores its block size in
  // *block_bytes.
  absl::StatusOr<uint64_t> RegisterProfile(const v1::ModelProfile& profile, uint64_t* block_bytes);

  absl::Status PutBytes(uint64_t profile_id, const WorkingSet& ws,
                        const std::vector<std::string>& ids, uint32_t batch);
  absl::Status GetBytes(uint64_t profile_id, WorkingSet* ws, const std::vector<std::string>& ids,
                        uint32_t batch);
  absl::Status PutDirect(uint64_t profile_id, const WorkingSet& ws,
                         const std::vector<std::string>& ids, uint32_t batch);
  absl::Status GetDirect(uint64_t profile_id, WorkingSet* ws, const std::vector<std::string>& ids,
                         uint32_t batch);
  absl::Status PutStaged(uint64_t profile_id, const WorkingSet& ws,
                         const std::vector<std::string>& ids, uint32_t batch);
  absl::Status GetHandles(uint64_t profile_id, WorkingSet* ws, const std::vector<std::string>& ids,
                          uint32_t batch);
  // Size of the key summary the store keeps for a stored block.
  absl::StatusOr<uint64_t> SummaryBytes(uint64_t profile_id, const std::string& id);
  // Deletes every id (all must exist and be unpinned).
  absl::Status Delete(uint64_t profile_id, const std::vector<std::string>& ids);

  daemon::Server* server() { return server_.get(); }
  Client* client() { return client_.get(); }

 private:
  KvtierPaths() = default;

  KvtierOptions options_;
  std::unique_ptr<daemon::Server> server_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<client::ShmArenaView> arena_;
  uint64_t arena_id_ = 0;
  std::unique_ptr<client::ShmStagingFile> staging_;  // mapped on first reserve
};

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_PUTGET_KVTIER_PATHS_H_
