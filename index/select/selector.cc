#include "index/select/selector.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "index/kernels/simd.h"
#include "index/kernels/unit_vector.h"
#include "index/select/key_scorers.h"
#include "index/select/selector_internal.h"
#include "index/validate.h"

namespace kvtier::index {

using namespace selector_internal;  // NOLINT: this file's own internals

// ---- options and validation -------------------------------------------------

absl::Status ValidateSelectorOptions(const SelectorOptions& o) {
  auto fraction = [](const char* name, double v) {
    if (!(v > 0.0 && v <= 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("options.", name, " (", v, ") must be in (0, 1]"));
    }
    return absl::OkStatus();
  };
  absl::Status s = fraction("grid_keep_fraction", o.grid_keep_fraction);
  if (s.ok()) s = fraction("chunk_keep_fraction", o.chunk_keep_fraction);
  if (s.ok()) s = fraction("page_keep_fraction", o.page_keep_fraction);
  if (!s.ok()) return s;
  if (o.sink_blocks < 0 || o.local_blocks < 0 || o.max_prefetch_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.sink_blocks (", o.sink_blocks, "), local_blocks (", o.local_blocks,
                     ") and max_prefetch_blocks (", o.max_prefetch_blocks, ") must be >= 0"));
  }
  if (o.algorithm != SelectAlgorithm::kDescent && o.algorithm != SelectAlgorithm::kGemm) {
    return absl::InvalidArgumentError("options.algorithm is unknown");
  }
  if (o.num_threads < 1 || o.num_threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.num_threads (", o.num_threads, ") must be in [1, 256]"));
  }
  if (absl::Status m = ValidateMassTreeOptions(o.mass_tree); !m.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("options.", m.message()));
  }
  if (o.level_scorer_min_rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.level_scorer_min_rows (", o.level_scorer_min_rows, ") must be >= 0"));
  }
  return ValidateStabilityOptions(o.stability);
}

absl::StatusOr<std::unique_ptr<Selector>> Selector::Create(const SelectorOptions& options) {
  if (absl::Status s = ValidateSelectorOptions(options); !s.ok()) return s;
  return std::unique_ptr<Selector>(new Selector(options));
}

Selector::Selector(const SelectorOptions& options)
    : options_(options),
      pool_(options.pool != nullptr ? options.pool
                                    : std::make_shared<WorkerPool>(options.num_threads - 1)) {
  for (int32_t i = 0; i < options.num_threads; ++i) {
    scratch_.push_back(std::make_unique<Scratch>());
  }
  if (options.level_scorer) {
    absl::StatusOr<std::unique_ptr<LevelScorer>> scorer = options.level_scorer();
    if (scorer.ok()) {
      level_scorer_ = std::move(*scorer);
    } else {
      level_create_status_ = scorer.status();
    }
  }
}

Selector::~Selector() = default;

