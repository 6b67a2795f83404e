// Per-step block selection for one or many contexts.
//
// Key-key scorers (kKeyKey, kKeyKeyWeighted) run the hierarchy of the
// context's tree:
//   1. q = anchor / |anchor|; affinity of a row = (1 + q . row) / 2.
//   2. Grids: keep the best ceil(grid_keep_fraction * G) grids.
//   3. Chunks of kept grids: keep the best ceil(chunk_keep_fraction * n).
//   4. Pages of kept chunks are the candidates; a page under a dropped grid
//      or chunk scores 0 and is never chosen (unless held, below).
//   Levels 2 and 3 keep more than their fraction when needed so that the
//   candidates number at least ceil(free / page_keep_fraction) pages, where
//   free = budget - (sink + local blocks): the chosen pages are at most
//   page_keep_fraction of the candidates, and any budget can be filled.
//   Lower page_keep_fraction = more candidates = higher recall, more work.
// A key-key request whose anchor has num_layers x head_dim values is
// scored flat over the context's per-layer means instead (key_scorers.h:
// mean over layers of the cosine, centred on the context's mean direction
// when `centered`), then mixed with recency:
//   affinity = (1 - recency_weight) * minmax(score) + recency_weight * (b + 1) / n.
// kMass scores flat with the context's calibration (key_scorers.h), or,
// for contexts of at least mass_tree.min_blocks pages, sparsely (below).
// Other scorers score every page flat with ScoreBlocks (scorer.h) on the
// context's kept summaries (TreeOptions::keep_summaries); kKeyDiff, kRecency
// and kRandom need no summaries. Raw scores (Quest, ArkVale, mass) are
// min-max normalised per step to [0, 1] to serve as affinities.
//
// Then, for every scorer: sinks (first sink_blocks pages) and the local
// window (last local_blocks pages) are always chosen (for kMass, a
// calibrated context's own sink_blocks / local_blocks replace the
// options' when set); the stability windows
// are updated with "affinity > theta" for every scored page; pages chosen at
// the previous step whose stability is >= hold_threshold stay candidates
// even when the masks skipped them this step; the remaining budget goes to
// the best
//   (1 - stability.weight) * affinity + stability.weight * stability
// (ties to the lower page index; for kMass to the higher, more recent one).
// Rising pages (stability.h) that were not chosen are returned as prefetch
// candidates, most stable first.
//
// The mass scorer's sparse path (selector_mass.cc): the estimate of page b
// is prior[distance of b] plus the retrieval heads' term, which a gated
// calibration (head_min_mass > 0) gives to a few pages only. Those pages
// come from the mass tree (mass_tree.h) instead of a pass over every
// token; every other page's estimate is its prior, a function of its
// distance alone, so the ranking walks the distances in prior order and
// touches the chosen pages, the pages above theta and the pages never
// observed, never all N. The ranking is the flat pass's for the same
// estimates (min-max affinities, ties to the more recent page, the same
// stability bits); the estimates differ from the flat pass's only where
// the mass tree's do (a page it did not open, an estimated z). Used for
// requests ranked without stability (select.stability_scorers does not
// list mass, the shipped default), calibrated contexts with
// head_min_mass > 0 or without head queries (the prior alone); others score
// flat. The tree's step-to-step reuse state is the context's
// (ContextIndex::mass_reuse(), mass_tree.h), started at request.step.
//
// kGemm scores every level of every context of a batch in one pass over the
// stacked rows (the shape a GPU kernel takes), then masks. kDescent scores
// grids, then only the chunks of kept grids, then only the pages of kept
// chunks. Both give identical results at the same options (the per-row
// kernel is deterministic, simd.h); kDescent reads far fewer rows and is the
// default (bench/select measures both).
//
// Level scorer (SelectorOptions::level_scorer, level_scorer.h): when set,
// batches whose pooled key-key contexts stack at least
// level_scorer_min_rows level rows are scored in that one pass on the
// scorer (a GPU, gpu_scoring.h) whatever the algorithm, then ranked here as
// kGemm ranks; results equal the CPU's up to the scorer's fp32 summation
// order (identical where no two candidates are that close). If the scorer
// fails, the batch is scored on the CPU and the error is kept in
// last_level_scorer_status().
//
// Allocation: once its buffers, the results' and the contexts' stability
// state have grown to a workload's sizes, a step allocates nothing
// (selector_alloc_test.cc counts).
//
// Thread safety: a Selector is not thread-safe (it owns scratch buffers);
// use one per calling thread. A context is used by one Select at a time:
// the caller serialises per context (a batch must not name a context
// twice). With num_threads > 1, SelectBatch spreads contexts over at most
// num_threads threads (a batch of one context: the mass tree's retrieval
// heads, mass_tree.h): the caller's and those of SelectorOptions::pool
// (worker_pool.h), shared by any number of Selectors, or of a pool of
// num_threads - 1 threads the Selector makes for itself when none is given.
#ifndef KVTIER_INDEX_SELECT_SELECTOR_H_
#define KVTIER_INDEX_SELECT_SELECTOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "index/context_index.h"
#include "index/context_tree.h"
#include "index/select/level_scorer.h"
#include "index/select/mass_tree.h"
#include "index/select/rank.h"
#include "index/select/scorer.h"
#include "index/select/stability.h"
#include "index/select/worker_pool.h"

