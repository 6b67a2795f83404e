// The mass scorer's sparse path (selector.h): estimates from the prior and
// the mass tree's bumps, ranked without visiting every page.
#include <algorithm>
#include <cmath>

#include "index/mass_tree.h"
#include "index/selector.h"
#include "index/selector_internal.h"

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

}  // namespace

namespace selector_internal {

void CapRetrievalTerms(const SelectionCalibration& c, bool with_queries, int64_t sinks,
                       int64_t local_first, int64_t free, absl::Span<float> est,
                       std::vector<ScoredIndex>* scratch) {
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

bool Selector::RunMassSparse(const SelectRequest& r, int64_t sinks, int64_t locals, int64_t free,
                             Scratch* s, SelectResult* out) {
  ContextIndex& ctx = *r.context;
  const SelectionCalibration& c = ctx.calibration();
  const int64_t n = ctx.tree().num_pages();
  const bool with_queries = !r.head_queries.empty();
  if (r.stability || !c.calibrated() || n < options_.mass_tree.min_pages || n < 2 ||
      (with_queries && !(c.head_min_mass > 0))) {
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
    if (!MassTreeBumps(*ctx.keys(), c, ctx.key_slots(), ctx.tree().dim(), r.head_queries,
                       options_.mass_tree, &s->mass, &bumps, &stats, &memory.previous,
                       &memory.current)
             .ok()) {
      return false;  // validated before; the flat pass reports anything left
    }
    out->mass_pages_opened = stats.pages_opened;
    out->mass_pages_screened = stats.pages_screened;
    out->mass_chunks_screened = stats.chunks_screened;
  }
  auto base = [&](int64_t b) { return PriorOf(c, with_queries, n, b); };
  // Estimates of the bumped pages, as the flat pass sums them: the prior,
  // then each head's term in calibration order. One entry per page after
  // this (the first of its run holds the sum).
  size_t kept = 0;
  for (size_t i = 0; i < bumps.size();) {
    const int64_t b = bumps[i].page;
    float est = base(b);
    for (; i < bumps.size() && bumps[i].page == b; ++i) est += bumps[i].mass;
    bumps[kept++] = {b, est};
  }
  bumps.resize(kept);
  // A calibrated sink: the first block's estimate is not its distance's
  // prior, so it is ranked with the bumped pages, not in the prior walk.
  if (base(0) != prior[std::min<int64_t>(n - 1, last)] &&
      (bumps.empty() || bumps.front().page != 0)) {
    bumps.insert(bumps.begin(), {0, base(0)});
  }
  // The calibration's retrieval_share: at most that share of the free
  // budget goes to pages for their retrieval terms (the largest terms).
  if (with_queries && c.retrieval_share < 1.0f) {
    const int64_t local_first0 = n - locals;
    std::vector<ScoredIndex>& terms = s->pool;
    terms.clear();
    for (const MassBump& b : bumps) {
      if (b.page >= sinks && b.page < local_first0 && b.mass > base(b.page)) {
        terms.push_back({b.mass - base(b.page), static_cast<int32_t>(b.page)});
      }
    }
    const size_t keep = static_cast<size_t>(
        std::floor(static_cast<double>(c.retrieval_share) * std::max<int64_t>(free, 0)));
    if (terms.size() > keep) {
      std::nth_element(terms.begin(), terms.begin() + keep, terms.end(), ByBetterRecent());
      std::vector<int32_t>& dropped = s->order;
      dropped.clear();
      for (size_t i = keep; i < terms.size(); ++i) dropped.push_back(terms[i].index);
      std::sort(dropped.begin(), dropped.end());
      bumps.erase(std::remove_if(bumps.begin(), bumps.end(),
                                 [&](const MassBump& b) {
                                   return std::binary_search(dropped.begin(), dropped.end(),
                                                             static_cast<int32_t>(b.page));
                                 }),
                  bumps.end());
    }
  }
  auto bumped = [&](int64_t b) {
    auto it = std::lower_bound(bumps.begin(), bumps.end(), b,
                               [](const MassBump& x, int64_t p) { return x.page < p; });
    return it != bumps.end() && it->page == b;
  };

  // Min and max of the estimates over all n pages: the prior of every
  // distance that has a page without a bump, and the bumped estimates.
  float lo = INFINITY, hi = -INFINITY;
  for (int64_t d = 0; d < std::min<int64_t>(n, last); ++d) {
    if (bumped(n - 1 - d)) continue;
    lo = std::min(lo, prior[d]);
    hi = std::max(hi, prior[d]);
  }
  if (n > last) {
    int64_t far_bumped = 0;
    for (const MassBump& b : bumps) far_bumped += (n - 1 - b.page) >= last;
    if (n - last > far_bumped) {
      lo = std::min(lo, prior[last]);
      hi = std::max(hi, prior[last]);
    }
  }
  for (const MassBump& b : bumps) {
    lo = std::min(lo, b.mass);
    hi = std::max(hi, b.mass);
  }
  const float range = hi - lo;
  auto affinity = [&](float est) { return range > 0 ? (est - lo) / range : 0.5f; };
  const StabilityOptions& so = options_.stability;
  // Every page of the far region would be above theta: that is no sparse
  // ranking (and no calibration the harness makes); score flat.
  if (n > last && affinity(prior[last]) > so.theta) return false;

  StabilityTracker& st = ctx.stability();
  const int64_t local_first = n - locals;
  auto observe = [&](int64_t p, float a) {
    s->affinity[p] = a;
    st.Observe(p, a > so.theta);
  };
  // Pages never observed: their first observation dates their life, as in
  // the flat pass (every other page not touched below reads the 0 bit the
  // flat pass would write: its affinity is at most theta).
  for (int64_t p = std::min(st.observed_below(), n); p < n; ++p) {
    observe(p, affinity(bumped(p) ? 0.0f : base(p)));
  }
  for (const MassBump& b : bumps) observe(b.page, affinity(b.mass));
  st.RaiseObservedBelow(n);
  for (int64_t p = 0; p < sinks; ++p) {
    if (!bumped(p)) observe(p, affinity(base(p)));
  }
  for (int64_t p = local_first; p < n; ++p) {
    if (!bumped(p)) observe(p, affinity(base(p)));
  }

  // The pool: every bumped page in [sinks, local_first), then pages without
  // a bump in the flat pass's order until `free` of them are in and every
  // one above theta is.
  s->pool.clear();
  for (const MassBump& b : bumps) {
    if (b.page >= sinks && b.page < local_first) {
      s->pool.push_back({s->affinity[b.page], static_cast<int32_t>(b.page)});
    }
  }
  std::vector<int32_t>& order = s->order;
  PriorOrder(prior, &order);
  int64_t taken = 0;
  auto enough = [&](float a) { return taken >= free && !(a > so.theta); };
  auto consider = [&](int64_t d) {
    const int64_t p = n - 1 - d;
    if (p < sinks || p >= local_first || bumped(p)) return;
    const float a = affinity(base(p));
    observe(p, a);
    s->pool.push_back({a, static_cast<int32_t>(p)});
    ++taken;
  };
  const float far = prior[last];
  size_t i = 0;
  // Distances whose prior is at least the far region's come before it.
  for (; i < order.size() && prior[order[i]] >= far; ++i) {
    if (enough(affinity(prior[order[i]]))) break;
    if (order[i] < n) consider(order[i]);
  }
  if (i == order.size() || prior[order[i]] < far) {
    for (int64_t d = last; d < n && !enough(affinity(far)); ++d) consider(d);
  }
  for (; i < order.size(); ++i) {
    if (enough(affinity(prior[order[i]]))) break;
    if (order[i] < n) consider(order[i]);
  }
  // Dot products: T per opened page, 3 per screened summary.
  const int64_t tokens = with_queries ? ctx.keys()->options().key_tokens : 0;
  out->rows_scored =
      out->mass_pages_opened * tokens + 3 * (out->mass_pages_screened + out->mass_chunks_screened);
  out->mass_sparse = true;
  FinishRanking(r, sinks, local_first, n, free, /*partitioned=*/false, s, out);
  return true;
}

}  // namespace kvtier::index