namespace {

// Validate's checks of a key-key request: a pooled anchor (the tree's
// vector kind) or a per-layer one (per-layer means kept for every page).
absl::Status ValidateKeyKey(const SelectRequest& r, const ContextTree& t) {
  const bool weighted = r.scorer == ScorerKind::kKeyKeyWeighted;
  const KeyTable* keys = r.context->keys();
  const bool per_layer_kept = keys != nullptr && keys->has_layers();
  const int64_t layered = per_layer_kept ? int64_t{keys->options().num_layers} * t.dim() : 0;
  if (static_cast<int64_t>(r.anchor.size()) != t.dim() &&
      (layered == 0 || static_cast<int64_t>(r.anchor.size()) != layered)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "anchor has ", r.anchor.size(), " values; expected ", t.dim(),
        " (pooled over layers and KV heads)",
        per_layer_kept ? absl::StrCat(" or ", layered, " (", keys->options().num_layers,
                                      " layers x ", t.dim(), ", per layer)")
                       : " (per-layer anchors need per-layer summaries)"));
  }
  if (static_cast<int64_t>(r.anchor.size()) == t.dim()) {
    if (weighted != (t.options().vector == TreeVector::kWeightedMean)) {
      return absl::FailedPreconditionError(absl::StrCat("scorer ", ScorerName(r.scorer),
                                                        " needs a tree built from ",
                                                        weighted ? "weighted_mean" : "mean"));
    }
    if (absl::Status s = CheckVector("anchor", r.anchor, t.dim(), true); !s.ok()) {
      return s;
    }
  } else {
    if (weighted) {
      return absl::InvalidArgumentError("scorer keykey_weighted takes a pooled anchor only");
    }
    if (keys->size() != t.num_pages()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the context's per-layer means cover ", keys->size(), " of ", t.num_pages(),
                       " pages (pages added around ContextIndex?)"));
    }
    if (absl::Status s = CheckFinite("anchor", r.anchor.data(), r.anchor.size()); !s.ok()) {
      return s;
    }
    const int64_t D = t.dim();
    for (int64_t l = 0; l < keys->options().num_layers; ++l) {
      double n2 = 0;
      for (int64_t d = 0; d < D; ++d) {
        n2 += double{r.anchor[l * D + d]} * r.anchor[l * D + d];
      }
      if (!(n2 > 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("anchor row ", l, " (layer ", l, ") is all zero"));
      }
    }
    if (!(r.recency_weight >= 0.0f && r.recency_weight <= 1.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("recency_weight (", r.recency_weight, ") must be in [0, 1]"));
    }
  }
  return absl::OkStatus();
}

// Validate's checks of a mass request: head queries, when given, are one
// non-zero finite row per retrieval head of the context's calibration.
absl::Status ValidateMass(const SelectRequest& r, const ContextTree& t) {
  if (r.head_queries.empty()) return absl::OkStatus();
  const SelectionCalibration& c = r.context->calibration();
  const int64_t want = static_cast<int64_t>(c.retrieval_heads.size()) * t.dim();
  if (want == 0 || static_cast<int64_t>(r.head_queries.size()) != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_queries has ", r.head_queries.size(), " values; expected ",
                     want == 0 ? std::string("none (the profile's calibration names no "
                                             "retrieval heads)")
                               : absl::StrCat(want, " (", c.retrieval_heads.size(),
                                              " retrieval heads x ", t.dim(), ")")));
  }
  if (absl::Status s = CheckFinite("head_queries", r.head_queries.data(), r.head_queries.size());
      !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < c.retrieval_heads.size(); ++i) {
    bool zero = true;
    for (int64_t d = 0; d < t.dim(); ++d) {
      zero &= r.head_queries[i * t.dim() + d] == 0.0f;
    }
    if (zero) {
      return absl::InvalidArgumentError(absl::StrCat("head_queries row ", i, " is all zero"));
    }
  }
  const KeyTable* keys = r.context->keys();
  if (keys == nullptr || keys->num_key_heads() == 0 || keys->size() != t.num_pages()) {
    return absl::FailedPreconditionError(
        "head_queries need a context built with its profile's calibration");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Selector::Validate(const SelectRequest& r, int64_t* budget) const {
  if (r.context == nullptr) {
    return absl::InvalidArgumentError("context is null");
  }
  const ContextTree& t = r.context->tree();
  const int64_t n = t.num_pages();
  if (n == 0) return absl::InvalidArgumentError("context is empty (0 pages)");
  switch (r.scorer) {
    case ScorerKind::kKeyKey:
    case ScorerKind::kKeyKeyWeighted:
      if (absl::Status s = ValidateKeyKey(r, t); !s.ok()) return s;
      break;
    case ScorerKind::kMass:
      if (absl::Status s = ValidateMass(r, t); !s.ok()) return s;
      break;
    case ScorerKind::kQuest:
    case ScorerKind::kArkVale: {
      if (absl::Status s = CheckVector("query", r.query, t.dim(), true); !s.ok()) {
        return s;
      }
      const SummaryView v = t.summaries();
      if (v.num_blocks != n || v.min == nullptr || v.radius == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "scorer ", ScorerName(r.scorer), " needs a context with keep_summaries and bounds"));
      }
      break;
    }
    case ScorerKind::kKeyDiff:
    case ScorerKind::kRecency:
    case ScorerKind::kRandom:
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("scorer (", static_cast<int>(r.scorer), ") is unknown"));
  }
  if (r.budget_blocks < 0 || r.budget_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("budget_blocks (", r.budget_blocks,
                                                   ") and budget_tokens (", r.budget_tokens,
                                                   ") must be >= 0"));
  }
  if ((r.budget_blocks > 0) == (r.budget_tokens > 0)) {
    return absl::InvalidArgumentError(r.budget_blocks > 0
                                          ? "set only one of budget_blocks and budget_tokens"
                                          : "budget is 0: set budget_blocks or budget_tokens");
  }
  *budget = r.budget_blocks;
  if (r.budget_tokens > 0) {
    *budget = r.budget_tokens / t.options().block_size_tokens;
    if (*budget == 0) {
      return absl::InvalidArgumentError(absl::StrCat("budget_tokens (", r.budget_tokens,
                                                     ") is below one block (",
                                                     t.options().block_size_tokens, " tokens)"));
    }
  }
  const int64_t forced = std::min<int64_t>(n, int64_t{SinkBlocks(r)} + LocalBlocks(r));
  if (*budget < forced) {
    return absl::InvalidArgumentError(absl::StrCat(
        "budget (", *budget, " blocks) is below sink_blocks + local_blocks (", forced, ")"));
  }
  const StabilityTracker& st = r.context->stability();
  if (st.begun() && r.step < st.step()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step (", r.step, ") is before the context's last step (", st.step(), ")"));
  }
  return absl::OkStatus();
}

