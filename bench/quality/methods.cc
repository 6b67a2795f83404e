#include "bench/quality/methods.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/quality/backend.h"
#include "index/kernels/simd.h"
#include "index/select/rank.h"

namespace kvtier::quality {
namespace {

using index::ScorerKind;

const std::map<std::string, ScorerKind>& DaemonScorers() {
  static const auto* m = new std::map<std::string, ScorerKind>{
      {"streamingllm", ScorerKind::kRecency},
      {"random", ScorerKind::kRandom},
      {"quest", ScorerKind::kQuest},
      {"arkvale", ScorerKind::kArkVale},
      {"keydiff", ScorerKind::kKeyDiff},
      {"keykey", ScorerKind::kKeyKey},
      {"keykey_weighted", ScorerKind::kKeyKeyWeighted},
      {"keykey_perlayer", ScorerKind::kKeyKey},
      {"mass", ScorerKind::kMass},
      {"mass_prior", ScorerKind::kMass},
      {"mass_ungated", ScorerKind::kMass},
      // The daemon's embedded defaults (the scorer is theirs).
      {"default", ScorerKind::kMass},
  };
  return *m;
}

// What a daemon method sends besides the pooled anchor.
struct Sends {
  bool per_layer_anchor = false;
  bool head_queries = false;
};
Sends SendsOf(const std::string& name, ScorerKind kind) {
  Sends s;
  s.per_layer_anchor = name == "keykey_perlayer";
  s.head_queries = name == "mass" || name == "mass_ungated" || name == "default";
  return s;
}

std::atomic<ShippedDefaultsFactory> g_shipped_defaults{nullptr};

// Harness scorers usable alone; "recency" only inside mixes.
const std::vector<std::string>& HarnessNames() {
  static const auto* v = new std::vector<std::string>{
      "oracle",
      "h2o",
      "snapkv",
      "quest_head",
      "arkvale_head",
      "meankey_head",
      "keykey_flat",
      "keykey_layer",
      "keykey_head",
      "keykey_flat_centered",
      "keykey_layer_centered",
      "keykey_head_centered",
      "keykey_head_softmax",
      "keykey_head_norope",
      "keykey_head_norope_centered",
  };
  return *v;
}

bool IsScoreName(const std::string& name) {
  if (name == "recency" || name == "keydiff_flat") return true;
  const auto& h = HarnessNames();
  return name != "oracle" && std::find(h.begin(), h.end(), name) != h.end();
}

struct Mix {
  std::string a, b;
  float weight = 0;
};

// "<a>+<b>:w" -> Mix; false when `name` is not a mix.
absl::StatusOr<bool> ParseMix(const std::string& name, Mix* mix) {
  const size_t plus = name.find('+');
  if (plus == std::string::npos) return false;
  const size_t colon = name.find(':', plus);
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("method \"", name, "\": a mix is written <a>+<b>:weight"));
  }
  mix->a = name.substr(0, plus);
  mix->b = name.substr(plus + 1, colon - plus - 1);
  if (!absl::SimpleAtof(name.substr(colon + 1), &mix->weight) ||
      !(mix->weight >= 0 && mix->weight <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("method \"", name, "\": mix weight must be a number in [0, 1]"));
  }
  for (const std::string& part : {mix->a, mix->b}) {
    if (!IsScoreName(part)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "method \"", name, "\": \"", part, "\" is not a harness scorer that can be mixed"));
    }
  }
  return true;
}

void MinMax(std::vector<float>* v) {
  if (v->empty()) return;
  const auto [lo, hi] = std::minmax_element(v->begin(), v->end());
  const float low = *lo, range = *hi - *lo;
  for (float& x : *v) x = range > 0 ? (x - low) / range : 0.5f;
}

// out[b] += softmax_b(raw[b] * scale).
void AddSoftmax(const std::vector<float>& raw, float scale, std::vector<float>* out) {
  const float mx = *std::max_element(raw.begin(), raw.end());
  double total = 0;
  std::vector<double> e(raw.size());
  for (size_t b = 0; b < raw.size(); ++b) {
    e[b] = std::exp(static_cast<double>((raw[b] - mx) * scale));
    total += e[b];
  }
  for (size_t b = 0; b < raw.size(); ++b) {
    (*out)[b] += static_cast<float>(e[b] / total);
  }
}

