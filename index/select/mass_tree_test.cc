// The mass scorer's sparse path on synthetic keys: the prior alone ranks
// exactly as the flat pass, a target planted far back is found and given
// the flat pass's share, and the tree reads a small part of a long
// context. Real keys: bench/quality/mass_tree_test.cc.
#include "index/select/mass_tree.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "index/context_index.h"
#include "index/select/key_scorers.h"
#include "index/select/mass_test_util.h"
#include "index/select/selector.h"
#include "index/summary/summary.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::index {
namespace {

using namespace mass_test;  // NOLINT(google-build-using-namespace): the shared fixtures
using ::kvtier::testing::StatusIs;

// The shared retrieval head and prior, a head weight and the gate.
SelectionCalibration Calibration() {
  SelectionCalibration c = BaseCalibration();
  c.head_weights = {0.9f};
  c.head_min_mass = 0.4f;
  return c;
}

std::unique_ptr<ContextIndex> NewContext() { return mass_test::NewContext(Calibration()); }

// A page of noise keys; `target` (if not null) is written into its token 5
// scaled by `strength`.
BlockSummary Page(std::mt19937* rng, const float* target = nullptr, float strength = 0) {
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> keys(kT * kD);
  for (float& k : keys) k = noise(*rng);
  if (target != nullptr) {
    for (int d = 0; d < kD; ++d) keys[5 * kD + d] = strength * target[d];
  }
  return PageOfKeys(keys);
}

SelectorOptions Options(int64_t min_blocks) {
  SelectorOptions o;
  o.sink_blocks = 1;
  o.local_blocks = 1;
  o.stability.theta = 0.8f;
  o.mass_tree.min_blocks = min_blocks;
  return o;
}

// Without head queries the estimate is the prior of each block's distance:
// the sparse ranking must be the flat pass's, block for block, score for
// score, prefetch for prefetch, while blocks are appended.
TEST(MassTreeTest, PriorAloneRanksExactlyAsTheFlatPass) {
  std::mt19937 rng(1);
  auto flat = NewContext(), sparse = NewContext();
  auto flat_sel = *Selector::Create(Options(int64_t{1} << 40));
  auto sparse_sel = *Selector::Create(Options(0));
  std::vector<BlockSummary> pages;
  pages.reserve(700);
  for (int i = 0; i < 700; ++i) pages.push_back(Page(&rng));
  ASSERT_OK(flat->AddSegment(absl::MakeConstSpan(pages).subspan(0, 600)));
  ASSERT_OK(sparse->AddSegment(absl::MakeConstSpan(pages).subspan(0, 600)));
  for (int step = 0; step < 100; ++step) {
    ASSERT_OK(flat->Append(pages[600 + step]));
    ASSERT_OK(sparse->Append(pages[600 + step]));
    for (int64_t budget : {3, 40, 300}) {
      SelectRequest r;
      r.scorer = ScorerKind::kMass;
      r.stability = false;
      r.budget_blocks = budget;
      r.step = step;
      SelectResult a, b;
      r.context = flat.get();
      ASSERT_OK(flat_sel->Select(r, &a));
      r.context = sparse.get();
      ASSERT_OK(sparse_sel->Select(r, &b));
      EXPECT_FALSE(a.mass_sparse);
      EXPECT_TRUE(b.mass_sparse);
      EXPECT_EQ(a.blocks, b.blocks) << "step " << step << " budget " << budget;
      EXPECT_EQ(a.scores, b.scores) << "step " << step << " budget " << budget;
      EXPECT_EQ(a.prefetch, b.prefetch) << "step " << step << " budget " << budget;
      EXPECT_LT(b.rows_scored, 10) << "the prior alone reads no keys";
    }
  }
}

// A page far back whose token 5 is the query's direction: the flat pass
// gives it more than head_min_mass of the head's attention; the tree must
// find it, give it nearly the same share, choose it, and read a small part
// of the context.
TEST(MassTreeTest, FindsATargetFarBackAndReadsLittle) {
  std::mt19937 rng(2);
  std::vector<float> q(kD);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  for (float& x : q) x = noise(rng);
  auto ctx = NewContext();
  std::vector<BlockSummary> pages;
  constexpr int64_t kPages = 4096, kTarget = 700;
  for (int64_t i = 0; i < kPages; ++i) {
    pages.push_back(i == kTarget ? Page(&rng, q.data(), 1.5f) : Page(&rng));
  }
  ASSERT_OK(ctx->AddSegment(pages));
  std::vector<float> est(kPages);
  KeyScorerScratch scratch;
  ASSERT_OK(MassScores({ctx->keys(), &ctx->calibration(), ctx->key_slots(), kD, kPages, q},
                       &scratch, absl::MakeSpan(est)));
  const float prior = Calibration().prior.back();
  ASSERT_GT(est[kTarget] - prior, 0.9f * 0.4f) << "the flat pass gates the planted page";

  MassTreeScratch s;
  std::vector<MassBump> bumps;
  MassTreeStats stats;
  MassTreeInput in;
  in.table = ctx->keys();
  in.calibration = &ctx->calibration();
  in.slots = ctx->key_slots();
  in.dim = kD;
  in.head_queries = q;
  ASSERT_OK(MassTreeBumps(in, MassTreeOptions(), &s, &bumps, &stats));
  in.table = nullptr;
  EXPECT_THAT(MassTreeBumps(in, MassTreeOptions(), &s, &bumps, &stats),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_EQ(bumps.size(), 1u);
  EXPECT_EQ(bumps[0].page, kTarget);
  EXPECT_NEAR(bumps[0].mass, est[kTarget] - prior, 0.05);
  EXPECT_LT(stats.pages_opened, kPages / 10) << "pages read";
  EXPECT_LT(stats.pages_screened, kPages / 2) << "pages screened";

  auto sel = *Selector::Create(Options(0));
  SelectRequest r;
  r.context = ctx.get();
  r.scorer = ScorerKind::kMass;
  r.stability = false;
  r.head_queries = q;
  r.budget_blocks = 8;
  SelectResult out;
  ASSERT_OK(sel->Select(r, &out));
  EXPECT_TRUE(out.mass_sparse);
  EXPECT_TRUE(std::binary_search(out.blocks.begin(), out.blocks.end(), kTarget));
  EXPECT_EQ(out.mass_pages_opened, stats.pages_opened);
}

// Requests the sparse path does not serve fall back to the flat pass:
// stability ranking, an ungated calibration, short contexts.
TEST(MassTreeTest, OtherRequestsScoreFlat) {
  std::mt19937 rng(3);
  auto ctx = NewContext();
  std::vector<BlockSummary> pages;
  pages.reserve(64);
  for (int i = 0; i < 64; ++i) pages.push_back(Page(&rng));
  ASSERT_OK(ctx->AddSegment(pages));
  std::vector<float> q(kD, 0.5f);
  SelectRequest r;
  r.context = ctx.get();
  r.scorer = ScorerKind::kMass;
  r.head_queries = q;
  r.budget_blocks = 8;
  SelectResult out;
  auto short_ctx = *Selector::Create(Options(512));
  r.stability = false;
  ASSERT_OK(short_ctx->Select(r, &out));
  EXPECT_FALSE(out.mass_sparse) << "64 blocks is below min_blocks";
  auto any = *Selector::Create(Options(0));
  r.stability = true;
  r.step = 1;
  ASSERT_OK(any->Select(r, &out));
  EXPECT_FALSE(out.mass_sparse) << "a stability-ranked request";
}

// The calibration's step-to-step terms (calibration.h), on the flat pass
// and the sparse path alike.
class MassCalibrationTest : public ::testing::TestWithParam<int64_t /*min_blocks*/> {
 protected:
  void Build(const SelectionCalibration& c, std::vector<int64_t> targets, int64_t pages = 800) {
    std::mt19937 rng(4);
    std::normal_distribution<float> noise(0.0f, 1.0f);
    q_.resize(kD);
    for (float& x : q_) x = noise(rng);
    ctx_ = mass_test::NewContext(c);
    ASSERT_NE(ctx_, nullptr);
    std::vector<BlockSummary> ps;
    for (int64_t i = 0; i < pages; ++i) {
      const bool t = std::find(targets.begin(), targets.end(), i) != targets.end();
      ps.push_back(t ? Page(&rng, q_.data(), 1.5f) : Page(&rng));
    }
    ASSERT_OK(ctx_->AddSegment(ps));
    sel_ = std::move(*Selector::Create(Options(GetParam())));
  }
  SelectResult Select(int64_t step, int64_t budget) {
    SelectRequest r;
    r.context = ctx_.get();
    r.scorer = ScorerKind::kMass;
    r.stability = false;
    r.head_queries = q_;
    r.budget_blocks = budget;
    r.step = step;
    SelectResult out;
    EXPECT_OK(sel_->Select(r, &out));
    EXPECT_EQ(out.mass_sparse, GetParam() == 0);
    return out;
  }
  static bool Has(const SelectResult& r, int64_t page) {
    return std::binary_search(r.blocks.begin(), r.blocks.end(), page);
  }
  std::vector<float> q_;
  std::unique_ptr<ContextIndex> ctx_;
  std::unique_ptr<Selector> sel_;
};

// retrieval_share caps how many free slots go to targets: planted targets
// (at least two clear the gate), 4 free slots, share 0.25: one target, the
// rest of the budget by the prior.
TEST_P(MassCalibrationTest, RetrievalShareCapsTheTargets) {
  SelectionCalibration c = Calibration();
  c.head_min_mass = 0.2f;
  Build(c, {200, 300, 400});
  SelectResult all = Select(1, 6);
  EXPECT_GE(Has(all, 200) + Has(all, 300) + Has(all, 400), 2)
      << ::testing::PrintToString(all.blocks);
  c.retrieval_share = 0.25f;
  Build(c, {200, 300, 400});
  SelectResult capped = Select(1, 6);
  EXPECT_EQ(Has(capped, 200) + Has(capped, 300) + Has(capped, 400), 1);
  EXPECT_TRUE(Has(capped, ctx_->tree().num_pages() - 2)) << "recent blocks take the rest";
}

// A calibrated sink competes with its own mass instead of being forced.
TEST_P(MassCalibrationTest, ACalibratedSinkCompetes) {
  SelectionCalibration c = Calibration();
  c.sink_blocks = 0;
  c.sink_mass = c.sink_mass_all = 0.01f;  // below every prior
  Build(c, {});
  EXPECT_FALSE(Has(Select(1, 4), 0));
  c.sink_mass = c.sink_mass_all = 5.0f;  // above every prior
  Build(c, {});
  EXPECT_TRUE(Has(Select(1, 4), 0));
  c.sink_blocks = -1;  // the options' sink (1): forced whatever its mass
  c.sink_mass = c.sink_mass_all = -1.0f;
  Build(c, {});
  EXPECT_TRUE(Has(Select(1, 4), 0));
}

INSTANTIATE_TEST_SUITE_P(FlatAndSparse, MassCalibrationTest,
                         ::testing::Values(int64_t{1} << 40, int64_t{0}),
                         [](const auto& info) { return info.param == 0 ? "Sparse" : "Flat"; });

// Bad head queries are refused before the sparse path runs, naming the
// field, and leave the context as it was: a later good request chooses as
// on a context that never saw them.
TEST(MassTreeTest, BadHeadQueriesAreRefusedOnTheSparsePath) {
  std::mt19937 rng(4);
  auto ctx = NewContext(), twin = NewContext();
  auto empty = NewContext();
  std::vector<BlockSummary> pages;
  pages.reserve(1024);
  for (int i = 0; i < 1024; ++i) pages.push_back(Page(&rng));
  ASSERT_OK(ctx->AddSegment(pages));
  ASSERT_OK(twin->AddSegment(pages));
  auto sel = *Selector::Create(Options(0));
  std::vector<float> q(kD, 0.5f);
  SelectRequest r;
  r.scorer = ScorerKind::kMass;
  r.stability = false;
  r.budget_blocks = 16;
  r.context = ctx.get();
  SelectResult out;
  const std::vector<float> short_q(kD - 1, 0.5f);
  r.head_queries = short_q;
  EXPECT_THAT(sel->Select(r, &out), StatusIs(absl::StatusCode::kInvalidArgument,
                                             ::testing::HasSubstr("head_queries has 63 values")));
  std::vector<float> nan_q = q;
  nan_q[7] = std::numeric_limits<float>::quiet_NaN();
  r.head_queries = nan_q;
  EXPECT_THAT(sel->Select(r, &out),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("head_queries")));
  const std::vector<float> zero_q(kD, 0.0f);
  r.head_queries = zero_q;
  EXPECT_THAT(sel->Select(r, &out),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("all zero")));
  r.head_queries = q;
  r.context = empty.get();
  EXPECT_THAT(sel->Select(r, &out), StatusIs(absl::StatusCode::kInvalidArgument,
                                             ::testing::HasSubstr("context is empty")));
  SelectResult a, b;
  r.context = ctx.get();
  ASSERT_OK(sel->Select(r, &a));
  auto fresh = *Selector::Create(Options(0));
  r.context = twin.get();
  ASSERT_OK(fresh->Select(r, &b));
  EXPECT_TRUE(a.mass_sparse);
  EXPECT_EQ(a.blocks, b.blocks);
  EXPECT_EQ(a.scores, b.scores);
}

