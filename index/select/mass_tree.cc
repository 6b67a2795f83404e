#include "index/select/mass_tree.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "index/kernels/int8_dot.h"
#include "index/kernels/simd.h"
#include "index/summary/summary.h"

namespace kvtier::index {
namespace {

using Unit = MassTreeScratch::Unit;

// The higher screen first, then the lower index (a total order, so the
// descent is deterministic).
struct BetterUnit {
  bool operator()(const Unit& a, const Unit& b) const {
    if (a.screen != b.screen) return a.screen > b.screen;
    return a.index < b.index;
  }
};

using PageShare = MassTreeScratch::PageShare;

// Sorts by page and sums the shares of each page into one entry.
void MergeShares(std::vector<PageShare>* shares) {
  std::sort(shares->begin(), shares->end(),
            [](const PageShare& a, const PageShare& b) { return a.page < b.page; });
  size_t out = 0;
  for (size_t i = 0; i < shares->size(); ++i) {
    if (out > 0 && (*shares)[out - 1].page == (*shares)[i].page) {
      (*shares)[out - 1].share += (*shares)[i].share;
    } else {
      (*shares)[out++] = (*shares)[i];
    }
  }
  shares->resize(out);
}

double LogAddExp(double a, double b) {
  if (a == -INFINITY) return b;
  if (b == -INFINITY) return a;
  const double hi = std::max(a, b);
  return hi + std::log1p(std::exp(std::min(a, b) - hi));
}

// One retrieval head's descent (steps 2-5 of mass_tree.h, up to z): which
// pages it opens and what they hold. Works in one thread's buffers.
class HeadDescent {
 public:
  HeadDescent(const KeyTable& table, int32_t slot, const MassTreeOptions& options,
              MassTreeScratch::Work* w, MassTreeScratch::HeadResult* r)
      : t_(table),
        slot_(slot),
        o_(options),
        w_(w),
        r_(r),
        D_(static_cast<size_t>(table.options().dim)),
        T_(table.options().key_tokens),
        P_(table.pages_per_chunk()),
        n_(table.size()),
        log_t_(std::log(static_cast<double>(T_))) {}

  // Runs the descent for the quantised query r_->q (and q_bound) with
  // logit scale c, down to h: the smallest share any term may count from
  // (StepMinHeadMass). lead: copy_lead while copy tracking, else 0.
  void Run(float c, float h, int32_t lead) {
    Start(c, h, lead);
    const double log_h = log_h_;
    // Phase 1: chunks. Those that may hold a target are expanded (their
    // pages screened), and so are the chunks of the pages always opened.
    ScreenChunks(log_h);
    const int64_t recent_first = std::max<int64_t>(0, n_ - o_.recent_blocks);
    auto expand = [&](int64_t b) {
      if (w_->chunk_stamp[b / P_] != stamp_) Expand(b / P_);
    };
    expand(0);
    for (int64_t b = recent_first; b < n_; b += P_) expand(b);
    expand(n_ - 1);
    for (int64_t cc : w_->candidates) {
      if (w_->chunk_stamp[cc] != stamp_) Expand(cc);
    }
    // A systematic sample of chunks (every stride-th), expanded whatever
    // their screens say: it measures how far the lower bounds are below
    // the truth for the pages and chunks the screen leaves (step 5).
    SampleChunks();
    for (int64_t cc : w_->sample_chunks) {
      if (w_->chunk_stamp[cc] != stamp_) Expand(cc);
    }
    // Phase 2: pages. The first and the recent ones are opened, then the
    // best screened pages while one may still hold a target.
    Open(0);
    for (int64_t b = std::max<int64_t>(1, recent_first); b < n_; ++b) Open(b);
    const size_t forced = r_->opened.size();
    const size_t cap = std::max<size_t>(
        forced + static_cast<size_t>(o_.min_open_cap),
        static_cast<size_t>(std::ceil(o_.max_read_fraction * static_cast<double>(n_))));
    std::vector<Unit>& pages = w_->heap;
    const size_t want = std::min(pages.size(), cap - std::min(cap, forced));
    if (want < pages.size()) {
      std::nth_element(pages.begin(), pages.begin() + want, pages.end(), BetterUnit());
    }
    std::sort(pages.begin(), pages.begin() + want, BetterUnit());
    for (size_t i = 0; i < want; ++i) {
      if (r_->opened.size() >= forced + static_cast<size_t>(o_.min_open) &&
          pages[i].screen < log_h + std::max(lz_open_, lz_floor_) - o_.stop_margin_nats) {
        break;
      }
      if (i + 1 < want) Prefetch(pages[i + 1].index);
      Open(pages[i].index);
    }
    OpenSample();
    r_->stats.heads_descended = 1;
  }