// cos scores of `anchor` against the view's mean rows, optionally after
// subtracting the mean of those rows from both.
absl::Status KeyKey(const index::SummaryView& view, const float* anchor, bool centered,
                    std::vector<float>* out) {
  const int32_t D = view.dim;
  const int64_t n = view.num_blocks;
  out->assign(n, 0.5f);
  if (!centered) {
    index::ScoreInput in;
    in.anchor = absl::MakeConstSpan(anchor, D);
    return index::ScoreBlocks(ScorerKind::kKeyKey, view, in, absl::MakeSpan(*out));
  }
  std::vector<float> c(D, 0.0f), rows(view.mean, view.mean + n * D), a(anchor, anchor + D);
  for (int64_t b = 0; b < n; ++b) {
    for (int32_t i = 0; i < D; ++i) c[i] += rows[b * D + i] / n;
  }
  for (int64_t b = 0; b < n; ++b) {
    for (int32_t i = 0; i < D; ++i) rows[b * D + i] -= c[i];
  }
  float an = 0;
  for (int32_t i = 0; i < D; ++i) {
    a[i] -= c[i];
    an += a[i] * a[i];
  }
  if (!(an > 0)) return absl::OkStatus();  // no direction: all 0.5
  index::SummaryView v;
  v.dim = D;
  v.num_blocks = n;
  v.mean = rows.data();
  index::ScoreInput in;
  in.anchor = a;
  return index::ScoreBlocks(ScorerKind::kKeyKey, v, in, absl::MakeSpan(*out));
}

// Applies `one` to every (layer, query head) and sums softmax_b of its raw
// scores (scaled by 1/sqrt(D)).
template <typename Fn>
absl::Status PerQueryHead(const ReplayData& data, const StepInput& in, Fn one,
                          std::vector<float>* out) {
  const KvDump& d = *data.dump;
  const int64_t n = in.num_complete;
  out->assign(n, 0.0f);
  std::vector<float> raw(n);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.head_dim));
  for (int32_t l = 0; l < d.num_layers; ++l) {
    for (int32_t h = 0; h < d.num_q_heads; ++h) {
      const int32_t lkv = l * d.num_kv_heads + h / d.group_size();
      if (absl::Status s = one(data.HeadView(lkv, n), d.Q(l, h, in.t), &raw); !s.ok()) {
        return s;
      }
      AddSoftmax(raw, scale, out);
    }
  }
  return absl::OkStatus();
}

absl::Status IndexBound(ScorerKind kind, const index::SummaryView& view, const float* q,
                        std::vector<float>* raw) {
  index::ScoreInput si;
  si.query = absl::MakeConstSpan(q, view.dim);
  return index::ScoreBlocks(kind, view, si, absl::MakeSpan(*raw));
}

// Mean over (layer, KV head) or layers of key-key scores.
enum class Grain { kLayer, kHead, kHeadNoRope };
absl::Status KeyKeyMean(const ReplayData& data, const StepInput& in, Grain grain, bool centered,
                        std::vector<float>* out) {
  const KvDump& d = *data.dump;
  const int64_t n = in.num_complete;
  const int32_t rows = grain == Grain::kLayer ? d.num_layers : d.num_layers * d.num_kv_heads;
  out->assign(n, 0.0f);
  std::vector<float> one;
  for (int32_t r = 0; r < rows; ++r) {
    const index::SummaryView v = grain == Grain::kLayer  ? data.LayerView(r, n)
                                 : grain == Grain::kHead ? data.HeadView(r, n)
                                                         : data.HeadNoRopeView(r, n);
    const float* anchor = grain == Grain::kLayer  ? &in.anchor_layer[r * d.head_dim]
                          : grain == Grain::kHead ? &in.anchor_head[r * d.head_dim]
                                                  : &in.anchor_head_norope[r * d.head_dim];
    if (absl::Status s = KeyKey(v, anchor, centered, &one); !s.ok()) return s;
    for (int64_t b = 0; b < n; ++b) (*out)[b] += one[b] / rows;
  }
  return absl::OkStatus();
}

class IndexMethod final : public Method {
 public:
  IndexMethod(const ReplayData& data, std::unique_ptr<SelectionBackend> b, ScorerKind kind,
              Sends sends, index::SelectionCalibration calibration, uint64_t seed)
      : data_(data),
        backend_(std::move(b)),
        kind_(kind),
        sends_(sends),
        calibration_(std::move(calibration)),
        seed_(seed) {}