// ---- scoring
// ------------------------------------------------------------------

namespace {

// Scale-safe: an anchor of 1e30 in every component gives the unit vector
// an anchor of 1 does.
void Normalise(absl::Span<const float> in, std::vector<float>* out) {
  out->resize(in.size());
  UnitVector(in.data(), in.size(), out->data());
}

// Scores to [0, 1] by min-max; all equal -> 0.5 each.
void MinMaxNormalise(absl::Span<float> a) {
  if (a.empty()) return;
  const auto [lo, hi] = std::minmax_element(a.begin(), a.end());
  const float low = *lo, range = *hi - *lo;
  for (float& x : a) x = range > 0 ? (x - low) / range : 0.5f;
}

}  // namespace

// Writes the dot products of q with every grid, chunk and page row of the
// request's context to s->all_* (caller-owned, sized G + C + N).
void Selector::ScoreAllLevels(const SelectRequest& r, Scratch* s) {
  const ContextTree& t = r.context->tree();
  Normalise(r.anchor, &s->q);
  const size_t D = static_cast<size_t>(t.dim());
  simd::DotRowsHalf(t.grid_rows(), t.num_grids(), D, s->q.data(), s->all_grid);
  simd::DotRowsHalf(t.chunk_rows(), t.num_chunks(), D, s->q.data(), s->all_chunk);
  simd::DotRowsHalf(t.page_rows(), t.num_pages(), D, s->q.data(), s->all_page);
}

