#include "bench/quality/backend.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "index/context_tree.h"

namespace kvtier::quality {
namespace {

class InProcessBackend final : public SelectionBackend {
 public:
  explicit InProcessBackend(const BackendConfig& config) : config_(config) {
    config_.tree.dim = config.layout.head_dim;
    config_.tree.block_size_tokens = config.layout.block_size_tokens;
    config_.tree.vector = config.scorer == index::ScorerKind::kKeyKeyWeighted
                              ? index::TreeVector::kWeightedMean
                              : index::TreeVector::kMean;
  }

  absl::Status Init() {
    if (absl::Status s = index::ValidateLayout(config_.layout); !s.ok()) {
      return s;
    }
    absl::StatusOr<std::unique_ptr<index::Selector>> sel =
        index::Selector::Create(config_.selector);
    if (!sel.ok()) return sel.status();
    selector_ = std::move(*sel);
    index::ContextIndexOptions o;
    o.tree = config_.tree;
    o.num_layers = config_.layout.num_layers;
    o.num_kv_heads = config_.layout.num_kv_heads;
    o.keep_layer_means = config_.summary_per_layer;
    o.calibration = config_.calibration;
    key_heads_ = index::KeyHeadsOf(config_.calibration, config_.layout.num_kv_heads);
    absl::StatusOr<std::unique_ptr<index::ContextIndex>> ctx = index::ContextIndex::Create(o);
    if (!ctx.ok()) return ctx.status();
    context_ = std::move(*ctx);
    return absl::OkStatus();
  }

  absl::Status Open(absl::Span<const std::string> payloads) override {
    if (context_->tree().num_pages() != 0) {
      return absl::FailedPreconditionError("the context is already open");
    }
    if (payloads.empty()) {
      return absl::InvalidArgumentError("Open needs at least one block");
    }
    const index::BlockLayout& layout = config_.layout;
    index::HeadVarianceTracker tracker(layout.num_layers, layout.num_kv_heads, layout.head_dim);
    index::SummaryOptions plain;
    for (const std::string& p : payloads) {
      index::HeadStats stats;
      absl::StatusOr<index::BlockSummary> s = index::ComputeBlockSummary(layout, p, plain, &stats);
      if (!s.ok()) return s.status();
      if (absl::Status m = tracker.Merge(stats); !m.ok()) return m;
    }
    weights_ = tracker.ComputeWeights();
    std::vector<index::BlockSummary> summaries;
    for (const std::string& p : payloads) {
      absl::StatusOr<index::BlockSummary> s = Summarise(p);
      if (!s.ok()) return s.status();
      summaries.push_back(std::move(*s));
    }
    return context_->AddSegment(absl::MakeConstSpan(summaries));
  }

  absl::Status Append(absl::string_view payload) override {
    absl::StatusOr<index::BlockSummary> s = Summarise(payload);
    if (!s.ok()) return s.status();
    return context_->Append(*s);
  }

  int64_t num_blocks() const override { return context_->tree().num_pages(); }
  const index::HeadWeights& head_weights() const override { return weights_; }

  absl::Status Select(const BackendSelect& r, std::vector<int64_t>* blocks) override {
    index::SelectRequest req;
    req.context = context_.get();
    req.anchor = r.anchor;
    req.query = r.query;
    req.head_queries = r.head_queries;
    req.scorer = config_.scorer;
    req.stability = config_.stability;
    req.centered = config_.centered;
    req.recency_weight = config_.recency_weight;
    req.budget_blocks = r.budget_blocks;
    req.step = r.step;
    req.seed = r.seed;
    if (absl::Status s = selector_->Select(req, &result_); !s.ok()) return s;
    blocks->assign(result_.blocks.begin(), result_.blocks.end());
    return absl::OkStatus();
  }

 private:
  // As the daemon's Summarizer computes and stores it (codec round trip).
  absl::StatusOr<index::BlockSummary> Summarise(absl::string_view payload) {
    index::SummaryOptions o;
    o.bounds = config_.summary_bounds;
    o.per_layer = config_.summary_per_layer;
    o.key_heads = key_heads_;
    if (config_.scorer == index::ScorerKind::kKeyKeyWeighted) {
      o.head_weights = &weights_;
    }
    absl::StatusOr<index::BlockSummary> s =
        index::ComputeBlockSummary(config_.layout, payload, o, nullptr);
    if (!s.ok()) return s.status();
    absl::StatusOr<std::string> blob = index::EncodeSummary(*s, config_.codec);
    if (!blob.ok() && config_.codec.encoding == index::SummaryEncoding::kFp16) {
      index::SummaryCodecOptions wide = config_.codec;  // as the Summarizer
      wide.encoding = index::SummaryEncoding::kFp32;
      blob = index::EncodeSummary(*s, wide);
    }
    if (!blob.ok()) return blob.status();
    return index::DecodeSummary(*blob);
  }

  BackendConfig config_;
  std::unique_ptr<index::Selector> selector_;
  std::unique_ptr<index::ContextIndex> context_;
  index::HeadWeights weights_;
  std::vector<int32_t> key_heads_;
  index::SelectResult result_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SelectionBackend>> MakeInProcessBackend(
    const BackendConfig& config) {
  auto b = std::make_unique<InProcessBackend>(config);
  if (absl::Status s = b->Init(); !s.ok()) return s;
  return std::unique_ptr<SelectionBackend>(std::move(b));
}

namespace {
std::atomic<DaemonBackendFactory> g_daemon_factory{nullptr};
}  // namespace

void SetDaemonBackendFactory(DaemonBackendFactory factory) { g_daemon_factory.store(factory); }

absl::StatusOr<std::unique_ptr<SelectionBackend>> MakeDaemonBackend(const BackendConfig& config,
                                                                    const std::string& endpoint) {
  const DaemonBackendFactory factory = g_daemon_factory.load();
  if (factory == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "end-to-end mode (", endpoint, "): this binary was built without the daemon backend"));
  }
  return factory(config, endpoint);
}

}  // namespace kvtier::quality