namespace kvtier::index {

enum class SelectAlgorithm : uint8_t { kDescent = 0, kGemm = 1 };

// The initialisers of the fields the daemon's select.* keys set are the
// shipped daemon's (ConfigTest.ShippedSelectorSettingsAreTheLibraryDefaults
// checks every one), so a Selector built in code selects as kvtierd does.
struct SelectorOptions {
  double grid_keep_fraction = 0.5;   // (0, 1]
  double chunk_keep_fraction = 0.2;  // (0, 1]
  double page_keep_fraction = 1.0;   // (0, 1]
  int32_t sink_blocks = 1;           // >= 0; first pages, always chosen
  int32_t local_blocks = 1;          // >= 0; last pages, always chosen
  int32_t max_prefetch_blocks = 64;  // >= 0
  SelectAlgorithm algorithm = SelectAlgorithm::kDescent;
  StabilityOptions stability;
  int32_t num_threads = 1;  // [1, 256]; threads one SelectBatch may use
  // Threads that help SelectBatch (shared with other Selectors); null: a
  // pool of num_threads - 1 threads owned by the Selector.
  std::shared_ptr<WorkerPool> pool;
  // The lane this Selector's calls take in the pool (worker_pool.h: a free
  // helper joins the lane with fewest helpers). The daemon gives each
  // tenant's Selectors one lane; 0 for callers that do not share a pool.
  uint64_t pool_lane = 0;
  // The mass scorer's sparse path (mass_tree.h); contexts below
  // mass_tree.min_blocks pages score flat.
  MassTreeOptions mass_tree;
  // Makes the level scorer of each Selector (called once by Create); null,
  // or a factory returning an error, scores on the CPU only.
  std::function<absl::StatusOr<std::unique_ptr<LevelScorer>>()> level_scorer;
  int64_t level_scorer_min_rows = 0;  // >= 0
  // The mass scorer without a calibration or head queries is a sliding
  // window (affinity = position). Selected exactly as the flat pass would,
  // it touches only the pages with affinity above stability.theta (and any
  // page never observed before) instead of all N; when that set cannot
  // decide the budget it falls back to the flat pass. false: always the
  // flat pass (for comparison).
  bool window_fast_path = true;
};

// InvalidArgument naming the field when out of range.
absl::Status ValidateSelectorOptions(const SelectorOptions& options);

struct SelectRequest {
  ContextIndex* context = nullptr;
  // Key-key scorers: [dim] (pooled over layers and KV heads; the tree) or
  // [num_layers][dim] (per layer; needs ContextIndexOptions::
  // keep_layer_means).
  absl::Span<const float> anchor;
  absl::Span<const float> query;  // [dim], kQuest / kArkVale
  // kMass: the current queries of the calibration's retrieval heads,
  // [R][dim] in calibration order; empty = the prior alone.
  absl::Span<const float> head_queries;
  // Whether the stability filter ranks this request (weight and holding);
  // the windows are updated either way.
  bool stability = true;
  // Per-layer key-key only (see above).
  bool centered = true;
  float recency_weight = 0.5f;  // [0, 1]
  ScorerKind scorer = ScorerKind::kKeyKey;
  // Exactly one budget > 0. Tokens convert to floor(tokens /
  // block_size_tokens) blocks. The budget includes sinks and local blocks.
  int64_t budget_blocks = 0;
  int64_t budget_tokens = 0;
  int64_t step = 0;   // non-decreasing per context
  uint64_t seed = 0;  // kRandom
};

struct SelectResult {
  std::vector<int64_t> blocks;  // chosen page indices, ascending
  // Per chosen page: the affinity it was ranked by this step, in [0, 1]
  // (0 when not scored this step: held, or the whole context fit).
  std::vector<float> scores;
  std::vector<int64_t> prefetch;  // rising, not chosen, most stable first
  int64_t rows_scored = 0;        // dot products computed (all levels)
  int64_t candidates = 0;         // pages that competed for the budget
  int64_t held = 0;               // of which held by stability only
  // The mass scorer's sparse path (0 when it did not run): pages whose
  // retrieval keys were read (summed over heads; the flat pass reads all
  // n x R), page and chunk summaries screened.
  int64_t mass_pages_opened = 0;
  int64_t mass_pages_screened = 0;
  int64_t mass_chunks_screened = 0;
  // Of the retrieval heads with a query: those that reused their last
  // steps' pages and those that descended the tree (mass_tree.h).
  int64_t mass_heads_reused = 0;
  int64_t mass_heads_descended = 0;
  bool mass_sparse = false;  // the sparse path ranked this request
};

class Selector {
 public:
  static absl::StatusOr<std::unique_ptr<Selector>> Create(const SelectorOptions& options);
  ~Selector();