void Selector::Run(const SelectRequest& r, int64_t budget, Scratch* s, SelectResult* out) {
  ContextIndex& ctx = *r.context;
  const ContextTree& t = ctx.tree();
  StabilityTracker& st = ctx.stability();
  const int64_t n = t.num_pages();
  // Every level already scored (kGemm, or the level scorer): SelectBatch
  // points all_grid at the scores.
  const bool gemm = s->all_grid != nullptr;
  out->blocks.clear();
  out->scores.clear();
  out->prefetch.clear();
  out->rows_scored = 0;
  out->candidates = 0;
  out->held = 0;
  out->mass_pages_opened = out->mass_pages_screened = out->mass_chunks_screened = 0;
  out->mass_heads_reused = out->mass_heads_descended = 0;
  out->mass_sparse = false;

  RunPlan plan;
  plan.n = n;
  plan.sinks = std::min<int64_t>(SinkBlocks(r), n);
  plan.locals = std::min<int64_t>(LocalBlocks(r), n - plan.sinks);
  plan.local_first = n - plan.locals;
  plan.free = budget - plan.sinks - plan.locals;

  st.Resize(n);
  st.BeginStep(r.step).IgnoreError();  // validated in Validate
  if (budget >= n) {
    // The whole context fits: nothing to rank.
    for (int64_t p = 0; p < n; ++p) out->blocks.push_back(p);
    out->scores.assign(n, 0.0f);
    st.SetChosen(out->blocks);
    return;
  }
  if (s->affinity.size() < static_cast<size_t>(n)) s->affinity.resize(n);
  if (options_.window_fast_path && r.scorer == ScorerKind::kMass && r.head_queries.empty() &&
      !ctx.calibration().calibrated() && RunWindow(r, plan, s, out)) {
    return;
  }
  if (r.scorer == ScorerKind::kMass && RunMassSparse(r, plan, s, out)) {
    return;
  }
  s->rank.scored.clear();
  RankInput in;
  in.shape = RankShape{n, plan.sinks, plan.local_first, plan.free};
  in.affinity = absl::MakeConstSpan(s->affinity.data(), n);
  in.tracker = &ctx.stability();
  if (TreeKeyKey(r)) {
    ScoreTree(r, plan, gemm, s, out);
    RankScored(RankOptionsFor(r), in, s->rank.scored, &s->rank, out);
  } else {
    ScoreFlat(r, plan, s, out);
    RankFlat(RankOptionsFor(r), in, &s->rank, out);
  }
}

RankOptions Selector::RankOptionsFor(const SelectRequest& r) const {
  RankOptions o;
  o.stability = options_.stability;
  o.use_stability = r.stability;
  o.recent_ties = r.scorer == ScorerKind::kMass;
  o.max_prefetch = options_.max_prefetch_blocks;
  return o;
}

// The key-key descent: grids, then the chunks of kept grids, then the
// pages of kept chunks (fp16 dot products); sink and local pages are scored for their history.
void Selector::ScoreTree(const SelectRequest& r, const RunPlan& plan, bool gemm, Scratch* s,
                         SelectResult* out) {
  const ContextTree& t = r.context->tree();
  StabilityTracker& st = r.context->stability();
  const StabilityOptions& so = options_.stability;
  const int64_t n = plan.n, sinks = plan.sinks, locals = plan.locals;
  const int64_t local_first = plan.local_first, free = plan.free;
  const size_t D = static_cast<size_t>(t.dim());
  auto forced = [&](int64_t p) { return p < sinks || p >= local_first; };
  if (!gemm) Normalise(r.anchor, &s->q);
  const int64_t target =
      std::min<int64_t>(n, sinks + locals + CeilFraction(1.0 / options_.page_keep_fraction, free));
  // The dots of rows [i0, i1) of one level of the tree with the query: the
  // batch's (gemm), else computed now into s->dots (valid until the next
  // call).
  auto level_dots = [&](const float* all, const uint16_t* rows, int64_t i0,
                        int64_t i1) -> const float* {
    if (gemm) return all + i0;
    s->dots.resize(std::max<size_t>(s->dots.size(), i1 - i0));
    simd::DotRowsHalf(rows + i0 * D, i1 - i0, D, s->q.data(), s->dots.data());
    out->rows_scored += i1 - i0;
    return s->dots.data();
  };
  // Grids.
  const int64_t G = t.num_grids();
  const float* grid_dots = level_dots(s->all_grid, t.grid_rows(), 0, G);
  s->grids.resize(G);
  for (int64_t g = 0; g < G; ++g) {
    s->grids[g] = {grid_dots[g], static_cast<int32_t>(g)};
  }
  auto grid_pages = [&t](int32_t g) {
    return t.ChunkFirstPage(t.GridFirstChunk(g + 1)) - t.ChunkFirstPage(t.GridFirstChunk(g));
  };
  const size_t kept_grids =
      TopWithFloor(&s->grids, CeilFraction(options_.grid_keep_fraction, G), grid_pages, target);
  // Chunks of kept grids.
  s->chunks.clear();
  for (size_t i = 0; i < kept_grids; ++i) {
    const int32_t g = s->grids[i].index;
    const int64_t c0 = t.GridFirstChunk(g), c1 = t.GridFirstChunk(g + 1);
    const float* dots = level_dots(s->all_chunk, t.chunk_rows(), c0, c1);
    for (int64_t c = c0; c < c1; ++c) {
      s->chunks.push_back({dots[c - c0], static_cast<int32_t>(c)});
    }
  }
  auto chunk_pages = [&t](int32_t c) { return t.ChunkFirstPage(c + 1) - t.ChunkFirstPage(c); };
  const size_t kept_chunks =
      TopWithFloor(&s->chunks, CeilFraction(options_.chunk_keep_fraction, s->chunks.size()),
                   chunk_pages, target);
  // Pages of kept chunks.
  for (size_t i = 0; i < kept_chunks; ++i) {
    const int32_t c = s->chunks[i].index;
    const int64_t p0 = t.ChunkFirstPage(c), p1 = t.ChunkFirstPage(c + 1);
    const float* dots = level_dots(s->all_page, t.page_rows(), p0, p1);
    for (int64_t p = p0; p < p1; ++p) {
      if (forced(p)) continue;
      s->affinity[p] = Affinity(dots[p - p0]);
      s->rank.scored.push_back(static_cast<int32_t>(p));
    }
  }
  // Sinks and local pages are scored too: their history matters once
  // they leave the local window.
  auto score_range = [&](int64_t p0, int64_t p1) {
    if (p1 <= p0) return;
    const float* dots = level_dots(s->all_page, t.page_rows(), p0, p1);
    for (int64_t p = p0; p < p1; ++p) {
      s->affinity[p] = Affinity(dots[p - p0]);
      st.Observe(p, s->affinity[p] > so.theta);
    }
  };
  score_range(0, sinks);
  score_range(local_first, n);
  if (gemm) out->rows_scored += G + t.num_chunks() + n;
}