  absl::Status Select(const StepInput& in, std::vector<int64_t>* blocks) override {
    if (backend_->num_blocks() == 0) {
      if (absl::Status s =
              backend_->Open(absl::MakeConstSpan(data_.payloads.data(), in.num_complete));
          !s.ok()) {
        return s;
      }
    }
    while (backend_->num_blocks() < in.num_complete) {
      if (absl::Status s = backend_->Append(data_.payloads[backend_->num_blocks()]); !s.ok()) {
        return s;
      }
    }
    BackendSelect r;
    std::vector<float> weighted;
    if (kind_ == ScorerKind::kKeyKeyWeighted) {
      absl::StatusOr<std::vector<float>> w =
          index::WeightedAnchor(in.anchor_head, data_.dump->head_dim, backend_->head_weights());
      if (!w.ok()) return w.status();
      weighted = std::move(*w);
      r.anchor = weighted;
    } else if (sends_.per_layer_anchor) {
      r.anchor = in.anchor_layer;
    } else {
      r.anchor = in.anchor;
    }
    r.query = in.query;
    head_queries_.clear();
    if (sends_.head_queries) {
      // The current queries of the profile's retrieval heads at in.t.
      for (const index::HeadRef& h : calibration_.retrieval_heads) {
        const float* q = data_.dump->Q(h.layer, h.q_head, in.t);
        head_queries_.insert(head_queries_.end(), q, q + data_.dump->head_dim);
      }
      r.head_queries = head_queries_;
    }
    r.budget_blocks = in.budget - (in.has_partial ? 1 : 0);
    r.step = in.step;
    r.seed = seed_;
    if (absl::Status s = backend_->Select(r, blocks); !s.ok()) return s;
    if (in.has_partial) blocks->push_back(in.num_complete);
    return absl::OkStatus();
  }

 private:
  const ReplayData& data_;
  std::unique_ptr<SelectionBackend> backend_;
  ScorerKind kind_;
  Sends sends_;
  const index::SelectionCalibration calibration_;
  uint64_t seed_;
  std::vector<float> head_queries_;
};

class OracleMethod final : public Method {
 public:
  absl::Status Select(const StepInput& in, std::vector<int64_t>* blocks) override {
    if (in.attention == nullptr) {
      return absl::FailedPreconditionError("oracle needs the step's attention");
    }
    TotalMass(*in.attention, &total_);
    *blocks = TopBlocks(total_, in.forced, in.budget);
    return absl::OkStatus();
  }

 private:
  std::vector<double> total_;
};

class ScoreMethod final : public Method {
 public:
  ScoreMethod(const ReplayData& data, std::string name, const index::SelectorOptions& options,
              StabilityMode mode)
      : data_(data), name_(std::move(name)), options_(options), mode_(mode) {}

  absl::Status Select(const StepInput& in, std::vector<int64_t>* blocks) override {
    Mix mix;
    absl::StatusOr<bool> is_mix = ParseMix(name_, &mix);
    if (!is_mix.ok()) return is_mix.status();
    bool unit = false;
    if (*is_mix) {
      std::vector<float> other;
      if (absl::Status s = Scores(mix.a, in, &aff_, &unit); !s.ok()) return s;
      if (absl::Status s = Scores(mix.b, in, &other, &unit); !s.ok()) return s;
      MinMax(&aff_);
      MinMax(&other);
      for (size_t b = 0; b < aff_.size(); ++b) {
        aff_[b] = (1.0f - mix.weight) * aff_[b] + mix.weight * other[b];
      }
    } else {
      if (absl::Status s = Scores(name_, in, &aff_, &unit); !s.ok()) return s;
      if (!unit) MinMax(&aff_);
    }
    const int64_t budget = in.budget - (in.has_partial ? 1 : 0);
    if (mode_ == StabilityMode::kRank) {
      FlatSelectRank(options_, {aff_, budget, in.step}, &tracker_, &first_seen_, blocks);
    } else {
      index::RankOptions ro;
      ro.stability = options_.stability;
      ro.max_prefetch = options_.max_prefetch_blocks;
      index::FlatStep step;
      step.affinity = aff_;
      step.sink_blocks = options_.sink_blocks;
      step.local_blocks = options_.local_blocks;
      step.budget = budget;
      step.step = in.step;
      if (absl::Status s = index::SelectFlat(ro, step, &tracker_, &rank_, &ranked_); !s.ok()) {
        return s;
      }
      blocks->assign(ranked_.blocks.begin(), ranked_.blocks.end());
    }
    if (in.has_partial) blocks->push_back(in.num_complete);
    return absl::OkStatus();
  }

