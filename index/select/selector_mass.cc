// The mass scorer's sparse path (selector.h): estimates from the prior and
// the mass tree's bumps, ranked without visiting every page.
#include <algorithm>
#include <cmath>

#include "index/select/mass_tree.h"
#include "index/select/selector.h"
#include "index/select/selector_internal.h"

namespace kvtier::index {

using namespace selector_internal;  // NOLINT: the Selector's own internals

namespace {

// Distances d in [0, prior.size() - 1) by prior desc, then d asc (the more
// recent page first): the order in which the flat pass ranks pages that
// carry no retrieval term. The last entry stands for every larger distance
// and is placed by the caller.
void PriorOrder(const std::vector<float>& prior, std::vector<int32_t>* order) {
  const int32_t last = static_cast<int32_t>(prior.size()) - 1;
  order->resize(last);
  for (int32_t d = 0; d < last; ++d) (*order)[d] = d;
  std::sort(order->begin(), order->end(), [&prior](int32_t a, int32_t b) {
    return prior[a] > prior[b] || (prior[a] == prior[b] && a < b);
  });
}

// What the sparse path ranks over: the calibration's prior by distance (its
// last entry stands for every larger distance), the page count and the
// request's sink, local and free budget.
struct SparseShape {
  const SelectionCalibration& c;
  const std::vector<float>& prior;
  bool with_queries;
  int64_t n, last, sinks, local_first, free;
  // Page b's estimate without a retrieval term, as the flat pass has it.
  float Base(int64_t b) const { return PriorOf(c, with_queries, n, b); }
};

// Whether page p has an entry in bumps (ascending by page, one per page).
bool IsBumped(const std::vector<MassBump>& bumps, int64_t p) {
  auto it = std::lower_bound(bumps.begin(), bumps.end(), p,
                             [](const MassBump& x, int64_t q) { return x.page < q; });
  return it != bumps.end() && it->page == p;
}

// Turns *bumps (ascending, one entry per (page, head)) into one entry per
// page holding its estimate as the flat pass sums it: the prior, then each
// head's term in calibration order. A calibrated sink (the first block's
// estimate is not its distance's prior) is added as page 0, so that it is
// ranked with the bumped pages, not in the prior walk.
void SumBumpsPerPage(const SparseShape& sh, std::vector<MassBump>* bumps) {
  std::vector<MassBump>& v = *bumps;
  size_t kept = 0;
  for (size_t i = 0; i < v.size();) {
    const int64_t b = v[i].page;
    float est = sh.Base(b);
    for (; i < v.size() && v[i].page == b; ++i) est += v[i].mass;
    v[kept++] = {b, est};
  }
  v.resize(kept);
  if (sh.Base(0) != sh.prior[std::min<int64_t>(sh.n - 1, sh.last)] &&
      (v.empty() || v.front().page != 0)) {
    v.insert(v.begin(), {0, sh.Base(0)});
  }
}

// The calibration's retrieval_share: at most that share of the free budget
// goes to pages for their retrieval terms (the largest terms); the bumps of
// the other pages in [sinks, local_first) are dropped. *terms and *dropped
// are scratch.
void CapBumpedRetrievalTerms(const SparseShape& sh, std::vector<MassBump>* bumps,
                             std::vector<ScoredIndex>* terms, std::vector<int32_t>* dropped) {
  terms->clear();
  for (const MassBump& b : *bumps) {
    if (b.page >= sh.sinks && b.page < sh.local_first && b.mass > sh.Base(b.page)) {
      terms->push_back({b.mass - sh.Base(b.page), static_cast<int32_t>(b.page)});
    }
  }
  const size_t keep = static_cast<size_t>(
      std::floor(static_cast<double>(sh.c.retrieval_share) * std::max<int64_t>(sh.free, 0)));
  if (terms->size() <= keep) return;
  std::nth_element(terms->begin(), terms->begin() + keep, terms->end(), ByBetterRecent());
  dropped->clear();
  for (size_t i = keep; i < terms->size(); ++i) dropped->push_back((*terms)[i].index);
  std::sort(dropped->begin(), dropped->end());
  bumps->erase(std::remove_if(bumps->begin(), bumps->end(),
                              [&](const MassBump& b) {
                                return std::binary_search(dropped->begin(), dropped->end(),
                                                          static_cast<int32_t>(b.page));
                              }),
               bumps->end());
}

// Min-max scaling of an estimate to an affinity in [0, 1] (0.5 when every
// estimate is equal).
struct AffinityScale {
  float lo = INFINITY;
  float range = 0;
  float operator()(float est) const { return range > 0 ? (est - lo) / range : 0.5f; }
};

// The scale over all n pages' estimates: the prior of every distance that
// has a page without a bump, and the bumped estimates.
AffinityScale EstimateScale(const SparseShape& sh, const std::vector<MassBump>& bumps) {
  float lo = INFINITY, hi = -INFINITY;
  for (int64_t d = 0; d < std::min<int64_t>(sh.n, sh.last); ++d) {
    if (IsBumped(bumps, sh.n - 1 - d)) continue;
    lo = std::min(lo, sh.prior[d]);
    hi = std::max(hi, sh.prior[d]);
  }
  if (sh.n > sh.last) {
    int64_t far_bumped = 0;
    for (const MassBump& b : bumps) far_bumped += (sh.n - 1 - b.page) >= sh.last;
    if (sh.n - sh.last > far_bumped) {
      lo = std::min(lo, sh.prior[sh.last]);
      hi = std::max(hi, sh.prior[sh.last]);
    }
  }
  for (const MassBump& b : bumps) {
    lo = std::min(lo, b.mass);
    hi = std::max(hi, b.mass);
  }
  return AffinityScale{lo, hi - lo};
}

// Records page p's affinity for this step and whether it is above theta.
struct Observer {
  float theta;
  StabilityTracker& tracker;
  std::vector<float>& affinity;  // [N]
  void operator()(int64_t p, float a) const {
    affinity[p] = a;
    tracker.Observe(p, a > theta);
  }
};

// One step of the sparse ranking: the context's shape, the pages with a
// retrieval term (ascending), the affinity scale and the observer.
struct SparseStep {
  const SparseShape& sh;
  const std::vector<MassBump>& bumps;
  const AffinityScale& scale;
  const Observer& observe;
};

// Observes the pages the pool walk does not: pages never observed (their
// first observation dates their life, as in the flat pass), the bumped
// pages, and the sinks and locals. Every other page not touched reads the
// 0 bit the flat pass would write: its affinity is at most theta.
void ObserveFixedPages(const SparseStep& step) {
  const SparseShape& sh = step.sh;
  const std::vector<MassBump>& bumps = step.bumps;
  const AffinityScale& scale = step.scale;
  const Observer& observe = step.observe;
  StabilityTracker& st = observe.tracker;
  for (int64_t p = std::min(st.observed_below(), sh.n); p < sh.n; ++p) {
    observe(p, scale(IsBumped(bumps, p) ? 0.0f : sh.Base(p)));
  }
  for (const MassBump& b : bumps) observe(b.page, scale(b.mass));
  st.RaiseObservedBelow(sh.n);
  for (int64_t p = 0; p < sh.sinks; ++p) {
    if (!IsBumped(bumps, p)) observe(p, scale(sh.Base(p)));
  }
  for (int64_t p = sh.local_first; p < sh.n; ++p) {
    if (!IsBumped(bumps, p)) observe(p, scale(sh.Base(p)));
  }
}

// Fills *pool: every bumped page in [sinks, local_first), then pages
// without a bump in the flat pass's order until `free` of them are in and
// every one above theta is (each observed as it goes in). *order_buf is
// scratch for the prior order.
void FillPool(const SparseStep& step, std::vector<int32_t>* order_buf,
              std::vector<ScoredIndex>* pool) {
  const SparseShape& sh = step.sh;
  const std::vector<MassBump>& bumps = step.bumps;
  const AffinityScale& scale = step.scale;
  const Observer& observe = step.observe;
  const int64_t n = sh.n;
  pool->clear();
  for (const MassBump& b : bumps) {
    if (b.page >= sh.sinks && b.page < sh.local_first) {
      pool->push_back({observe.affinity[b.page], static_cast<int32_t>(b.page)});
    }
  }
  const std::vector<float>& prior = sh.prior;
  std::vector<int32_t>& order = *order_buf;
  PriorOrder(prior, &order);
  int64_t taken = 0;
  auto enough = [&](float a) { return taken >= sh.free && !(a > observe.theta); };
  auto consider = [&](int64_t d) {
    const int64_t p = n - 1 - d;
    if (p < sh.sinks || p >= sh.local_first || IsBumped(bumps, p)) return;
    const float a = scale(sh.Base(p));
    observe(p, a);
    pool->push_back({a, static_cast<int32_t>(p)});
    ++taken;
  };
  const float far = prior[sh.last];
  size_t i = 0;
  // Distances whose prior is at least the far region's come before it.
  for (; i < order.size() && prior[order[i]] >= far; ++i) {
    if (enough(scale(prior[order[i]]))) break;
    if (order[i] < n) consider(order[i]);
  }
  if (i == order.size() || prior[order[i]] < far) {
    for (int64_t d = sh.last; d < n && !enough(scale(far)); ++d) consider(d);
  }
  for (; i < order.size(); ++i) {
    if (enough(scale(prior[order[i]]))) break;
    if (order[i] < n) consider(order[i]);
  }
}

}  // namespace

namespace selector_internal {

void CapRetrievalTerms(const SelectionCalibration& c, bool with_queries, const RankShape& shape,
                       absl::Span<float> est, std::vector<ScoredIndex>* scratch) {
  const int64_t sinks = shape.sinks, local_first = shape.local_first, free = shape.free;
  if (!c.calibrated() || !with_queries || !(c.retrieval_share < 1.0f)) return;
  const int64_t n = static_cast<int64_t>(est.size());
  auto base = [&](int64_t b) { return PriorOf(c, /*with_queries=*/true, n, b); };
  const size_t keep = static_cast<size_t>(
      std::floor(static_cast<double>(c.retrieval_share) * std::max<int64_t>(free, 0)));
  scratch->clear();
  for (int64_t b = sinks; b < local_first; ++b) {
    if (est[b] > base(b)) scratch->push_back({est[b] - base(b), static_cast<int32_t>(b)});
  }
  if (scratch->size() <= keep) return;
  std::nth_element(scratch->begin(), scratch->begin() + keep, scratch->end(), ByBetterRecent());
  for (size_t i = keep; i < scratch->size(); ++i) {
    est[(*scratch)[i].index] = base((*scratch)[i].index);
  }
}

}  // namespace selector_internal

int32_t Selector::SinkBlocks(const SelectRequest& r) const {
  const int32_t own = r.context->calibration().sink_blocks;
  return r.scorer == ScorerKind::kMass && own >= 0 ? own : options_.sink_blocks;
}

int32_t Selector::LocalBlocks(const SelectRequest& r) const {
  const int32_t own = r.context->calibration().local_blocks;
  return r.scorer == ScorerKind::kMass && own >= 0 ? own : options_.local_blocks;
}

bool Selector::RunMassSparse(const SelectRequest& r, const RunPlan& plan, Scratch* s,
                             SelectResult* out) {
  const int64_t sinks = plan.sinks, locals = plan.locals, free = plan.free;
  ContextIndex& ctx = *r.context;
  const SelectionCalibration& c = ctx.calibration();
  const int64_t n = ctx.tree().num_pages();
  const bool with_queries = !r.head_queries.empty();
  if (r.stability || !c.calibrated() || n < options_.mass_tree.min_blocks || n < 2 ||
      (with_queries && !(MinHeadMass(c) > 0))) {
    return false;
  }
  const std::vector<float>& prior = with_queries ? c.prior : c.prior_all;
  const int64_t last = static_cast<int64_t>(prior.size()) - 1;

  // The retrieval term: a few pages, ascending, one entry per (page, head).
  std::vector<MassBump>& bumps = s->bumps;
  bumps.clear();
  if (with_queries) {
    MassTreeStats stats;
    MassMemory& memory = ctx.mass_memory();
    memory.Begin(r.step);
    MassTreeInput in;
    in.table = ctx.keys();
    in.calibration = &c;
    in.slots = ctx.key_slots();
    in.dim = ctx.tree().dim();
    in.head_queries = r.head_queries;
    in.memory = &memory;
    MassReuse& reuse = ctx.mass_reuse();
    reuse.Begin(r.step, c.retrieval_heads.size());
    in.reuse = &reuse;
    in.pool = pool_.get();
    in.max_slots = s->head_slots;
    in.pool_lane = options_.pool_lane;
    if (!MassTreeBumps(in, options_.mass_tree, &s->mass, &bumps, &stats).ok()) {
      return false;  // validated before; the flat pass reports anything left
    }
    out->mass_pages_opened = stats.pages_opened;
    out->mass_pages_screened = stats.pages_screened;
    out->mass_chunks_screened = stats.chunks_screened;
    out->mass_heads_reused = stats.heads_reused;
    out->mass_heads_descended = stats.heads_descended;
  }
  const SparseShape sh{c, prior, with_queries, n, last, sinks, n - locals, free};
  SumBumpsPerPage(sh, &bumps);
  if (with_queries && c.retrieval_share < 1.0f) {
    CapBumpedRetrievalTerms(sh, &bumps, &s->rank.pool, &s->order);
  }
  const AffinityScale scale = EstimateScale(sh, bumps);
  const StabilityOptions& so = options_.stability;
  // Every page of the far region would be above theta: that is no sparse
  // ranking (and no calibration the harness makes); score flat.
  if (n > last && scale(prior[last]) > so.theta) return false;

  const Observer observe{so.theta, ctx.stability(), s->affinity};
  const SparseStep step{sh, bumps, scale, observe};
  ObserveFixedPages(step);
  FillPool(step, &s->order, &s->rank.pool);
  // Dot products: T per opened page, 3 per screened summary.
  const int64_t tokens = with_queries ? ctx.keys()->options().key_tokens : 0;
  out->rows_scored =
      out->mass_pages_opened * tokens + 3 * (out->mass_pages_screened + out->mass_chunks_screened);
  out->mass_sparse = true;
  FinishRanking(r, RankShape{n, sinks, sh.local_first, free}, /*partitioned=*/false, s, out);
  return true;
}

}  // namespace kvtier::index