  // The reusing step (see mass_tree.h): the first, recent and appended
  // pages, the kept pages and the page after each, then the sample. False
  // when the sample found a page holding h of the attention outside them:
  // the caller then runs the full descent.
  bool Reuse(float c, float h, int32_t lead, const MassReuse::Head& prev) {
    Start(c, h, lead);
    Open(0);
    const int64_t recent_first = std::max<int64_t>(0, n_ - o_.recent_blocks);
    for (int64_t b = std::max<int64_t>(1, std::min(recent_first, prev.pages)); b < n_; ++b) {
      Open(b);
    }
    for (int64_t b : prev.kept) {
      if (b < n_) Open(b);
      if (b + 1 < n_) Open(b + 1);
    }
    SampleChunks();
    OpenSample();
    for (size_t i = screened_; i < r_->opened.size(); ++i) {
      if (r_->lse[i] - r_->lz >= log_h_) return false;
    }
    r_->stats.heads_reused = 1;
    return true;
  }

  // The pages the next step reuses (see mass_tree.h), into *head with the
  // query q they were found for.
  void Keep(absl::Span<const float> q, int32_t age, MassReuse::Head* head) const {
    std::vector<Unit>& best = w_->chunk_units;  // free after the descent
    best.clear();
    const double floor = log_h_ + r_->lz - o_.reuse_keep_nats;
    const int64_t recent_first = n_ - o_.recent_blocks;
    for (size_t i = 0; i < r_->opened.size(); ++i) {
      const int64_t b = r_->opened[i];
      if (b == 0 || b >= recent_first || r_->lse[i] < floor) continue;
      best.push_back({static_cast<float>(r_->lse[i]), 0, b});
    }
    const size_t cap = static_cast<size_t>(o_.reuse_max_kept);
    if (best.size() > cap) {
      std::nth_element(best.begin(), best.begin() + cap, best.end(), BetterUnit());
      best.resize(cap);
    }
    head->kept.clear();
    for (const Unit& u : best) head->kept.push_back(u.index);
    std::sort(head->kept.begin(), head->kept.end());
    head->query.assign(q.begin(), q.end());
    head->pages = n_;
    head->age = age;
    head->valid = true;
  }

 private:
  void Start(float c, float h, int32_t lead) {
    c_ = c;
    lead_ = lead;
    NextStamp();
    best_logit_ = -INFINITY;
    r_->strongest = -1;
    r_->opened.clear();
    r_->lse.clear();
    r_->tail.clear();
    r_->stats = MassTreeStats();
    w_->heap.clear();
    lz_open_ = -INFINITY;
    log_h_ = std::log(static_cast<double>(h));
  }

  // A systematic sample of the chunks: every stride-th, at least 4.
  void SampleChunks() {
    const int64_t C = t_.num_chunks();
    const int64_t sampled = std::min<int64_t>(C, std::max<int64_t>(4, C / 32));
    const int64_t stride = std::max<int64_t>(1, C / sampled);
    w_->sample_chunks.clear();
    for (int64_t cc = stride / 2; cc < C; cc += stride) w_->sample_chunks.push_back(cc);
  }

