#include "bench/putget/metadata_probe.h"

#include <malloc.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "bench/putget/bench_util.h"
#include "bench/putget/kvtier_paths.h"
#include "daemon/tenant.h"
#include "storage/store/block_store.h"

namespace kvtier::bench {
namespace {

constexpr uint64_t kProbeBlockBytes = 4096;

uint64_t HeapInUseBytes() {
  const struct mallinfo2 mi = ::mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

// Resident minus shared pages, in bytes (anonymous RSS).
uint64_t AnonRssBytes() {
  std::ifstream in("/proc/self/statm");
  uint64_t size = 0, resident = 0, shared = 0;
  in >> size >> resident >> shared;
  return (resident - shared) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

absl::StatusOr<MetadataResult> MeasureMetadata(const std::string& data_dir, uint64_t blocks,
                                               const std::string& label,
                                               const std::vector<std::string>& overrides) {
  if (blocks == 0) return absl::InvalidArgumentError("metadata blocks: must be > 0");
  KvtierOptions options;
  options.data_dir = data_dir;
  const uint64_t mib = uint64_t{1} << 20;
  options.host_bytes = (blocks * kProbeBlockBytes + mib - 1) / mib * mib + 16 * mib;
  options.staging_bytes = 4 * mib;
  options.device_bytes = 4 * mib;
  options.nvme_file_bytes = 16 * mib;
  options.extra_overrides = overrides;
  auto k = KvtierPaths::Start(options);
  if (!k.ok()) return k.status();
  v1::ModelProfile profile;
  profile.set_name("putget-metadata-probe");
  profile.set_revision("1");
  profile.set_num_layers(1);
  profile.set_num_kv_heads(1);
  profile.set_block_size_tokens(8);
  profile.set_head_dim(128);
  profile.set_dtype(v1::DTYPE_FP16);
  uint64_t block_bytes = 0;
  auto profile_id = (*k)->RegisterProfile(profile, &block_bytes);
  if (!profile_id.ok()) return profile_id.status();
  if (block_bytes != kProbeBlockBytes) {
    return absl::InternalError(absl::StrCat("metadata probe: block size ", block_bytes));
  }
  BlockStore* store = (*k)->server()->runtime()->store();

  const std::vector<std::string> ids = BlockIds("metadata", 0, blocks);
  WorkingSet payload(kProbeBlockBytes, 1, 7);
  const auto data =
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(payload.src(0)), kProbeBlockBytes);
  BlockKey key{daemon::kDefaultTenant, *profile_id, ""};
  key.block_id.reserve(ids[0].size());

  const uint64_t heap_before = HeapInUseBytes();
  const uint64_t rss_before = AnonRssBytes();
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < blocks; ++i) {
    key.block_id = ids[i];
    auto outcome = store->Put(key, data);
    if (!outcome.ok()) {
      return absl::Status(outcome.status().code(), absl::StrCat("metadata probe: put of block ", i,
                                                                ": ", outcome.status().message()));
    }
    if (outcome->existed || outcome->tier != TierId::kHost) {
      return absl::InternalError(
          absl::StrCat("metadata probe: block ", i, " did not land fresh in the host tier"));
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const uint64_t heap_after = HeapInUseBytes();
  const uint64_t rss_after = AnonRssBytes();

  BlockStoreStats stats = store->Stats();
  if (stats.blocks != blocks) {
    return absl::InternalError(
        absl::StrCat("metadata probe: store holds ", stats.blocks, " blocks, expected ", blocks));
  }
  std::vector<BlockKey> missing;
  const std::vector<std::string> summaries =
      store->GetSummaries({BlockKey{daemon::kDefaultTenant, *profile_id, ids[0]}}, &missing);
  if (!missing.empty() || summaries.size() != 1) {
    return absl::InternalError("metadata probe: no summary for the first block");
  }
  MetadataResult r;
  r.label = label;
  r.summary_bytes = summaries[0].size();
  r.blocks = blocks;
  r.block_bytes = kProbeBlockBytes;
  r.heap_bytes_per_block =
      (static_cast<double>(heap_after) - static_cast<double>(heap_before)) / blocks;
  r.anon_rss_bytes_per_block =
      (static_cast<double>(rss_after) - static_cast<double>(rss_before)) / blocks;
  r.estimate_bytes_per_block = stats.metadata_bytes_per_block;
  r.put_seconds = seconds;
  return r;
}

}  // namespace kvtier::bench
