#include "daemon/options.h"

#include <algorithm>
#include <fstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "index/select/gpu_scoring.h"

namespace kvtier::daemon {

SummarizerOptions SummarizerOptionsOf(const Config& config) {
  SummarizerOptions options;
  options.encoding = config.index.summary_encoding == SummaryEncodingSetting::kFp32
                         ? index::SummaryEncoding::kFp32
                         : index::SummaryEncoding::kFp16;
  options.bounds = config.index.summary_bounds;
  options.weighted = config.index.summary_weighted;
  options.per_layer = config.index.summary_per_layer;
  options.layer_int8 = config.index.summary_layer_encoding == LayerEncodingSetting::kInt8;
  options.per_layer_bounds = config.index.summary_per_layer_bounds;
  options.head_weights_min_blocks = config.index.head_weights_min_blocks;
  return options;
}

index::SelectorOptions SelectorOptionsOf(const Config& config) {
  const Config::Select& s = config.select;
  index::SelectorOptions options;
  options.grid_keep_fraction = s.grid_keep_fraction;
  options.chunk_keep_fraction = s.chunk_keep_fraction;
  options.page_keep_fraction = s.page_keep_fraction;
  options.sink_blocks = static_cast<int32_t>(s.sink_blocks);
  options.local_blocks = static_cast<int32_t>(s.local_blocks);
  options.max_prefetch_blocks = static_cast<int32_t>(s.max_prefetch_blocks);
  options.algorithm = s.algorithm == SelectAlgorithmSetting::kGemm
                          ? index::SelectAlgorithm::kGemm
                          : index::SelectAlgorithm::kDescent;
  options.stability.window_steps = static_cast<int32_t>(s.window_steps);
  options.stability.theta = static_cast<float>(s.theta);
  options.stability.weight = static_cast<float>(s.stability_weight);
  options.stability.hold_threshold = static_cast<float>(s.hold_threshold);
  options.mass_tree.min_blocks =
      static_cast<int64_t>(std::min<uint64_t>(s.mass_tree_min_blocks, uint64_t{1} << 40));
  options.mass_tree.max_read_fraction = s.mass_tree_max_read_fraction;
  options.mass_tree.recent_blocks = static_cast<int32_t>(s.mass_tree_recent_blocks);
  options.mass_tree.reuse_steps = static_cast<int32_t>(s.mass_tree_reuse_steps);
  options.mass_tree.reuse_min_cosine = static_cast<float>(s.mass_tree_reuse_min_cosine);
  // One Selector per stream; the contexts of one request are spread over
  // at most num_threads threads: the stream's and those of the runtime's
  // one shared pool (Runtime::Create sets options.pool).
  options.num_threads = static_cast<int32_t>(
      s.batch_threads != 0 ? s.batch_threads
                           : std::clamp<uint64_t>(std::thread::hardware_concurrency(), 1, 4));
  // Pooled key-key levels are scored on the GPU when the device tier is (or
  // may be) CUDA: each Selector makes its own scorer on device 0, the
  // daemon's arena device; without one the factory fails and the CPU scores.
  if (config.device.backend != DeviceBackendSetting::kShm) {
    options.level_scorer = [] { return index::NewCudaLevelScorer(/*device_ordinal=*/0); };
    options.level_scorer_min_rows = index::kDefaultGpuMinRows;
  }
  return options;
}

ContextManagerOptions ContextManagerOptionsOf(const Config& config) {
  ContextManagerOptions contexts;
  contexts.pages_per_chunk = static_cast<int32_t>(config.index.pages_per_chunk);
  contexts.chunks_per_grid = static_cast<int32_t>(config.index.chunks_per_grid);
  contexts.vector = config.select.default_scorer == index::ScorerKind::kKeyKeyWeighted
                        ? index::TreeVector::kWeightedMean
                        : index::TreeVector::kMean;
  contexts.keep_summaries = config.index.keep_summaries;
  contexts.keep_layer_means = config.index.summary_per_layer;
  contexts.max_contexts = config.limits.max_contexts;
  contexts.default_ttl_ms = config.leases.default_ttl_ms;
  contexts.max_ttl_ms = config.leases.max_ttl_ms;
  contexts.max_append_blocks = config.limits.max_batch_blocks;
  return contexts;
}

uint32_t StabilityScorersOf(const Config& config) {
  uint32_t mask = 0;
  for (absl::string_view name :
       absl::StrSplit(config.select.stability_scorers, ',', absl::SkipEmpty())) {
    absl::StatusOr<index::ScorerKind> k = index::ParseScorerKind(absl::StripAsciiWhitespace(name));
    if (k.ok()) mask |= 1u << static_cast<uint32_t>(*k);  // validated by LoadConfig
  }
  return mask;
}

size_t PutParallelismOf(const Config& config) {
  if (config.server.put_parallelism != 0) return config.server.put_parallelism;
  return std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 4);
}

absl::StatusOr<remote::RemoteTierOptions> RemoteOptionsOf(const Config& config) {
  const Config::Remote& r = config.remote;
  remote::RemoteTierOptions o;
  for (absl::string_view seed : absl::StrSplit(r.redis_cluster, ',', absl::SkipEmpty())) {
    o.cluster.seeds.emplace_back(absl::StripAsciiWhitespace(seed));
  }
  if (!r.password_file.empty()) {
    std::ifstream in(r.password_file);
    std::string line;
    if (!in || !std::getline(in, line) || absl::StripAsciiWhitespace(line).empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("key 'tiers.remote.password_file': cannot read a password from \"",
                       r.password_file, "\""));
    }
    o.cluster.password = std::string(absl::StripAsciiWhitespace(line));
  }
  o.cluster.connect_timeout_ms = static_cast<uint32_t>(r.connect_timeout_ms);
  o.cluster.command_timeout_ms = static_cast<uint32_t>(r.command_timeout_ms);
  o.cluster.down_backoff_ms = static_cast<uint32_t>(r.down_backoff_ms);
  o.cluster.read_from_replicas = r.read_from_replicas;
  o.publish = r.publish;
  o.policy = r.publish_policy == PublishPolicySetting::kWriteBack
                 ? remote::PublishPolicy::kWriteBack
                 : remote::PublishPolicy::kWriteThrough;
  o.writeback_buffer_bytes = r.writeback_buffer_bytes;
  o.publish_threads = static_cast<uint32_t>(r.publish_threads);
  o.publish_queue_blocks = static_cast<uint32_t>(r.publish_queue_blocks);
  o.ttl_ms = r.ttl_ms;
  o.miss_cache_ms = r.miss_cache_ms;
  o.log_warning = [](const std::string& message) { spdlog::warn("{}", message); };
  return o;
}

}  // namespace kvtier::daemon