  // The sample's pages: every 4th page of the sampled chunks, opened if
  // nothing before opened it (those stand for the pages left unopened);
  // then z (step 5).
  void OpenSample() {
    screened_ = r_->opened.size();
    for (int64_t cc : w_->sample_chunks) {
      const int64_t p1 = std::min<int64_t>(n_, (cc + 1) * P_);
      for (int64_t b = cc * P_ + 1; b < p1; b += 4) Open(b);
    }
    r_->stats.pages_opened = static_cast<int64_t>(r_->opened.size());
    r_->lz = LogZ();
  }

  void NextStamp() {
    if (++w_->stamp == 0) {  // wrapped: every stamp left would look current
      std::fill(w_->open_stamp.begin(), w_->open_stamp.end(), 0u);
      std::fill(w_->chunk_stamp.begin(), w_->chunk_stamp.end(), 0u);
      w_->stamp = 1;
    }
    stamp_ = w_->stamp;
  }

  // Screens rows [0, count) of summaries at `rows` (stride 3 * D): the
  // scaled mean dot (*m) and bound (*u) of each, before the factor c.
  void Summaries(const int8_t* rows, int64_t count) {
    w_->dots.resize(count);
    w_->dots2.resize(count);
    w_->dots3.resize(count);
    const int32_t d = static_cast<int32_t>(D_);
    const size_t stride = KeyTable::kSummaryRows * D_;
    DotRowsS8(rows, count, stride, d, r_->q.data(), w_->dots.data());
    // [max | min] against [q+ | q-]: Quest's bound in one pass.
    DotRowsS8(rows + D_, count, stride, 2 * d, r_->q_bound.data(), w_->dots2.data());
    DotRowsS8(rows + 3 * D_, count, stride, d, r_->q.data(), w_->dots3.data());
  }

  // Screens every chunk: lb_C (its pages' attention together, estimated
  // low: Jensen on the chunk's mean key) and the best page mean it can hold
  // (Quest's bound over its pages' mean keys). Chunks whose best page mean
  // cannot reach log(h z0) - margin (z0: every chunk's lb summed) hold no
  // target; the others become candidates, at most 2 x max_read_fraction of
  // the chunks (the best bounds).
  void ScreenChunks(double log_h) {
    const int64_t C = t_.num_chunks();
    Summaries(t_.ChunkSummary(0, slot_), C);
    w_->chunk_pot.resize(C);
    double top = -INFINITY;
    for (int64_t cc = 0; cc < C; ++cc) {
      const int64_t pages = std::min<int64_t>(P_, n_ - cc * P_);
      const double m = double{c_} * t_.ChunkMeanScale(cc, slot_) * w_->dots[cc];
      const double best =
          double{c_} * t_.ChunkBoundScale(cc, slot_) * static_cast<double>(w_->dots2[cc]);
      const double top_logit = double{c_} * t_.ChunkTopScale(cc, slot_) * w_->dots3[cc];
      w_->chunk_lb[cc] =
          static_cast<float>(std::max(std::log(static_cast<double>(pages) * T_) + m, top_logit));
      w_->chunk_pot[cc] = static_cast<float>(std::max(log_t_ + best, top_logit));
      top = std::max(top, double{w_->chunk_lb[cc]});
    }
    double z0 = 0;
    for (int64_t cc = 0; cc < C; ++cc) z0 += std::exp(w_->chunk_lb[cc] - top);
    lz_floor_ = top + std::log(z0);
    const double keep = log_h + lz_floor_ - o_.stop_margin_nats;
    std::vector<Unit>& cand = w_->chunk_units;
    cand.clear();
    for (int64_t cc = 0; cc < C; ++cc) {
      if (w_->chunk_pot[cc] >= keep) cand.push_back({w_->chunk_pot[cc], 1, cc});
    }
    const size_t cap =
        std::max<size_t>(static_cast<size_t>(o_.min_candidate_chunks),
                         static_cast<size_t>(std::ceil(std::min(1.0, 2 * o_.max_read_fraction) *
                                                       static_cast<double>(C))));
    if (cand.size() > cap) {
      std::nth_element(cand.begin(), cand.begin() + cap, cand.end(), BetterUnit());
      cand.resize(cap);
    }
    w_->candidates.clear();
    for (const Unit& u : cand) w_->candidates.push_back(u.index);
    r_->stats.chunks_screened += C;
  }

