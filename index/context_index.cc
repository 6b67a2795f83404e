#include "index/context_index.h"

#include "absl/strings/str_cat.h"

namespace kvtier::index {

absl::StatusOr<std::unique_ptr<ContextIndex>> ContextIndex::Create(const TreeOptions& options) {
  ContextIndexOptions o;
  o.tree = options;
  return Create(o);
}

absl::StatusOr<std::unique_ptr<ContextIndex>> ContextIndex::Create(const ContextIndexOptions& o) {
  auto tree = ContextTree::Create(o.tree);
  if (!tree.ok()) return tree.status();
  const bool shaped = o.keep_layer_means || o.calibration.calibrated();
  if (shaped && (o.num_layers < 1 || o.num_layers > kMaxLayers || o.num_kv_heads < 1 ||
                 o.num_kv_heads > kMaxKvHeads)) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.num_layers (", o.num_layers, ") and num_kv_heads (", o.num_kv_heads,
                     ") must be set for per-layer means or a calibration"));
  }
  KeyTableOptions k;
  k.dim = o.tree.dim;
  k.num_layers = o.keep_layer_means ? o.num_layers : 0;
  k.pages_per_chunk = o.tree.pages_per_chunk;
  std::vector<int32_t> slots;
  if (o.calibration.calibrated()) {
    BlockLayout layout;
    layout.num_layers = o.num_layers;
    layout.num_kv_heads = o.num_kv_heads;
    layout.head_dim = o.tree.dim;
    layout.block_size_tokens =
        o.block_size_tokens > 0 ? o.block_size_tokens : o.tree.block_size_tokens;
    if (absl::Status s = ValidateCalibration(o.calibration, layout); !s.ok()) {
      return s;
    }
    k.key_heads = KeyHeadsOf(o.calibration, o.num_kv_heads);
    k.key_tokens = layout.block_size_tokens;
    slots = KeyHeadSlots(o.calibration, o.num_kv_heads);
  }
  std::unique_ptr<KeyTable> keys;
  if (k.enabled()) keys = std::make_unique<KeyTable>(k);
  return std::unique_ptr<ContextIndex>(
      new ContextIndex(std::move(*tree), std::move(keys), o.calibration, std::move(slots)));
}

ContextIndex::ContextIndex(std::unique_ptr<ContextTree> tree, std::unique_ptr<KeyTable> keys,
                           SelectionCalibration calibration, std::vector<int32_t> slots)
    : tree_(std::move(tree)),
      keys_(std::move(keys)),
      calibration_(std::move(calibration)),
      key_slots_(std::move(slots)) {}

absl::Status ContextIndex::AddSegment(absl::Span<const BlockSummary> pages) {
  if (keys_ != nullptr) {
    if (absl::Status s = keys_->Validate(pages); !s.ok()) return s;
  }
  if (absl::Status s = tree_->AddSegment(pages); !s.ok()) return s;
  if (keys_ != nullptr) return keys_->Add(pages);
  return absl::OkStatus();
}

absl::Status ContextIndex::Append(const BlockSummary& page) {
  const absl::Span<const BlockSummary> one(&page, 1);
  if (keys_ != nullptr) {
    if (absl::Status s = keys_->Validate(one); !s.ok()) return s;
  }
  if (absl::Status s = tree_->Append(page); !s.ok()) return s;
  if (keys_ != nullptr) return keys_->Add(one);
  return absl::OkStatus();
}

size_t ContextIndex::MemoryBytes() const {
  return sizeof(*this) + tree_->MemoryBytes() + stability_.MemoryBytes() +
         (keys_ != nullptr ? keys_->MemoryBytes() : 0) + key_slots_.capacity() * sizeof(int32_t) +
         mass_reuse_.MemoryBytes();
}

}  // namespace kvtier::index
