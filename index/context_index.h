// ContextIndex: everything the Selector keeps for one open context.
//
//   tree         Grid / Chunk / Page tree of the pooled summaries
//                (context_tree.h): key-key selection with pooled anchors
//   keys         optional KeyTable (key_table.h): per-layer means for
//                per-layer anchors, int8 keys of the calibrated retrieval
//                heads for the mass scorer
//   calibration  the profile's selection calibration (calibration.h)
//   stability    the per-page relevance windows (stability.h)
//   mass memory  the mass scorer's targets of the last two steps and its
//                heads' copy tracks (key_scorers.h)
//
// Pages are added through AddSegment / Append, which keep the tree and the
// key table the same length: both are validated before either changes, so
// a failure leaves the context unchanged.
//
// attachment: state another part keeps per context and that must live and
// die with it (the GPU level scorer's device copy of the tree's rows,
// level_scorer.h); null until set.
//
// Thread safety: not synchronised; the caller serialises mutations and
// Selects of one context (Selector's contract).
#ifndef KVTIER_INDEX_CONTEXT_INDEX_H_
#define KVTIER_INDEX_CONTEXT_INDEX_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "index/context_tree.h"
#include "index/select/calibration.h"
#include "index/select/key_scorers.h"
#include "index/select/mass_tree.h"
#include "index/select/stability.h"
#include "index/summary/key_table.h"
#include "index/summary/summary.h"

namespace kvtier::index {

// Base of per-context state kept by other parts (see attachment above).
class ContextAttachment {
 public:
  virtual ~ContextAttachment() = default;
};

struct ContextIndexOptions {
  TreeOptions tree;
  // The profile's shape (needed with keep_layer_means or a calibration).
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  // Keep every page's per-layer means (summaries must carry layer_mean of
  // num_layers rows); enables per-layer anchors.
  bool keep_layer_means = false;
  int32_t block_size_tokens = 0;  // tokens of the head keys (default tree's)
  SelectionCalibration calibration;
};

class ContextIndex {
 public:
  // InvalidArgument naming the field for a bad option or calibration.
  static absl::StatusOr<std::unique_ptr<ContextIndex>> Create(const TreeOptions& options);
  static absl::StatusOr<std::unique_ptr<ContextIndex>> Create(const ContextIndexOptions& options);

  // Adds a segment / appends one page (see ContextTree; the key table's
  // requirements are checked first).
  absl::Status AddSegment(absl::Span<const BlockSummary> pages);
  absl::Status Append(const BlockSummary& page);

  ContextTree& tree() { return *tree_; }
  const ContextTree& tree() const { return *tree_; }
  // Null when neither per-layer means nor head keys are kept.
  const KeyTable* keys() const { return keys_.get(); }
  const SelectionCalibration& calibration() const { return calibration_; }
  // KeyTable slot of each retrieval head (KeyHeadSlots()).
  absl::Span<const int32_t> key_slots() const { return key_slots_; }
  StabilityTracker& stability() { return stability_; }
  const StabilityTracker& stability() const { return stability_; }
  MassMemory& mass_memory() { return mass_memory_; }
  // The mass tree's step-to-step reuse (mass_tree.h).
  MassReuse& mass_reuse() { return mass_reuse_; }
  // The attachment (null when none); replacing it destroys the old one.
  ContextAttachment* attachment() { return attachment_.get(); }
  void set_attachment(std::unique_ptr<ContextAttachment> attachment) {
    attachment_ = std::move(attachment);
  }
  // Host bytes of the tree, key table, stability windows and reuse state (an
  // attachment's memory is its owner's to count).
  size_t MemoryBytes() const;

 private:
  ContextIndex(std::unique_ptr<ContextTree> tree, std::unique_ptr<KeyTable> keys,
               SelectionCalibration calibration, std::vector<int32_t> slots);
  std::unique_ptr<ContextTree> tree_;
  std::unique_ptr<KeyTable> keys_;
  const SelectionCalibration calibration_;
  const std::vector<int32_t> key_slots_;
  StabilityTracker stability_;
  MassMemory mass_memory_;
  MassReuse mass_reuse_;
  std::unique_ptr<ContextAttachment> attachment_;
};

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_CONTEXT_INDEX_H_
