// Metadata RAM per block: how much the daemon's heap grows per stored block.
//
// Starts its own in-process kvtierd (host tier just big enough, plus the
// given daemon overrides), registers a 4 KiB fp16 profile (1 layer, 1 KV
// head, 8 tokens, head_dim 128: the key summaries have a common head_dim,
// their per-layer part is one layer), then stores `blocks` blocks with fresh 32-byte ids
// through BlockStore::Put (non-durable, write_through off: the RocksDB
// catalog is not touched; its memory is bounded by its own block cache and
// memtable limits). Ids and payload are allocated before the baseline, so
// the deltas are the store's own entries, hash-map slots, placement-list
// nodes and host-tier allocator state.
//
// Thread safety: call from one thread; no other daemon may run in-process
// while it measures (their allocations would count).
#ifndef KVTIER_BENCH_PUTGET_METADATA_PROBE_H_
#define KVTIER_BENCH_PUTGET_METADATA_PROBE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtier::bench {

struct MetadataResult {
  std::string label;
  uint64_t blocks = 0;
  uint64_t block_bytes = 0;
  // mallinfo2() (uordblks + hblkhd) growth / blocks: bytes in use by malloc,
  // including blocks served by mmap (large hash-map arrays).
  double heap_bytes_per_block = 0;
  // /proc/self/statm (resident - shared) growth / blocks: anonymous RSS,
  // which also holds malloc's free lists; the host tier's shared-memory
  // pages are excluded.
  double anon_rss_bytes_per_block = 0;
  // Size of the key summary the store keeps in RAM for each block (the
  // string holding it may have more capacity than that).
  uint64_t summary_bytes = 0;
  // BlockStore::Stats().metadata_bytes_per_block (a sizeof-based estimate).
  uint64_t estimate_bytes_per_block = 0;
  double put_seconds = 0;
};

absl::StatusOr<MetadataResult> MeasureMetadata(const std::string& data_dir, uint64_t blocks,
                                               const std::string& label,
                                               const std::vector<std::string>& overrides);

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_PUTGET_METADATA_PROBE_H_
