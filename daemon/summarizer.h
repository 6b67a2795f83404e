// Summarizer: the block store's summarize hook. For every block put it
// computes the index summaries (index/summary/summary.h: v_b over tokens, heads and
// layers, a head-weighted v_b, Quest min/max, the ArkVale radius, per-layer
// means, and for a calibrated profile the int8 keys of its retrieval heads'
// KV heads) from the payload in the profile's layout
// ([layer][k|v][kv_head][token][dim]) and encodes them with
// index/summary/summary_codec.h. It also keeps every profile's running head-variance
// statistics and derives versioned head weights from them, per profile of
// each tenant (ModelProfile::owner + profile_id): one tenant's puts never
// move another's weights.
//
// Head weights: until a profile has head_weights_min_blocks blocks its
// weighted v_b uses uniform weights (version 0, equal to v_b) and
// HeadWeightsOf returns version 0 with no weights. The weights are then
// estimated, and re-estimated each time the profile's block count doubles
// (version 1, 2, ...); each summary records the version it was computed
// with. The statistics live in memory: after a restart they are estimated
// again from new puts, starting over at version 0.
//
// Thread safety: Summarize, Begin and HeadWeightsOf may be called
// concurrently (the store calls the hooks from many threads, outside its
// lock); one thread drives a stream from Begin.
#ifndef KVTIER_DAEMON_SUMMARIZER_H_
#define KVTIER_DAEMON_SUMMARIZER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/convert.h"
#include "index/summary/block_layout.h"
#include "index/summary/summary.h"
#include "index/summary/summary_codec.h"
#include "storage/catalog/records.h"
#include "storage/store/block_store_types.h"

namespace kvtier::daemon {

struct SummarizerOptions {
  // fp16 falls back to fp32 for a block whose summary overflows binary16.
  index::SummaryEncoding encoding = index::SummaryEncoding::kFp16;
  bool bounds = true;
  bool weighted = true;  // weighted_mean (the keykey_weighted scorer)
  bool per_layer = true;
  bool layer_int8 = true;  // per-layer means as int8 with a scale per layer
  bool per_layer_bounds = false;
  uint64_t head_weights_min_blocks = 64;  // >= 1
};

class Summarizer {
 public:
  explicit Summarizer(const SummarizerOptions& options) : options_(options) {}

  // The encoded summary of one block of `profile`: never fails the put. A
  // block whose keys hold NaN/Inf (or whose statistics overflow) gets an
  // empty summary: it is stored, but cannot join a context (OpenContext
  // reports it as stored without a key summary).
  absl::StatusOr<std::string> Summarize(const ModelProfile& profile,
                                        absl::Span<const uint8_t> payload);

  // The same summary, computed while the payload is copied in (the block
  // store's begin_summary hook; index/summary/summary_builder.h): Finish returns
  // exactly what Summarize returns for the same bytes.
  std::unique_ptr<SummaryStream> Begin(const ModelProfile& profile);

  // Blocks stored without a summary so far.
  uint64_t blocks_without_summary() const {
    return without_summary_.load(std::memory_order_relaxed);
  }

  // The current head weights ([layer][kv_head], mean 1) of `tenant`'s
  // profile profile_id; version 0 and no weights before the first estimate
  // (and for a profile that is not the tenant's).
  index::HeadWeights HeadWeightsOf(const std::string& tenant, uint64_t profile_id) const;

 private:
  struct ProfileState {
    explicit ProfileState(const index::BlockLayout& layout);
    absl::Mutex mu;
    index::HeadVarianceTracker tracker ABSL_GUARDED_BY(mu);
    // Weights new summaries use: uniform (version 0) until estimated.
    std::shared_ptr<const index::HeadWeights> weights ABSL_GUARDED_BY(mu);
    uint64_t blocks ABSL_GUARDED_BY(mu) = 0;
    uint64_t next_estimate_blocks ABSL_GUARDED_BY(mu) = 0;
    // Constant after creation: KV heads whose keys are kept (calibration).
    std::vector<int32_t> key_heads;
  };

  class Stream;

  ProfileState* StateOf(const ModelProfile& profile, const index::BlockLayout& layout);
  // Encodes a block's summary and merges its head statistics (Stream::Finish).
  absl::StatusOr<std::string> Conclude(ProfileState* state,
                                       absl::StatusOr<index::BlockSummary> summary,
                                       const index::HeadStats& stats);

  const SummarizerOptions options_;
  std::atomic<uint64_t> without_summary_{0};
  mutable absl::Mutex mu_;
  // By (owner, profile_id).
  absl::flat_hash_map<std::pair<std::string, uint64_t>, std::unique_ptr<ProfileState>> profiles_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_SUMMARIZER_H_
