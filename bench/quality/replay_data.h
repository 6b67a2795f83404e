// What every scorer of one replay may read: the dump cut into blocks (raw
// payloads as an engine would store them), block summaries at three
// granularities, and the per-step inputs (anchors, query, budget, forced
// blocks).
//
// Blocks: block b holds tokens [b * block_size, (b + 1) * block_size). At
// decode step t the visible blocks are [0, ceil((t + 1) / block_size)); the
// complete ones (the only ones a store holds) are [0, floor((t + 1) /
// block_size)); a partial last block is the engine's, always kept and
// counted in the budget. Steps t run over [prompt_tokens, T) (the prompt is
// the first prompt_fraction of the dump).
//
// Summaries (complete blocks only, layout [n][D] for index::SummaryView):
//   pooled  index::BlockSummary of the payload (mean over tokens, layers,
//           KV heads; Quest bounds; ArkVale radius)
//   layer   per-layer mean, min, max                       [L][n][D]
//   head    per-(layer, KV head) mean, min, max, radius   [L*Hkv][n][D]
//   norope  per-(layer, KV head) mean of the keys with the rotary
//           embedding undone (metadata rope_theta, half-split pairs
//           (i, i + D/2) at angle pos * theta^(-2i/D)): content without
//           position; the keys as stored when the dump has no rope_theta
//
// Anchors of step t (anchor_tokens = a): the mean of the keys of positions
// (t - a, t], per (layer, KV head), per layer, and pooled over both (the
// vector a client sends); query = q at t pooled over layers and heads.
//
// Thread safety: ReplayData is immutable after BuildReplayData.
#ifndef KVTIER_BENCH_QUALITY_REPLAY_DATA_H_
#define KVTIER_BENCH_QUALITY_REPLAY_DATA_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/quality/attention.h"
#include "bench/quality/kv_dump.h"
#include "bench/quality/metrics.h"
#include "index/select/calibration.h"
#include "index/select/scorer.h"
#include "index/summary/block_layout.h"
#include "index/summary/summary.h"

namespace kvtier::quality {

struct ReplayOptions {
  int32_t block_size = 16;
  int32_t anchor_tokens = 8;
  double prompt_fraction = 0.5;  // decode steps run over the rest
  int32_t snapkv_window = 32;    // observation window, prompt tokens
};

struct ReplayData {
  const KvDump* dump = nullptr;
  ReplayOptions options;
  index::BlockLayout layout;  // fp16, block_size tokens
  int64_t block_bytes = 0;    // PayloadSizeBytes(layout)
  int64_t num_complete = 0;   // floor(T / block_size)
  int64_t prompt_tokens = 0;
  std::vector<std::string> payloads;           // [num_complete]
  std::vector<index::BlockSummary> summaries;  // [num_complete]
  std::vector<float> pooled_mean, pooled_min, pooled_max, pooled_radius;
  std::vector<float> layer_mean, layer_min, layer_max;  // [L][n][D]
  std::vector<float> head_mean, head_min, head_max;     // [L*Hkv][n][D]
  std::vector<float> head_radius;                       // [L*Hkv][n]
  double rope_theta = 0;                                // 0: keys are used as stored
  std::vector<float> keys_norope;                       // [L*Hkv][T][D]
  std::vector<float> head_mean_norope;                  // [L*Hkv][n][D]
  // The selection calibration of the dump's model (uncalibrated when the
  // replay has none for it); the profile the daemon methods register.
  index::SelectionCalibration calibration;

  // Views over the first n complete blocks.
  index::SummaryView PooledView(int64_t n) const;
  index::SummaryView LayerView(int32_t l, int64_t n) const;
  index::SummaryView HeadView(int32_t lkv, int64_t n) const;
  index::SummaryView HeadNoRopeView(int32_t lkv, int64_t n) const;
};

// InvalidArgument for options out of range (block_size in [1, 65536],
// anchor_tokens >= 1, prompt_fraction in (0, 1), snapkv_window >= 1) or a
// dump with fewer than 2 complete blocks before the first step, a
// rope_theta that is not a positive number or an odd head_dim with it.
absl::StatusOr<ReplayData> BuildReplayData(const KvDump& dump, const ReplayOptions& options);

// Scores of harness scorers already computed at this step (every budget
// and variant of a method scores the same blocks), with the time their
// computation took so that every run is charged for it.
struct ScoreCache {
  struct Entry {
    std::vector<float> scores;
    bool unit = false;
    double compute_us = 0;
  };
  int64_t t = -1;  // the step the entries belong to
  std::map<std::string, Entry> entries;
};

// One decode step as a scorer sees it.
struct StepInput {
  int64_t t = 0;
  int64_t step = 0;          // 1 + index of the evaluated step (stability
                             // clock; Select's step, where 0 means "next")
  int64_t num_blocks = 0;    // visible, including a partial last block
  int64_t num_complete = 0;  // held by the store
  bool has_partial = false;
  int64_t budget = 0;                                // blocks, including forced and partial
  ForcedBlocks forced;                               // over num_blocks (partial included in locals)
  std::vector<float> anchor;                         // [D]
  std::vector<float> anchor_layer;                   // [L][D]
  std::vector<float> anchor_head;                    // [L*Hkv][D]
  std::vector<float> anchor_head_norope;             // [L*Hkv][D]
  std::vector<float> query;                          // [D]
  const StepAttention* attention = nullptr;          // the oracle only
  const std::vector<double>* accumulated = nullptr;  // H2O, [>= num_blocks]
  const std::vector<double>* snapkv = nullptr;       // [num_complete total]
  ScoreCache* cache = nullptr;                       // optional
  mutable double charged_us = 0;                     // cached compute time used by the call
};

// Fills the anchors and query of step t.
void ComputeAnchors(const ReplayData& data, int64_t t, StepInput* in);

}  // namespace kvtier::quality

#endif  // KVTIER_BENCH_QUALITY_REPLAY_DATA_H_