  void Expand(int64_t cc) {
    w_->chunk_stamp[cc] = stamp_;
    const int64_t p0 = cc * P_;
    const int64_t pages = std::min<int64_t>(P_, n_ - p0);
    Summaries(t_.PageSummary(p0, slot_), pages);
    const float alpha = o_.bound_mix;
    for (int64_t i = 0; i < pages; ++i) {
      const int64_t b = p0 + i;
      const double m = double{c_} * t_.PageMeanScale(b, slot_) * w_->dots[i];
      const double u = double{c_} * t_.HeadScale(b, slot_) * static_cast<double>(w_->dots2[i]);
      // Its largest-norm key's own logit: one term of the page's sum, so
      // a page holding one strong key screens at least that high.
      const double top_logit = double{c_} * t_.HeadScale(b, slot_) * w_->dots3[i];
      w_->heap.push_back(
          {static_cast<float>(std::max(log_t_ + m + alpha * (u - m), top_logit)), 0, b});
    }
    r_->stats.pages_screened += pages;
  }

  // Asks for page b's keys ahead of Open(b): the pages of a descent are
  // scattered, so the next one's lines load while this one is scored.
  void Prefetch(int64_t b) const {
    const int8_t* k = t_.HeadKeys(b, slot_);
    const size_t bytes = static_cast<size_t>(T_) * D_;
    for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(k + off);
  }

  // The page's exact log-sum-exp over its T logits (the flat pass's
  // arithmetic on int8 x int8 dot products).
  void Open(int64_t b) {
    if (w_->open_stamp[b] == stamp_) return;
    w_->open_stamp[b] = stamp_;
    w_->dots.resize(T_);
    w_->logits.resize(T_);
    DotRowsS8(t_.HeadKeys(b, slot_), T_, D_, static_cast<int32_t>(D_), r_->q.data(),
              w_->dots.data());
    int32_t arg = 0;
    for (int32_t i = 0; i < T_; ++i) {
      w_->logits[i] = static_cast<float>(w_->dots[i]);
      if (w_->dots[i] > w_->dots[arg]) arg = i;
    }
    const int32_t top = w_->dots[arg];
    const double f = double{c_} * t_.HeadScale(b, slot_);
    if (f * top > best_logit_) {
      best_logit_ = f * top;
      r_->strongest = b * T_ + arg;
    }
    double lse = f * top;
    if (f > 0) {
      lse += std::log(static_cast<double>(simd::SumExpBelow(
          w_->logits.data(), T_, static_cast<float>(std::min(f, 1e30)), static_cast<float>(top))));
    } else {
      lse += std::log(static_cast<double>(T_));
    }
    if (lead_ > 0) {
      // The last lead_ tokens' log-sum-exp (copy_lead).
      double tail = 0;
      for (int32_t i = T_ - lead_; i < T_; ++i) tail += std::exp(f * (w_->dots[i] - top));
      r_->tail.push_back(f * top + std::log(tail));
    } else {
      r_->tail.push_back(-INFINITY);
    }
    r_->opened.push_back(b);
    r_->lse.push_back(lse);
    lz_open_ = LogAddExp(lz_open_, lse);
  }

  // log z: the pages opened by the screen (and always opened) exactly; the
  // rest by the systematic sample: its pages stand for every page not
  // opened before it (step 5). A sample page that could itself hold h of
  // the attention is counted once, exactly, not as the many it would
  // stand for.
  double LogZ() const {
    double lz_main = -INFINITY;
    for (size_t i = 0; i < screened_; ++i) lz_main = LogAddExp(lz_main, r_->lse[i]);
    const double heavy = lz_main + log_h_ - o_.stop_margin_nats;
    double lz_sample = -INFINITY;
    int64_t sampled = 0;
    for (size_t i = screened_; i < r_->opened.size(); ++i) {
      if (r_->lse[i] > heavy) {
        lz_main = LogAddExp(lz_main, r_->lse[i]);
      } else {
        lz_sample = LogAddExp(lz_sample, r_->lse[i]);
        ++sampled;
      }
    }
    if (sampled == 0) return lz_main;
    const int64_t rest = n_ - static_cast<int64_t>(r_->opened.size()) + sampled;
    return LogAddExp(lz_main, lz_sample + std::log(static_cast<double>(rest) / sampled));
  }