  const SelectorOptions& options() const { return options_; }

  // The level scorer in use (null: CPU only), why the factory gave none
  // (OK when it did or none was asked for), the last scoring error (OK
  // after a success), and how many batches it scored.
  const LevelScorer* level_scorer() const { return level_scorer_.get(); }
  const absl::Status& level_scorer_create_status() const { return level_create_status_; }
  const absl::Status& last_level_scorer_status() const { return level_status_; }
  int64_t level_scorer_batches() const { return level_batches_; }

  // Selects for one context. *result is overwritten (its capacity reused).
  // InvalidArgument naming the field for a bad request (null context, anchor
  // or query of the wrong dimension (the message names the sizes that fit),
  // head_queries not R x dim, NaN/Inf or zero norm, recency_weight outside
  // [0, 1], empty context,
  // no or zero budget, budget below sink + local blocks, step going back);
  // FailedPrecondition when the context lacks what the scorer needs. On
  // error the context's stability state is unchanged.
  absl::Status Select(const SelectRequest& request, SelectResult* result);

  // Selects for many contexts at once; results.size() == requests.size().
  // Every request is validated first: an invalid one fails the call
  // (naming requests[i]) before any context is touched.
  absl::Status SelectBatch(absl::Span<const SelectRequest> requests,
                           absl::Span<SelectResult> results);

 private:
  struct Scratch;
  explicit Selector(const SelectorOptions& options);
  absl::Status Validate(const SelectRequest& r, int64_t* budget) const;
  void ScoreAllLevels(const SelectRequest& r, Scratch* s);
  void Run(const SelectRequest& r, int64_t budget, Scratch* s, SelectResult* out);
  // The shape of a request's budget that Run plans first: the context's n
  // pages, its sink and local blocks (the local ones from local_first) and
  // the free budget left for the others.
  struct RunPlan {
    int64_t n = 0, sinks = 0, locals = 0, local_first = 0, free = 0;
  };
  // Run's steps after the plan: the scores (the key-key tree descent, or
  // every page by its scorer), then stability and the ranking. RunWindow is
  // the uncalibrated mass scorer's window path (selector.cc says when it
  // decides the budget exactly); false, with nothing in *out, when not.
  bool RunWindow(const SelectRequest& r, const RunPlan& plan, Scratch* s, SelectResult* out);
  void ScoreTree(const SelectRequest& r, const RunPlan& plan, bool gemm, Scratch* s,
                 SelectResult* out);
  void ScoreFlat(const SelectRequest& r, const RunPlan& plan, Scratch* s, SelectResult* out);
  // The sink and local blocks of a request: for kMass its context's
  // calibration's when set, else the options'.
  int32_t SinkBlocks(const SelectRequest& r) const;
  int32_t LocalBlocks(const SelectRequest& r) const;
  // The mass scorer's sparse path (selector_mass.cc); false, with nothing
  // changed, when the request is not one it serves.
  bool RunMassSparse(const SelectRequest& r, const RunPlan& plan, Scratch* s, SelectResult* out);
  // The final ranking's options for this request (rank.h).
  RankOptions RankOptionsFor(const SelectRequest& r) const;
  // RankPool (rank.h) of s->rank.pool over s->affinity with those options.
  void FinishRanking(const SelectRequest& r, const RankShape& shape, bool partitioned, Scratch* s,
                     SelectResult* out);

  const SelectorOptions options_;
  std::vector<std::unique_ptr<Scratch>> scratch_;  // one per thread
  std::vector<float> gemm_scores_;                 // kGemm: every level
  std::vector<int64_t> batch_budgets_;             // reused per batch
  std::vector<size_t> batch_offsets_;
  std::vector<const ContextIndex*> batch_contexts_;
  std::shared_ptr<WorkerPool> pool_;
  // Level scorer; the jobs and unit anchors of a batch are reused.
  std::unique_ptr<LevelScorer> level_scorer_;
  absl::Status level_create_status_;
  absl::Status level_status_;
  int64_t level_batches_ = 0;
  std::vector<LevelJob> level_jobs_;
  std::vector<float> level_anchors_;
};

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_SELECT_SELECTOR_H_
