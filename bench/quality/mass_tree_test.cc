// The mass scorer's sparse path (index/select/mass_tree.h, selector_mass.cc)
// against the flat pass it replaces, driven as an engine drives a context
// (pages appended as they complete, Select every step, the shipped
// selector options) on real keys: every shared dump of the calibrated copy
// model at its own length, and long contexts built from those dumps' keys
// (long_context.h) up to 1M tokens.
//
// The figure: the expected mass (the flat pass's own estimates, summed over
// the chosen blocks) of the sparse path's choice over the flat pass's
// choice, over all steps of a case. The tolerance the sparse path is held
// to is 0.5% of it. Also checked: the share of retrieval-key pages read
// (tokens visited) at 128K and 1M tokens, and that the shipped options
// (mass_tree.min_blocks) leave every shared dump on the flat pass, so its
// selections there are the flat pass's, block for block.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "bench/quality/calibrate.h"
#include "bench/quality/kv_dump.h"
#include "bench/quality/long_context.h"
#include "gtest/gtest.h"
#include "index/context_index.h"
#include "index/select/key_scorers.h"
#include "index/select/selector.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::quality {
namespace {

constexpr int32_t kT = 16;

std::vector<std::string> Dumps(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() == ".safetensors" && name.rfind(prefix, 0) == 0) {
      out.push_back(e.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Shipped select.* options: sink 1, local 1, window 64, theta 0.8.
index::SelectorOptions Options(int64_t min_blocks) {
  index::SelectorOptions o;
  o.sink_blocks = 1;
  o.local_blocks = 1;
  o.page_keep_fraction = 1.0;
  o.stability.window_steps = 64;
  o.stability.theta = 0.8f;
  o.stability.weight = 0.5f;
  o.stability.hold_threshold = 0.5f;
  o.mass_tree.min_blocks = min_blocks;
  return o;
}

std::unique_ptr<index::ContextIndex> NewContext(const index::SelectionCalibration& c, int32_t dim,
                                                int32_t layers, int32_t kv_heads) {
  index::ContextIndexOptions o;
  o.tree.dim = dim;
  o.tree.block_size_tokens = kT;
  o.num_layers = layers;
  o.num_kv_heads = kv_heads;
  o.block_size_tokens = kT;
  o.calibration = c;
  auto ctx = index::ContextIndex::Create(o);
  EXPECT_OK(ctx) << ctx.status();
  return ctx.ok() ? std::move(*ctx) : nullptr;
}

struct Tally {
  double mass_flat = 0, mass_sparse = 0;
  int64_t steps = 0, identical = 0;
  int64_t pages_opened = 0, pages_total = 0;  // summed over heads and steps
  // Pages the flat pass gave a retrieval term (beyond the sinks and the
  // local window), and how many of those the sparse path chose too.
  int64_t targets = 0, targets_chosen = 0, targets_chosen_flat = 0;
  double Ratio() const { return mass_flat > 0 ? mass_sparse / mass_flat : 1.0; }
  double Visited() const {
    return pages_total > 0 ? static_cast<double>(pages_opened) / pages_total : 0.0;
  }
};

// One Select step on both contexts (same pages), tallied. `flat` and
// `sparse` may be the same context (the flat pass then runs second and
// re-observes the step: blocks are compared, stability windows are the
// flat pass's).
void Step(index::ContextIndex* flat, index::ContextIndex* sparse, index::Selector* flat_sel,
          index::Selector* sparse_sel, absl::Span<const float> queries, int64_t budget,
          int64_t step, Tally* tally, std::vector<int64_t>* flat_blocks = nullptr) {
  index::SelectRequest r;
  r.scorer = index::ScorerKind::kMass;
  r.stability = false;  // the shipped select.stability_scorers leave mass out
  r.head_queries = queries;
  r.budget_blocks = budget;
  r.step = step;
  index::SelectResult a, b;
  r.context = sparse;
  ASSERT_OK(sparse_sel->Select(r, &b));
  r.context = flat;
  ASSERT_OK(flat_sel->Select(r, &a));
  ASSERT_FALSE(a.mass_sparse);
  const int64_t n = flat->tree().num_pages();
  std::vector<float> est(n);
  index::KeyScorerScratch scratch;
  ASSERT_OK(index::MassScores(
      {flat->keys(), &flat->calibration(), flat->key_slots(), flat->tree().dim(), n, queries},
      &scratch, absl::MakeSpan(est)));
  for (int64_t p : a.blocks) tally->mass_flat += est[p];
  for (int64_t p : b.blocks) tally->mass_sparse += est[p];
  const index::SelectionCalibration& c = flat->calibration();
  const int64_t last = static_cast<int64_t>(c.prior.size()) - 1;
  for (int64_t p = 1; p + 1 < n; ++p) {
    if (est[p] <= c.prior[std::min<int64_t>(n - 1 - p, last)]) continue;
    ++tally->targets;
    tally->targets_chosen += std::binary_search(b.blocks.begin(), b.blocks.end(), p);
    tally->targets_chosen_flat += std::binary_search(a.blocks.begin(), a.blocks.end(), p);
  }
  ++tally->steps;
  tally->identical += a.blocks == b.blocks;
  tally->pages_opened += b.mass_pages_opened;
  tally->pages_total += n * static_cast<int64_t>(flat->calibration().retrieval_heads.size());
  if (flat_blocks != nullptr) *flat_blocks = a.blocks;
}

class MassTreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cal = LoadCalibrations(KVTIER_CALIBRATION_DIR);
    ASSERT_OK(cal) << cal.status();
    ASSERT_TRUE(cal->count("austen-copy")) << "no austen-copy calibration";
    shipped_ = cal->at("austen-copy");
    // The tree's retrieval path against the flat pass wherever a head has
    // a target: copy tracking off (with it on, heads count only while they
    // copy; the shared-dump test runs the shipped calibration too).
    copy_ = shipped_;
    copy_.copy_run = 0;
    for (const std::string& path : Dumps(KVTIER_REALKV_DIR, "rkc-")) {
      absl::StatusOr<KvDump> d = LoadKvDump(path);
      ASSERT_OK(d) << d.status();
      dumps_.push_back(std::move(*d));
    }
    if (dumps_.empty()) GTEST_SKIP() << "no rkc dumps in " << KVTIER_REALKV_DIR;
  }

  index::SelectionCalibration shipped_, copy_;
  std::vector<KvDump> dumps_;
};

// Every shared dump of the copy model, pages appended as they complete and
// Select at every decode step: the sparse path forced on (min_blocks 0)
// against the flat pass, and the shipped min_blocks, which keeps these
// lengths on the flat pass (identical blocks).
TEST_F(MassTreeTest, SharedDumpsKeepTheFlatPassesExpectedMass) {
  for (const index::SelectionCalibration* cal : {&shipped_, &copy_}) {
    for (double fraction : {1.0 / 16, 1.0 / 8}) {
      const index::SelectionCalibration& c = *cal;
      Tally forced;
      for (const KvDump& d : dumps_) {
        const int32_t D = d.head_dim;
        std::unique_ptr<index::ContextIndex> flat = NewContext(c, D, d.num_layers, d.num_kv_heads);
        std::unique_ptr<index::ContextIndex> sparse =
            NewContext(c, D, d.num_layers, d.num_kv_heads);
        std::unique_ptr<index::ContextIndex> defaults =
            NewContext(c, D, d.num_layers, d.num_kv_heads);
        auto flat_sel = *index::Selector::Create(Options(int64_t{1} << 40));
        auto sparse_sel = *index::Selector::Create(Options(0));
        auto default_sel = *index::Selector::Create(Options(index::MassTreeOptions().min_blocks));
        // The dump's pages as summaries: the retrieval heads' keys in int8.
        std::vector<index::BlockSummary> pages;
        const std::vector<int32_t> key_heads = index::KeyHeadsOf(c, d.num_kv_heads);
        for (int64_t b = 0; b < d.seq_len / kT; ++b) {
          index::BlockSummary s;
          s.dim = D;
          s.mean.assign(D, 0.0f);
          s.key_heads = key_heads;
          s.key_tokens = kT;
          s.head_keys.resize(key_heads.size() * kT * D);
          std::vector<float> k(kT * D);
          for (size_t j = 0; j < key_heads.size(); ++j) {
            const int32_t l = key_heads[j] / d.num_kv_heads, h = key_heads[j] % d.num_kv_heads;
            for (int32_t t = 0; t < kT; ++t) {
              const float* src = d.K(l, h, b * kT + t);
              std::copy(src, src + D, &k[t * D]);
              for (int32_t x = 0; x < D; ++x) s.mean[x] += src[x];
            }
            s.key_scales.push_back(
                index::QuantizeInt8(k.data(), k.size(), &s.head_keys[j * kT * D]));
          }
          pages.push_back(std::move(s));
        }
        const int64_t prompt = d.seq_len / 2;
        int64_t have = 0;
        for (int64_t t = prompt; t < d.seq_len; ++t) {
          const int64_t n = t / kT;  // complete pages at step t
          for (; have < n; ++have) {
            for (auto* ctx : {flat.get(), sparse.get(), defaults.get()}) {
              ASSERT_OK(ctx->Append(pages[have]));
            }
          }
          if (n < 3) continue;
          std::vector<float> q(c.retrieval_heads.size() * D);
          for (size_t i = 0; i < c.retrieval_heads.size(); ++i) {
            const float* src = d.Q(c.retrieval_heads[i].layer, c.retrieval_heads[i].q_head, t);
            std::copy(src, src + D, &q[i * D]);
          }
          const int64_t budget = std::max<int64_t>(2, static_cast<int64_t>(n * fraction));
          std::vector<int64_t> flat_blocks;
          Step(flat.get(), sparse.get(), flat_sel.get(), sparse_sel.get(), q, budget, t, &forced,
               &flat_blocks);
          // The shipped options on a context of its own: the flat pass, so
          // the same blocks.
          index::SelectRequest r;
          r.context = defaults.get();
          r.scorer = index::ScorerKind::kMass;
          r.stability = false;
          r.head_queries = q;
          r.budget_blocks = budget;
          r.step = t;
          index::SelectResult got;
          ASSERT_OK(default_sel->Select(r, &got));
          EXPECT_FALSE(got.mass_sparse) << d.name << " step " << t;
          EXPECT_EQ(got.blocks, flat_blocks) << d.name << " step " << t;
        }
      }
      std::printf(
          "mass tree on the %zu shared copy-model dumps at 1/%.0f (%s), sparse path forced: "
          "expected mass %.5f of the flat pass's, identical blocks %lld/%lld steps, "
          "pages read %.3f, retrieval targets chosen %lld (flat %lld) of %lld\n",
          dumps_.size(), 1 / fraction, c.copy_run > 0 ? "shipped" : "copy tracking off",
          forced.Ratio(), static_cast<long long>(forced.identical),
          static_cast<long long>(forced.steps), forced.Visited(),
          static_cast<long long>(forced.targets_chosen),
          static_cast<long long>(forced.targets_chosen_flat),
          static_cast<long long>(forced.targets));
      EXPECT_GE(forced.Ratio(), 0.995) << "budget 1/" << 1 / fraction;
    }
  }
}

// Long contexts from the dumps' keys (long_context.h), the copy passage far
// back: the last 256 tokens decoded, Select every 16 tokens (as each block
// completes), budget 1/32 of the pages.
void RunLong(const std::vector<KvDump>& dumps, const index::SelectionCalibration& c, int64_t tokens,
             float passage_key_scale, bool share_context, Tally* tally) {
  std::vector<const KvDump*> ptrs;
  ptrs.reserve(dumps.size());
  for (const KvDump& d : dumps) ptrs.push_back(&d);
  LongContextOptions lo;
  lo.tokens = tokens;
  lo.passage_key_scale = passage_key_scale;
  absl::StatusOr<LongContext> lc = LongContext::Build(ptrs, lo);
  ASSERT_OK(lc) << lc.status();
  std::unique_ptr<index::ContextIndex> flat =
      NewContext(c, lc->dim(), lc->num_layers(), lc->num_kv_heads());
  std::unique_ptr<index::ContextIndex> own;
  index::ContextIndex* sparse = flat.get();
  if (!share_context) {
    own = NewContext(c, lc->dim(), lc->num_layers(), lc->num_kv_heads());
    sparse = own.get();
  }
  auto flat_sel = *index::Selector::Create(Options(int64_t{1} << 40));
  auto sparse_sel = *index::Selector::Create(Options(0));
  int64_t have = 0;
  for (int32_t s = 0; s < lc->query_steps(); ++s) {
    const int64_t n = lc->QueryPosition(s) / kT;
    std::vector<index::BlockSummary> add;
    for (; have < n; ++have) {
      add.push_back(lc->PageSummary(have, c));
      if (add.size() == 4096 || have + 1 == n) {
        for (auto* ctx : {flat.get(), own.get()}) {
          if (ctx == nullptr) continue;
          for (const index::BlockSummary& b : add) ASSERT_OK(ctx->Append(b));
        }
        add.clear();
      }
    }
    const std::vector<float> q = lc->HeadQueries(s, c);
    Step(flat.get(), sparse, flat_sel.get(), sparse_sel.get(), q, std::max<int64_t>(2, n / 32),
         lc->QueryPosition(s), tally);
  }
}

TEST_F(MassTreeTest, LongContextsKeepTheFlatPassesExpectedMass) {
  struct Case {
    int64_t tokens;
    float passage_key_scale;  // > 1: a passage the copy heads find far back
    double max_visited;       // share of retrieval-key pages read
  };
  for (Case k : {Case{32768, 1, 1.0}, Case{131072, 1, 0.10}, Case{1 << 20, 1, 0.02},
                 Case{131072, 2, 0.10}, Case{1 << 20, 2, 0.02}}) {
    Tally tally;
    RunLong(dumps_, copy_, k.tokens, k.passage_key_scale, /*share_context=*/k.tokens > 131072,
            &tally);
    std::printf(
        "mass tree, long context of %lld tokens (passage keys x%.0f) at 1/32: expected "
        "mass %.5f of the flat pass's, identical blocks %lld/%lld steps, pages read "
        "%.4f, retrieval targets chosen %lld (flat %lld) of %lld\n",
        static_cast<long long>(k.tokens), k.passage_key_scale, tally.Ratio(),
        static_cast<long long>(tally.identical), static_cast<long long>(tally.steps),
        tally.Visited(), static_cast<long long>(tally.targets_chosen),
        static_cast<long long>(tally.targets_chosen_flat), static_cast<long long>(tally.targets));
    EXPECT_GE(tally.Ratio(), 0.995) << k.tokens << " tokens";
    EXPECT_LE(tally.Visited(), k.max_visited) << k.tokens << " tokens";
  }
}

// The heads' descents of a batch of one context run on the selector's
// threads (mass_tree.h): with two threads every step must choose, score
// and prefetch exactly as with one, copy tracking on (its memory is
// updated in head order after the descents).
TEST_F(MassTreeTest, TwoThreadsChooseExactlyAsOne) {
  std::vector<const KvDump*> ptrs;
  ptrs.reserve(dumps_.size());
  for (const KvDump& d : dumps_) ptrs.push_back(&d);
  LongContextOptions lo;
  lo.tokens = 131072;
  lo.passage_key_scale = 2;
  absl::StatusOr<LongContext> lc = LongContext::Build(ptrs, lo);
  ASSERT_OK(lc.status());
  const index::SelectionCalibration& c = shipped_;
  auto one = NewContext(c, lc->dim(), lc->num_layers(), lc->num_kv_heads());
  auto two = NewContext(c, lc->dim(), lc->num_layers(), lc->num_kv_heads());
  index::SelectorOptions o2 = Options(0);
  o2.num_threads = 2;
  auto sel1 = *index::Selector::Create(Options(0));
  auto sel2 = *index::Selector::Create(o2);
  int64_t have = 0;
  int64_t opened = 0;
  for (int32_t s = 0; s < lc->query_steps(); ++s) {
    const int64_t n = lc->QueryPosition(s) / kT;
    for (; have < n; ++have) {
      const index::BlockSummary b = lc->PageSummary(have, c);
      ASSERT_OK(one->Append(b));
      ASSERT_OK(two->Append(b));
    }
    const std::vector<float> q = lc->HeadQueries(s, c);
    index::SelectRequest r;
    r.scorer = index::ScorerKind::kMass;
    r.stability = false;
    r.head_queries = q;
    r.budget_blocks = n / 32;
    r.step = lc->QueryPosition(s);
    index::SelectResult a, b;
    r.context = one.get();
    ASSERT_OK(sel1->Select(r, &a));
    r.context = two.get();
    ASSERT_OK(sel2->Select(r, &b));
    ASSERT_TRUE(a.mass_sparse && b.mass_sparse) << "step " << s;
    EXPECT_EQ(a.blocks, b.blocks) << "step " << s;
    EXPECT_EQ(a.scores, b.scores) << "step " << s;
    EXPECT_EQ(a.prefetch, b.prefetch) << "step " << s;
    EXPECT_EQ(a.mass_pages_opened, b.mass_pages_opened) << "step " << s;
    opened += b.mass_pages_opened;
  }
  EXPECT_GT(opened, 0) << "the heads read keys";
}

}  // namespace
}  // namespace kvtier::quality
