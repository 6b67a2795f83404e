// BlockSummaryBuilder: ComputeBlockSummary (summary.h) for a payload that
// arrives in order, for a put that copies a block into its slot chunk by
// chunk. After each chunk the caller passes the prefix written so far; every
// KV head whose keys lie entirely in that prefix is summarised at once,
// while its bytes are still in cache, and Finish completes the summary once
// the whole payload is there. The result is bit-identical to
// ComputeBlockSummary of the same payload (which is this builder fed the
// whole payload at once).
//
// Heads are summarised in payload order ([layer][k|v][kv_head]...): a head
// straddling a chunk boundary waits for the next chunk; value bytes are
// skipped. One part stays a second pass: the bounding radius
// (SummaryOptions::bounds) needs the block's final mean, so Finish re-reads
// the keys when bounds are on.
//
// Usage:
//   auto b = BlockSummaryBuilder::Create(layout, options, &stats);
//   for each chunk copied to dst: b->Advance({dst, written_so_far});
//   absl::StatusOr<BlockSummary> s = b->Finish({dst, payload_size});
//
// Thread safety: not synchronised; one thread drives one builder. Every
// prefix passed must be a prefix of the same payload (the bytes already
// summarised must not change between calls).
#ifndef KVTIER_INDEX_SUMMARY_SUMMARY_BUILDER_H_
#define KVTIER_INDEX_SUMMARY_SUMMARY_BUILDER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "index/summary/block_layout.h"
#include "index/summary/summary.h"

namespace kvtier::index {

class BlockSummaryBuilder {
 public:
  // Checks the layout and the options as ComputeBlockSummary does
  // (InvalidArgument naming the field). `options` (and the head weights it
  // points to) must outlive the builder. When head_stats is not null it is
  // reset and filled as the heads are summarised.
  static absl::StatusOr<BlockSummaryBuilder> Create(const BlockLayout& layout,
                                                    const SummaryOptions& options,
                                                    HeadStats* head_stats);

  BlockSummaryBuilder(BlockSummaryBuilder&&) = default;
  BlockSummaryBuilder& operator=(BlockSummaryBuilder&&) = default;

  // Summarises every head not yet summarised whose keys end within
  // `prefix` (the payload's first prefix.size() bytes; may be shorter or
  // longer than the last call's, only new heads are read). InvalidArgument
  // when a head's keys are not finite; the error sticks: later calls and
  // Finish return it.
  absl::Status Advance(absl::string_view prefix);

  // Summarises what is left of `payload` (exactly PayloadSizeBytes bytes:
  // InvalidArgument otherwise) and returns the summary. Call once.
  absl::StatusOr<BlockSummary> Finish(absl::string_view payload);

  // Heads summarised so far (of num_layers * num_kv_heads).
  int64_t heads_done() const { return next_head_; }

 private:
  BlockSummaryBuilder(const BlockLayout& layout, const SummaryOptions& options,
                      HeadStats* head_stats);

  void Prepare();
  // Key bytes of head lh start at HeadOffset(lh) and end HeadBytes() later.
  size_t HeadOffset(int64_t lh) const;
  absl::Status SummarizeHead(const char* payload, int32_t l, int32_t h);
  void RecordHeadStats(size_t lh);
  void FinishLayer(int32_t l);
  void FinishSummary(const char* payload);
  void LoadHeadKeys(const char* payload, int32_t l, int32_t h);

  BlockLayout layout_;
  const SummaryOptions* options_;
  HeadStats* head_stats_;
  int32_t L_, H_, T_;
  size_t D_, head_elems_, elem_bytes_;
  int64_t next_head_ = 0;  // l * H + h of the next head to summarise
  absl::Status status_;
  BlockSummary out_;
  std::vector<float> keys_;  // [T][D] of the current head
  std::vector<float> head_sum_, head_meanf_, dev_sq_;
  std::vector<double> block_sum_, layer_sum_, weighted_sum_;
  double weight_total_ = 0;
};

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_SUMMARY_SUMMARY_BUILDER_H_