 private:
  const ReplayData& data_;
  // HarnessScores through the step's cache.
  absl::Status Scores(const std::string& name, const StepInput& in, std::vector<float>* out,
                      bool* unit) {
    ScoreCache* cache = in.cache;
    if (cache != nullptr) {
      if (cache->t != in.t) {
        cache->entries.clear();
        cache->t = in.t;
      }
      auto it = cache->entries.find(name);
      if (it != cache->entries.end()) {
        *out = it->second.scores;
        *unit = it->second.unit;
        in.charged_us += it->second.compute_us;
        return absl::OkStatus();
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = HarnessScores(name, data_, in, out, unit); !s.ok()) {
      return s;
    }
    if (cache != nullptr) {
      ScoreCache::Entry& e = cache->entries[name];
      e.scores = *out;
      e.unit = *unit;
      e.compute_us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    }
    return absl::OkStatus();
  }

  const std::string name_;
  const index::SelectorOptions options_;
  const StabilityMode mode_;
  index::StabilityTracker tracker_;
  std::vector<int64_t> first_seen_;
  std::vector<float> aff_;
  // The Selector's own ranking (index/select/rank.h): its buffers and last result.
  index::RankScratch rank_;
  index::SelectResult ranked_;
};

}  // namespace

index::SelectorOptions SelectorOptionsFor(const MethodOptions& o) {
  index::SelectorOptions s;
  s.sink_blocks = o.sink_blocks;
  s.local_blocks = o.local_blocks;
  s.page_keep_fraction = o.page_keep_fraction;
  s.chunk_keep_fraction = o.chunk_keep_fraction;
  s.grid_keep_fraction = o.grid_keep_fraction;
  s.stability = o.stability_options;
  if (o.stability == StabilityMode::kOff) {
    s.stability.weight = 0.0f;
    s.stability.hold_threshold = 2.0f;  // above 1: never hold
  }
  return s;
}

const std::vector<std::string>& MethodNames() {
  static const auto* v = [] {
    auto* out = new std::vector<std::string>{
        "streamingllm",    "random",          "quest", "arkvale",    "keydiff",      "keykey",
        "keykey_weighted", "keykey_perlayer", "mass",  "mass_prior", "mass_ungated", "default"};
    for (const std::string& h : HarnessNames()) out->push_back(h);
    return out;
  }();
  return *v;
}

bool IsDaemonMethod(const std::string& name) { return DaemonScorers().count(name) > 0; }

bool UsesMassScorer(const std::string& name) {
  auto it = DaemonScorers().find(name);
  return it != DaemonScorers().end() && it->second == ScorerKind::kMass;
}