// Every page scored by the request's scorer, min-max normalised where the
// scorer's scores are not affinities already.
void Selector::ScoreFlat(const SelectRequest& r, const RunPlan& plan, Scratch* s,
                         SelectResult* out) {
  ContextIndex& ctx = *r.context;
  const ContextTree& t = ctx.tree();
  const int64_t n = plan.n, sinks = plan.sinks, local_first = plan.local_first;
  const int64_t free = plan.free;
  const size_t D = static_cast<size_t>(t.dim());
  // Flat scorers over every page.
  float* aff = s->affinity.data();
  if (IsKeyKey(r.scorer)) {
    // Per-layer anchor (Validate checked the shape).
    LayerKeyKeyScores(*ctx.keys(), r.anchor, r.centered, &s->keys, absl::MakeSpan(aff, n))
        .IgnoreError();
    MinMaxNormalise(absl::MakeSpan(aff, n));
    const float w = r.recency_weight;
    for (int64_t p = 0; p < n; ++p) {
      aff[p] = (1.0f - w) * aff[p] + w * static_cast<float>(p + 1) / static_cast<float>(n);
    }
  } else if (r.scorer == ScorerKind::kMass) {
    MassMemory& memory = ctx.mass_memory();
    if (!r.head_queries.empty()) memory.Begin(r.step);
    MassScoreInput in{ctx.keys(),
                      &ctx.calibration(),
                      ctx.key_slots(),
                      t.dim(),
                      n,
                      r.head_queries,
                      r.head_queries.empty() ? nullptr : &memory};
    MassScores(in, &s->keys, absl::MakeSpan(aff, n)).IgnoreError();  // validated
    CapRetrievalTerms(ctx.calibration(), !r.head_queries.empty(),
                      RankShape{n, sinks, local_first, free}, absl::MakeSpan(aff, n),
                      &s->rank.pool);
    MinMaxNormalise(absl::MakeSpan(aff, n));
  } else if (r.scorer == ScorerKind::kKeyDiff) {
    s->q.resize(D);
    t.ContextMean(absl::MakeSpan(s->q));
    const float norm = std::sqrt(simd::Dot(s->q.data(), s->q.data(), D));
    for (size_t d = 0; d < D; ++d) s->q[d] = norm > 0 ? s->q[d] / norm : 0.0f;
    simd::DotRowsHalf(t.page_rows(), n, D, s->q.data(), aff);
    for (int64_t p = 0; p < n; ++p) aff[p] = Affinity(-aff[p]);
  } else {
    SummaryView view = t.summaries();
    if (view.num_blocks != n) {  // kRecency / kRandom need no arrays
      view = SummaryView();
      view.dim = t.dim();
      view.num_blocks = n;
    }
    ScoreInput in;
    in.anchor = r.anchor;
    // Bounds are positively homogeneous in the query: scaling it to a
    // largest component of 1 keeps the ranking and cannot overflow.
    s->q.assign(r.query.begin(), r.query.end());
    float qmax = 0.0f;
    for (float x : s->q) qmax = std::max(qmax, std::fabs(x));
    if (qmax > 0) {
      for (float& x : s->q) x /= qmax;
    }
    in.query = s->q;
    in.seed = r.seed;
    in.step = r.step;
    ScoreBlocks(r.scorer, view, in, absl::MakeSpan(aff, n)).IgnoreError();
    if (!ScoresInUnitInterval(r.scorer)) {
      MinMaxNormalise(absl::MakeSpan(aff, n));
    }
  }
  out->rows_scored += n;
}