  const KeyTable& t_;
  const int32_t slot_;
  const MassTreeOptions& o_;
  MassTreeScratch::Work* const w_;
  MassTreeScratch::HeadResult* const r_;
  const size_t D_;
  const int32_t T_;
  const int64_t P_;
  const int64_t n_;
  const double log_t_;
  float c_ = 0.0f;
  uint32_t stamp_ = 0;
  double lz_open_ = -INFINITY;
  double lz_floor_ = -INFINITY;  // log of every chunk's lower estimate summed
  size_t screened_ = 0;          // pages opened before the sample's
  double log_h_ = 0;
  int32_t lead_ = 0;               // copy_lead while copy tracking, else 0
  double best_logit_ = -INFINITY;  // the strongest opened key's logit (r_->strongest)
};

// Steps 5's shares of one head whose descent ran (r): opened pages with a
// share >= the head's gate add to s->bumps, in the flat pass's arithmetic;
// memory's copy track is updated (ObserveCopy).
// Which head, over how many pages of how many key tokens.
struct HeadAt {
  int32_t head = 0;
  int64_t n = 0;
  int32_t key_tokens = 0;
};
void AddShares(const SelectionCalibration& cal, const HeadAt& at,
               const MassTreeScratch::HeadResult& r, MassTreeScratch* s, MassMemory* memory) {
  const int32_t head = at.head;
  const int64_t n = at.n;
  const float weight = cal.head_weights.empty() ? 1.0f : cal.head_weights[head];
  const HeadGate gate = ObserveCopy(cal, memory, head, PositionOf(r.strongest, n, at.key_tokens));
  if (!(gate.weight > 0)) return;
  // Each opened page's share, its last lead tokens' moved to the page
  // after it when the head copies (key_scorers.h, ObserveCopy).
  std::vector<PageShare>& shares = s->shares;
  shares.clear();
  for (size_t i = 0; i < r.opened.size(); ++i) {
    const double p = std::exp(r.lse[i] - r.lz);
    const int64_t b = r.opened[i];
    if (gate.lead == 0) {
      shares.push_back({b, p});
      continue;
    }
    const double tail = std::min(p, std::exp(r.tail[i] - r.lz));
    shares.push_back({b, p - tail});
    if (b + 1 < n) shares.push_back({b + 1, tail});
  }
  if (gate.lead > 0) MergeShares(&shares);
  for (const PageShare& ps : shares) {
    if (ps.share >= gate.min_mass) {
      s->bumps.push_back({ps.page, static_cast<float>(weight * (ps.share * gate.weight))});
    }
  }
}

// Whether a head whose previous step left prev may reuse it at this step
// for query q (unit or not) over n pages (see mass_tree.h).
bool Reusable(const MassReuse::Head& prev, absl::Span<const float> q, int64_t n,
              const MassTreeOptions& o) {
  if (!prev.valid || prev.age >= o.reuse_steps || n < prev.pages ||
      n - prev.pages > o.recent_blocks || prev.query.size() != q.size()) {
    return false;
  }
  double dot = 0, qq = 0, pp = 0;
  for (size_t d = 0; d < q.size(); ++d) {
    dot += double{q[d]} * prev.query[d];
    qq += double{q[d]} * q[d];
    pp += double{prev.query[d]} * prev.query[d];
  }
  return qq > 0 && pp > 0 && dot >= o.reuse_min_cosine * std::sqrt(qq * pp);
}

}  // namespace

size_t MassReuse::MemoryBytes() const {
  size_t bytes = 0;
  for (const std::vector<Head>* v : {&before, &now}) {
    for (const Head& h : *v) {
      bytes +=
          sizeof(Head) + h.query.capacity() * sizeof(float) + h.kept.capacity() * sizeof(int64_t);
    }
  }
  return bytes;
}

absl::Status ValidateMassTreeOptions(const MassTreeOptions& o) {
  if (o.min_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("mass_tree.min_blocks (", o.min_blocks, ") must be >= 0"));
  }
  if (o.min_open_cap < 0 || o.min_candidate_chunks < 0) {
    return absl::InvalidArgumentError(absl::StrCat("mass_tree.min_open_cap (", o.min_open_cap,
                                                   ") and min_candidate_chunks (",
                                                   o.min_candidate_chunks, ") must be >= 0"));
  }
  if (o.recent_blocks < 0 || o.min_open < 1) {
    return absl::InvalidArgumentError(absl::StrCat("mass_tree.recent_blocks (", o.recent_blocks,
                                                   ") must be >= 0 and min_open (", o.min_open,
                                                   ") >= 1"));
  }
  if (!(o.max_read_fraction > 0.0 && o.max_read_fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("mass_tree.max_read_fraction (", o.max_read_fraction, ") must be in (0, 1]"));
  }
  if (!(o.stop_margin_nats >= 0.0f && o.stop_margin_nats <= 1e6f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("mass_tree.stop_margin_nats (", o.stop_margin_nats, ") must be in [0, 1e6]"));
  }
  if (o.reuse_steps < 0 || o.reuse_steps > 1024 || o.reuse_max_kept < 1 ||
      o.reuse_max_kept > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("mass_tree.reuse_steps (", o.reuse_steps, ") must be in [0, 1024] and ",
                     "reuse_max_kept (", o.reuse_max_kept, ") in [1, 4096]"));
  }
  if (!(o.reuse_min_cosine >= -1.0f && o.reuse_min_cosine <= 1.0f) ||
      !(o.reuse_keep_nats >= 0.0f && o.reuse_keep_nats <= 30.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mass_tree.reuse_min_cosine (", o.reuse_min_cosine, ") must be in [-1, 1] and ",
        "reuse_keep_nats (", o.reuse_keep_nats, ") in [0, 30]"));
  }
  if (!(o.bound_mix >= 0.0f && o.bound_mix <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("mass_tree.bound_mix (", o.bound_mix, ") must be in [0, 1]"));
  }
  return absl::OkStatus();
}