TEST(MassTreeTest, BadCalibrationFieldsNameTheField) {
  BlockLayout layout;
  layout.num_layers = kLayers;
  layout.num_kv_heads = kKv;
  layout.head_dim = kD;
  layout.block_size_tokens = kT;
  auto message = [&](auto mutate) {
    SelectionCalibration c = Calibration();
    mutate(c);
    return std::string(ValidateCalibration(c, layout).message());
  };
  EXPECT_EQ(message([](SelectionCalibration&) {}), "");
  EXPECT_NE(message([](auto& c) { c.retrieval_share = 0; }).find("retrieval_share"),
            std::string::npos);
  EXPECT_NE(message([](auto& c) { c.sink_blocks = 5000; }).find("sink_blocks"), std::string::npos);
  EXPECT_NE(message([](auto& c) { c.sink_mass = 1; }).find("both or neither"), std::string::npos);
}

TEST(MassTreeTest, BadOptionsNameTheField) {
  MassTreeOptions o;
  o.max_read_fraction = 0;
  EXPECT_NE(ValidateMassTreeOptions(o).message().find("max_read_fraction"), std::string::npos);
  o = MassTreeOptions();
  o.bound_mix = 2;
  EXPECT_NE(ValidateMassTreeOptions(o).message().find("bound_mix"), std::string::npos);
  o = MassTreeOptions();
  o.min_open = 0;
  EXPECT_NE(ValidateMassTreeOptions(o).message().find("min_open"), std::string::npos);
  o = MassTreeOptions();
  o.reuse_steps = -1;
  EXPECT_NE(ValidateMassTreeOptions(o).message().find("reuse_steps"), std::string::npos);
  o = MassTreeOptions();
  o.reuse_max_kept = 0;
  EXPECT_NE(ValidateMassTreeOptions(o).message().find("reuse_max_kept"), std::string::npos);
  o = MassTreeOptions();
  o.reuse_min_cosine = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(ValidateMassTreeOptions(o).message().find("reuse_min_cosine"), std::string::npos);
  o = MassTreeOptions();
  o.reuse_keep_nats = -1;
  EXPECT_NE(ValidateMassTreeOptions(o).message().find("reuse_keep_nats"), std::string::npos);
  SelectorOptions so;
  so.mass_tree.recent_blocks = -1;
  EXPECT_NE(ValidateSelectorOptions(so).message().find("options.mass_tree.recent_blocks"),
            std::string::npos);
}

}  // namespace
}  // namespace kvtier::index