absl::Status CheckMethodName(const std::string& name) {
  Mix mix;
  absl::StatusOr<bool> is_mix = ParseMix(name, &mix);
  if (!is_mix.ok()) return is_mix.status();
  if (*is_mix) return absl::OkStatus();
  const auto& all = MethodNames();
  if (std::find(all.begin(), all.end(), name) == all.end()) {
    return absl::InvalidArgumentError(absl::StrCat("method \"", name, "\" is not known"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Method>> MakeMethod(const std::string& name, const ReplayData& data,
                                                   const MethodOptions& o) {
  if (absl::Status s = CheckMethodName(name); !s.ok()) return s;
  const index::SelectorOptions so = SelectorOptionsFor(o);
  if (absl::Status s = index::ValidateSelectorOptions(so); !s.ok()) return s;
  if (name == "oracle") return std::unique_ptr<Method>(new OracleMethod());
  auto it = DaemonScorers().find(name);
  if (it == DaemonScorers().end()) {
    return std::unique_ptr<Method>(new ScoreMethod(data, name, so, o.stability));
  }
  if (o.stability == StabilityMode::kRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("method ", name,
                     ": rank stability is implemented for harness "
                     "scorers only (the Selector has the index rule)"));
  }
  BackendConfig config;
  if (name == "default") {
    const ShippedDefaultsFactory shipped = g_shipped_defaults.load();
    if (shipped == nullptr) {
      return absl::UnimplementedError(
          "method default: this binary cannot read the daemon's defaults "
          "(built without the daemon)");
    }
    absl::StatusOr<BackendConfig> c = shipped(data.layout);
    if (!c.ok()) return c.status();
    config = std::move(*c);
  } else {
    config.layout = data.layout;
    config.selector = so;
    config.scorer = it->second;
    config.tree.pages_per_chunk = o.pages_per_chunk;
    config.tree.chunks_per_grid = o.chunks_per_grid;
    config.tree.keep_summaries = true;
    config.summary_per_layer = name == "keykey_perlayer";
    config.codec.layer_int8 = o.layer_int8;
    config.stability = o.stability != StabilityMode::kOff;
    config.centered = o.centered;
    config.recency_weight = o.recency_weight;
  }
  config.calibration = o.calibration ? *o.calibration : data.calibration;
  if (name == "mass_ungated") {  // every share of every head, always
    config.calibration.head_min_mass = 0.0f;
    config.calibration.copy_run = 0;
  }
  absl::StatusOr<std::unique_ptr<SelectionBackend>> backend =
      o.endpoint.empty() ? MakeInProcessBackend(config) : MakeDaemonBackend(config, o.endpoint);
  if (!backend.ok()) return backend.status();
  return std::unique_ptr<Method>(new IndexMethod(data, std::move(*backend), config.scorer,
                                                 SendsOf(name, config.scorer), config.calibration,
                                                 o.seed));
}

void SetShippedDefaultsFactory(ShippedDefaultsFactory factory) {
  g_shipped_defaults.store(factory);
}

absl::Status HarnessScores(const std::string& name, const ReplayData& data, const StepInput& in,
                           std::vector<float>* out, bool* unit) {
  const int64_t n = in.num_complete;
  const int32_t D = data.dump->head_dim;
  *unit = false;
  if (name == "recency") {
    out->resize(n);
    for (int64_t b = 0; b < n; ++b) {
      (*out)[b] = static_cast<float>(b + 1) / static_cast<float>(n);
    }
    *unit = true;
    return absl::OkStatus();
  }
  if (name == "h2o" || name == "snapkv") {
    const std::vector<double>* src = name == "h2o" ? in.accumulated : in.snapkv;
    if (src == nullptr || static_cast<int64_t>(src->size()) < n) {
      return absl::FailedPreconditionError(absl::StrCat(name, " needs its accumulated attention"));
    }
    // As published, half of the free budget goes to the most recent blocks
    // (H2O's recent window; SnapKV keeps the tokens after its observation
    // window), the other half to the highest attention: recent blocks score
    // in (0.5, 1], the others attention / max attention * 0.5.
    out->resize(n);
    double top = 0;
    for (int64_t b = 0; b < n; ++b) top = std::max(top, (*src)[b]);
    for (int64_t b = 0; b < n; ++b) {
      (*out)[b] = top > 0 ? static_cast<float>(0.5 * (*src)[b] / top) : 0.0f;
    }
    const int64_t locals = in.forced.locals - (in.has_partial ? 1 : 0);
    const int64_t free = in.budget - in.forced.count();
    int64_t recent = (free + 1) / 2;
    for (int64_t b = n - locals - 1; b >= in.forced.sinks && recent > 0; --b, --recent) {
      (*out)[b] = 0.5f + 0.5f * static_cast<float>(b + 1) / n;
    }
    *unit = true;
    return absl::OkStatus();
  }
  if (name == "quest_head" || name == "arkvale_head") {
    const ScorerKind kind = name == "quest_head" ? ScorerKind::kQuest : ScorerKind::kArkVale;
    return PerQueryHead(
        data, in,
        [kind](const index::SummaryView& v, const float* q, std::vector<float>* raw) {
          return IndexBound(kind, v, q, raw);
        },
        out);
  }
  if (name == "meankey_head") {
    return PerQueryHead(
        data, in,
        [D](const index::SummaryView& v, const float* q, std::vector<float>* raw) {
          for (int64_t b = 0; b < v.num_blocks; ++b) {
            (*raw)[b] = index::simd::Dot(q, v.mean + b * D, D);
          }
          return absl::OkStatus();
        },
        out);
  }
  if (name == "keykey_head_softmax") {
    const int32_t rows = data.dump->num_layers * data.dump->num_kv_heads;
    out->assign(n, 0.0f);
    std::vector<float> raw(n);
    for (int32_t r = 0; r < rows; ++r) {
      const index::SummaryView v = data.HeadView(r, n);
      for (int64_t b = 0; b < n; ++b) {
        raw[b] = index::simd::Dot(&in.anchor_head[r * D], v.mean + b * D, D);
      }
      AddSoftmax(raw, 1.0f / std::sqrt(static_cast<float>(D)), out);
    }
    return absl::OkStatus();
  }
  if (name == "keydiff_flat") {
    out->resize(n);
    *unit = true;
    return index::ScoreBlocks(ScorerKind::kKeyDiff, data.PooledView(n), {}, absl::MakeSpan(*out));
  }
  const bool centered = name.size() > 9 && name.compare(name.size() - 9, 9, "_centered") == 0;
  const std::string base = centered ? name.substr(0, name.size() - 9) : name;
  *unit = true;
  if (base == "keykey_flat") {
    return KeyKey(data.PooledView(n), in.anchor.data(), centered, out);
  }
  if (base == "keykey_layer") {
    return KeyKeyMean(data, in, Grain::kLayer, centered, out);
  }
  if (base == "keykey_head") {
    return KeyKeyMean(data, in, Grain::kHead, centered, out);
  }
  if (base == "keykey_head_norope") {
    return KeyKeyMean(data, in, Grain::kHeadNoRope, centered, out);
  }
  return absl::InvalidArgumentError(absl::StrCat("\"", name, "\" is not a harness scorer"));
}

void FlatSelectRank(const index::SelectorOptions& o, const FlatRankStep& in,
                    index::StabilityTracker* st, std::vector<int64_t>* first_seen,
                    std::vector<int64_t>* blocks) {
  const absl::Span<const float> affinity = in.affinity;
  const int64_t budget = in.budget, step = in.step;
  const int64_t n = static_cast<int64_t>(affinity.size());
  const index::StabilityOptions& so = o.stability;
  const int64_t sinks = std::min<int64_t>(o.sink_blocks, n);
  const int64_t locals = std::min<int64_t>(o.local_blocks, n - sinks);
  const int64_t local_first = n - locals;
  const int64_t free = budget - sinks - locals;
  blocks->clear();
  st->Resize(n);
  st->BeginStep(step).IgnoreError();
  if (static_cast<int64_t>(first_seen->size()) < n) first_seen->resize(n, step);
  if (budget >= n) {
    for (int64_t p = 0; p < n; ++p) blocks->push_back(p);
    st->SetChosen(*blocks);
    return;
  }
  struct Item {
    float score;
    int64_t index;
  };
  auto better = [](const Item& a, const Item& b) {
    return a.score > b.score || (a.score == b.score && a.index < b.index);
  };
  // Relevance: the page would be among this step's best `free` pages.
  std::vector<Item> ranked;
  for (int64_t p = sinks; p < local_first; ++p) {
    ranked.push_back({affinity[p], p});
  }
  const size_t k = static_cast<size_t>(std::clamp<int64_t>(free, 0, ranked.size()));
  std::sort(ranked.begin(), ranked.end(), better);
  const float cut = k > 0 ? ranked[k - 1].score : 2.0f;
  for (int64_t p = 0; p < n; ++p) st->Observe(p, affinity[p] >= cut);
  const int32_t W = so.window_steps;
  const float w = so.weight;
  for (Item& item : ranked) {
    const int64_t age = std::min<int64_t>(W, step - (*first_seen)[item.index] + 1);
    const float stab = st->Stability(item.index, W) * static_cast<float>(W) /
                       static_cast<float>(std::max<int64_t>(age, 1));
    item.score = (1.0f - w) * affinity[item.index] + w * std::min(stab, 1.0f);
  }
  std::sort(ranked.begin(), ranked.end(), better);
  for (int64_t p = 0; p < sinks; ++p) blocks->push_back(p);
  for (size_t i = 0; i < k; ++i) blocks->push_back(ranked[i].index);
  for (int64_t p = local_first; p < n; ++p) blocks->push_back(p);
  std::sort(blocks->begin(), blocks->end());
  st->SetChosen(*blocks);
}

int64_t StepBudget(double fraction, int64_t num_blocks, int64_t forced) {
  const int64_t b =
      static_cast<int64_t>(std::ceil(fraction * static_cast<double>(num_blocks) - 1e-9));
  return std::min(num_blocks, std::max(b, forced + 1));
}

}  // namespace kvtier::quality