absl::Status MassTreeBumps(const MassTreeInput& in, const MassTreeOptions& options,
                           MassTreeScratch* s, std::vector<MassBump>* bumps, MassTreeStats* stats) {
  if (in.table == nullptr || in.calibration == nullptr) {
    return absl::InvalidArgumentError("the mass tree needs a KeyTable and a calibration");
  }
  const KeyTable& table = *in.table;
  const SelectionCalibration& c = *in.calibration;
  const absl::Span<const int32_t> slots = in.slots;
  const int32_t dim = in.dim;
  const absl::Span<const float> head_queries = in.head_queries;
  MassMemory* const memory = in.memory;
  WorkerPool* const pool = in.pool;
  const int32_t max_slots = in.max_slots;
  const size_t R = c.retrieval_heads.size();
  const size_t D = static_cast<size_t>(dim);
  const int64_t n = table.size();
  const float h = MinHeadMass(c);
  if (!c.calibrated() || !(h > 0) || R == 0 || slots.size() != R || head_queries.size() != R * D ||
      table.options().dim != dim || n < 1 || table.num_key_heads() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the mass tree needs a calibrated context with head keys, head_min_mass > 0 "
        "(and copy_min_mass, with copy tracking) and ",
        R, " x ", dim, " head queries (got ", head_queries.size(), " values, ", n, " pages)"));
  }
  bumps->clear();
  s->bumps.clear();
  const int32_t threads = pool != nullptr ? std::max(1, max_slots) : 1;
  if (s->work.size() < static_cast<size_t>(threads)) s->work.resize(threads);
  if (s->heads.size() < R) s->heads.resize(R);
  const size_t C = static_cast<size_t>(table.num_chunks());
  for (int32_t w = 0; w < threads; ++w) {
    MassTreeScratch::Work& work = s->work[w];
    work.open_stamp.resize(std::max<size_t>(work.open_stamp.size(), n), 0u);
    work.chunk_lb.resize(std::max(work.chunk_lb.size(), C));
    work.chunk_stamp.resize(std::max(work.chunk_stamp.size(), C), 0u);
  }
  const double softmax_scale =
      c.softmax_scale > 0 ? c.softmax_scale : 1.0 / std::sqrt(static_cast<double>(dim));
  const int32_t T = table.options().key_tokens;
  const int32_t lead = c.copy_run > 0 ? std::min(c.copy_lead, T) : 0;
  // Every head's copy track exists before the descents read them (a head
  // with none yet is one that has not copied: StepMinHeadMass).
  if (memory != nullptr && c.copy_run > 0 && memory->tracks_before.size() != R) {
    memory->tracks_before.resize(R);
    memory->tracks.resize(R);
  }
  // The descents: independent per head (memory is only read here).
  auto descend = [&](int32_t w, int64_t i) {
    MassTreeScratch::HeadResult& r = s->heads[i];
    r.q.resize(D);
    r.q_bound.resize(2 * D);
    const float qs = QuantizeInt8(&head_queries[i * D], D, r.q.data());
    r.ran = qs > 0;  // an all-zero query attends uniformly: no target
    if (!r.ran) {
      if (in.reuse != nullptr) in.reuse->now[i].valid = false;
      return;
    }
    for (size_t d = 0; d < D; ++d) {
      r.q_bound[d] = std::max<int8_t>(r.q[d], 0);
      r.q_bound[D + d] = std::min<int8_t>(r.q[d], 0);
    }
    HeadDescent head(table, slots[i], options, &s->work[w], &r);
    const float scale = static_cast<float>(softmax_scale * qs);
    const float h_i = StepMinHeadMass(c, memory, static_cast<int32_t>(i));
    const absl::Span<const float> q = head_queries.subspan(i * D, D);
    if (in.reuse == nullptr) {
      head.Run(scale, h_i, lead);
      return;
    }
    const MassReuse::Head& prev = in.reuse->before[i];
    MassReuse::Head& next = in.reuse->now[i];
    int64_t read = 0;  // by a reuse the sample refused
    if (Reusable(prev, q, n, options)) {
      if (head.Reuse(scale, h_i, lead, prev)) {
        head.Keep(prev.query, prev.age + 1, &next);
        return;
      }
      read = r.stats.pages_opened;
    }
    head.Run(scale, h_i, lead);
    r.stats.pages_opened += read;
    head.Keep(q, 0, &next);
  };
  if (threads > 1 && R > 1) {
    pool->ParallelFor(static_cast<int64_t>(R), threads, descend, in.pool_lane);
  } else {
    for (size_t i = 0; i < R; ++i) descend(0, static_cast<int64_t>(i));
  }
  // The gates and shares, in head order (they update memory).
  for (size_t i = 0; i < R; ++i) {
    const MassTreeScratch::HeadResult& r = s->heads[i];
    if (!r.ran) continue;
    stats->pages_opened += r.stats.pages_opened;
    stats->pages_screened += r.stats.pages_screened;
    stats->chunks_screened += r.stats.chunks_screened;
    stats->heads_reused += r.stats.heads_reused;
    stats->heads_descended += r.stats.heads_descended;
    AddShares(c, {static_cast<int32_t>(i), n, T}, r, s, memory);
  }
  std::stable_sort(s->bumps.begin(), s->bumps.end(),
                   [](const MassBump& a, const MassBump& b) { return a.page < b.page; });
  for (const MassBump& b : s->bumps) {
    if (!bumps->empty() && bumps->back().page == b.page) {
      bumps->back().mass += b.mass;
    } else {
      bumps->push_back(b);
    }
  }
  return absl::OkStatus();
}

}  // namespace kvtier::index