// The uncalibrated mass scorer: the flat pass scores page p with the prior
// (p + 1) / n, min-max normalised to p / (n - 1), so every page above theta
// is relevant now and has been at every step of its life, and ranks above
// every page at or below theta ((1 - w) * affinity + w * stability). Only
// the pages above theta compete; pages at or below it are not touched
// (their missing bit reads as the 0 the flat pass would write), except
// pages never observed (their first observation dates their life) and the
// always-chosen sinks and local window. Returns false, with nothing in
// *out, when those pages cannot decide the budget exactly; the caller
// then runs the flat pass (which observes every page again).
bool Selector::RunWindow(const SelectRequest& r, const RunPlan& plan, Scratch* s,
                         SelectResult* out) {
  const int64_t sinks = plan.sinks, locals = plan.locals, free = plan.free;
  StabilityTracker& st = r.context->stability();
  const StabilityOptions& so = options_.stability;
  const int64_t n = r.context->tree().num_pages();
  if (n < 2) return false;
  const int64_t local_first = n - locals;
  // Exactly the flat pass's floats (MassScores, then min-max).
  const float fn = static_cast<float>(n);
  const float low = 1.0f / fn;
  const float range = fn / fn - low;
  auto affinity = [&](int64_t p) { return (static_cast<float>(p + 1) / fn - low) / range; };
  // First page above theta (the affinity never decreases with p).
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (affinity(mid) > so.theta) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  const int64_t above = lo;
  auto observe = [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const float a = affinity(p);
      s->affinity[p] = a;
      st.Observe(p, a > so.theta);
    }
  };
  // Pages never observed below the edge, the sinks and the local window
  // below it are observed one by one (all irrelevant); every page from the
  // edge on is relevant, recorded as one range once the tracker has listed
  // the pages observed one by one over a whole window (`ranged`); until
  // then every page is observed and ranked on its own.
  const bool ranged = st.NoteWindowStep(so.window_steps);
  const int64_t first = std::min(above, st.observed_below());
  const int64_t local_start = std::max(local_first, sinks);
  if (ranged) {
    observe(first, above);
    st.ObserveRange(above, n);
  } else {
    observe(first, n);
  }
  observe(0, std::min(sinks, first));
  observe(local_start, std::max(first, local_start));
  st.RaiseObservedBelow(n);
  // Chosen pages report their affinity: the sinks and local pages in range.
  for (int64_t p = above; p < std::min(sinks, n); ++p) s->affinity[p] = affinity(p);
  for (int64_t p = std::max(local_start, above); p < n; ++p) s->affinity[p] = affinity(p);

  const float w = r.stability ? so.weight : 0.0f;
  const int32_t window = so.window_steps;
  // The pool is [pool_lo, local_first). Its pages with identical windows
  // (the uniform range, not observed one by one lately) rank by recency
  // alone: only the best `free` of them can be chosen, and only the oldest
  // can be the most stable rising ones. Every other page of the pool is
  // scored on its own.
  const int64_t pool_lo = std::max(above, sinks);
  const int64_t pool_size = std::max<int64_t>(0, local_first - pool_lo);
  if (free > pool_size) return false;
  const size_t k = static_cast<size_t>(free);
  const StabilityTracker::UniformRange u =
      ranged ? st.Uniform(window) : StabilityTracker::UniformRange{};
  const int64_t ulo = std::clamp(u.lo, pool_lo, std::max(pool_lo, local_first));
  const int64_t uhi = std::clamp(u.hi, ulo, std::max(pool_lo, local_first));
  s->rank.pool.clear();
  auto add = [&](int64_t p, bool uniform) {
    const float a = affinity(p);
    s->affinity[p] = a;
    const float stab = uniform ? u.stability : st.Stability(p, window);
    s->rank.pool.push_back({(1.0f - w) * a + w * stab, static_cast<int32_t>(p)});
  };
  for (int64_t p = pool_lo; p < ulo; ++p) add(p, false);
  for (int64_t p = uhi; p < local_first; ++p) add(p, false);
  for (int64_t p : st.recently_observed()) {
    if (p >= ulo && p < uhi && st.ExplicitWithin(p, window)) add(p, false);
  }
  int64_t top = uhi;  // uniform pages from `top` on are in the pool
  for (size_t taken = 0; top > ulo && taken < k;) {
    --top;
    if (st.ExplicitWithin(top, window)) continue;
    add(top, true);
    ++taken;
  }
  if (u.rising) {
    // All uniform pages left out are rising and equally stable: the oldest
    // are the prefetch candidates (none of them can be chosen: the k taken
    // above outrank them).
    size_t extra = static_cast<size_t>(options_.max_prefetch_blocks);
    for (int64_t p = ulo; p < top && extra > 0; ++p) {
      if (st.ExplicitWithin(p, window)) continue;
      add(p, true);
      --extra;
    }
  }
  if (k < s->rank.pool.size()) {
    std::nth_element(s->rank.pool.begin(), s->rank.pool.begin() + k, s->rank.pool.end(),
                     ByBetterRecent());
  }
  // A page at or below theta scores at most (1 - w) * affinity(above - 1)
  // + w; the k-th best must reach that (a tie goes to the pool's more
  // recent page).
  if (k > 0 && std::min(above, local_first) > sinks) {
    float kth = s->rank.pool[0].score;
    for (size_t i = 1; i < k; ++i) kth = std::min(kth, s->rank.pool[i].score);
    if (kth < (1.0f - w) * affinity(above - 1) + w) return false;
  }
  out->rows_scored = (above - first) + static_cast<int64_t>(s->rank.pool.size());
  FinishRanking(r, RankShape{n, sinks, local_first, free}, /*partitioned=*/true, s, out);
  out->candidates = pool_size;
  return true;
}

void Selector::FinishRanking(const SelectRequest& r, const RankShape& shape, bool partitioned,
                             Scratch* s, SelectResult* out) {
  RankInput in;
  in.shape = shape;
  in.affinity = absl::MakeConstSpan(s->affinity.data(), shape.n);
  in.tracker = &r.context->stability();
  RankPool(RankOptionsFor(r), in, partitioned, &s->rank, out);
}

// ---- entry points
// -------------------------------------------------------------

absl::Status Selector::Select(const SelectRequest& request, SelectResult* result) {
  return SelectBatch(absl::MakeConstSpan(&request, 1), absl::MakeSpan(result, 1));
}

absl::Status Selector::SelectBatch(absl::Span<const SelectRequest> requests,
                                   absl::Span<SelectResult> results) {
  if (results.size() != requests.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("results has ", results.size(), " entries, requests ", requests.size()));
  }
  std::vector<int64_t>& budgets = batch_budgets_;
  budgets.resize(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    if (absl::Status s = Validate(requests[i], &budgets[i]); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("requests[", i, "]: ", s.message()));
    }
  }
  if (requests.size() > 1) {
    std::vector<const ContextIndex*>& seen = batch_contexts_;
    seen.clear();
    for (const SelectRequest& r : requests) seen.push_back(r.context);
    std::sort(seen.begin(), seen.end());
    if (std::adjacent_find(seen.begin(), seen.end()) != seen.end()) {
      return absl::InvalidArgumentError("requests name the same context twice");
    }
  }
  std::vector<size_t>& offsets = batch_offsets_;
  // Stacked level rows of the pooled key-key requests, for the level
  // scorer's threshold.
  bool device = false;
  if (level_scorer_ != nullptr) {
    int64_t rows = 0;
    for (const SelectRequest& r : requests) {
      if (!TreeKeyKey(r)) continue;
      const ContextTree& t = r.context->tree();
      rows += t.num_grids() + t.num_chunks() + t.num_pages();
    }
    device = rows > 0 && rows >= options_.level_scorer_min_rows;
  }
  const bool gemm = options_.algorithm == SelectAlgorithm::kGemm || device;
  if (gemm) {
    // One pass over the stacked grid, chunk and page rows of every key-key
    // context of the batch.
    offsets.assign(requests.size() + 1, 0);
    for (size_t i = 0; i < requests.size(); ++i) {
      const ContextTree& t = requests[i].context->tree();
      const bool key_key = TreeKeyKey(requests[i]);
      offsets[i + 1] = offsets[i] + (key_key ? t.num_grids() + t.num_chunks() + t.num_pages() : 0);
    }
    gemm_scores_.resize(offsets.back());
    bool scored = false;
    if (device) {
      level_jobs_.clear();
      level_anchors_.resize(0);
      for (const SelectRequest& r : requests) {
        if (TreeKeyKey(r)) level_anchors_.resize(level_anchors_.size() + r.anchor.size());
      }
      size_t at = 0;
      for (const SelectRequest& r : requests) {
        if (!TreeKeyKey(r)) continue;
        UnitVector(r.anchor.data(), r.anchor.size(), level_anchors_.data() + at);
        level_jobs_.push_back({r.context, level_anchors_.data() + at});
        at += r.anchor.size();
      }
      level_status_ = level_scorer_->ScoreLevels(level_jobs_, gemm_scores_.data());
      scored = level_status_.ok();
      if (scored) ++level_batches_;
    }
    if (!scored) {
      pool_->ParallelFor(
          static_cast<int64_t>(requests.size()), options_.num_threads,
          [&](int32_t w, int64_t i) {
            if (offsets[i + 1] == offsets[i]) return;
            const ContextTree& t = requests[i].context->tree();
            Scratch* s = scratch_[w].get();
            s->all_grid = gemm_scores_.data() + offsets[i];
            s->all_chunk = s->all_grid + t.num_grids();
            s->all_page = s->all_chunk + t.num_chunks();
            ScoreAllLevels(requests[i], s);
          },
          options_.pool_lane);
    }
  }
  pool_->ParallelFor(
      static_cast<int64_t>(requests.size()), options_.num_threads,
      [&](int32_t w, int64_t i) {
        Scratch* s = scratch_[w].get();
        s->all_grid = s->all_chunk = s->all_page = nullptr;
        s->head_slots = requests.size() == 1 ? options_.num_threads : 1;
        if (gemm) {
          const ContextTree& t = requests[i].context->tree();
          s->all_grid = gemm_scores_.data() + offsets[i];
          s->all_chunk = s->all_grid + t.num_grids();
          s->all_page = s->all_chunk + t.num_chunks();
        }
        Run(requests[i], budgets[i], s, &results[i]);
      },
      options_.pool_lane);
  return absl::OkStatus();
}

}  // namespace kvtier::index
