// The final ranking (rank.h): what it keeps, how it breaks ties, what
// stability holds, and that SelectFlat ranks a flat scorer exactly as the
// Selector does (the quality harness ranks its own scorers with it).
#include "index/select/rank.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "index/select/selector.h"
#include "index/select/selector_test_util.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::index {
namespace {

using ::kvtier::testing::StatusIs;

FlatStep Step(const std::vector<float>& aff, int64_t sinks, int64_t locals, int64_t budget,
              int64_t step) {
  FlatStep f;
  f.affinity = aff;
  f.sink_blocks = sinks;
  f.local_blocks = locals;
  f.budget = budget;
  f.step = step;
  return f;
}

RankOptions Plain() {
  RankOptions o;
  o.use_stability = false;
  o.max_prefetch = 8;
  return o;
}

TEST(RankTest, KeepsSinksTheLocalWindowAndTheBestOfTheRest) {
  const std::vector<float> aff = {0.1f, 0.9f, 0.3f, 0.8f, 0.2f, 0.05f};
  StabilityTracker st;
  RankScratch s;
  SelectResult out;
  ASSERT_OK(SelectFlat(Plain(), Step(aff, 1, 1, 4, 0), &st, &s, &out));
  EXPECT_EQ(out.blocks, (std::vector<int64_t>{0, 1, 3, 5}));
  EXPECT_EQ(out.scores, (std::vector<float>{0.1f, 0.9f, 0.8f, 0.05f}));
  EXPECT_EQ(out.candidates, 4) << "pages 1-4 competed";
  // A budget of every page keeps them all.
  ASSERT_OK(SelectFlat(Plain(), Step(aff, 1, 1, 6, 1), &st, &s, &out));
  EXPECT_EQ(out.blocks.size(), 6u);
}

TEST(RankTest, TiesGoToTheLowerPageOrForTheMassScorerTheMoreRecent) {
  const std::vector<float> aff = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
  StabilityTracker st;
  RankScratch s;
  SelectResult out;
  ASSERT_OK(SelectFlat(Plain(), Step(aff, 0, 0, 2, 0), &st, &s, &out));
  EXPECT_EQ(out.blocks, (std::vector<int64_t>{0, 1}));
  RankOptions recent = Plain();
  recent.recent_ties = true;
  ASSERT_OK(SelectFlat(recent, Step(aff, 0, 0, 2, 1), &st, &s, &out));
  EXPECT_EQ(out.blocks, (std::vector<int64_t>{3, 4}));
}

TEST(RankTest, AStepBeforeTheLastIsRefusedAndChangesNothing) {
  const std::vector<float> aff = {0.2f, 0.9f, 0.1f};
  StabilityTracker st;
  RankScratch s;
  SelectResult out;
  ASSERT_OK(SelectFlat(Plain(), Step(aff, 0, 0, 1, 5), &st, &s, &out));
  EXPECT_THAT(SelectFlat(Plain(), Step(aff, 0, 0, 1, 4), &st, &s, &out),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(st.step(), 5);
  EXPECT_OK(SelectFlat(Plain(), Step(aff, 0, 0, 1, 5), &st, &s, &out)) << "the same step again";
}

// A page above theta for many steps keeps its place for a while when a
// newcomer edges past it; without stability the newcomer wins at once, and
// the loser, still rising, is offered for prefetch.
TEST(RankTest, StabilityHoldsAPageAndPrefetchesTheRisingLoser) {
  RankOptions o;
  o.stability.theta = 0.5f;
  o.stability.window_steps = 8;
  o.stability.weight = 0.5f;
  o.max_prefetch = 4;
  StabilityTracker st;
  RankScratch s;
  SelectResult out;
  std::vector<float> aff = {0.1f, 0.9f, 0.2f, 0.1f};
  for (int64_t step = 0; step < 8; ++step) {
    ASSERT_OK(SelectFlat(o, Step(aff, 0, 0, 1, step), &st, &s, &out));
    EXPECT_EQ(out.blocks, (std::vector<int64_t>{1}));
  }
  aff = {0.1f, 0.7f, 0.8f, 0.1f};
  ASSERT_OK(SelectFlat(o, Step(aff, 0, 0, 1, 8), &st, &s, &out));
  EXPECT_EQ(out.blocks, (std::vector<int64_t>{1})) << "held by its history";
  EXPECT_EQ(out.prefetch, (std::vector<int64_t>{2})) << "the newcomer rises";
  StabilityTracker fresh;
  ASSERT_OK(SelectFlat(Plain(), Step(aff, 0, 0, 1, 8), &fresh, &s, &out));
  EXPECT_EQ(out.blocks, (std::vector<int64_t>{2}));
}

// The Selector's flat path and SelectFlat over the same affinities (the
// random scorer's): the same blocks, scores and prefetch at every step,
// stability on, budgets from one free block to most of the context.
TEST(RankTest, SelectFlatRanksAsTheSelector) {
  constexpr int32_t kDim = 8;
  constexpr int64_t kPages = 200;
  std::mt19937 rng(3);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> vectors(kPages * kDim);
  for (float& x : vectors) x = noise(rng);
  TreeOptions to;
  to.dim = kDim;
  auto ctx = MakeTestContext(vectors, to);
  ASSERT_NE(ctx, nullptr);
  SelectorOptions so;
  so.sink_blocks = 2;
  so.local_blocks = 3;
  so.stability.theta = 0.6f;
  so.stability.window_steps = 8;
  so.stability.weight = 0.4f;
  so.stability.hold_threshold = 0.5f;
  auto selector = MakeTestSelector(so);
  ASSERT_NE(selector, nullptr);
  RankOptions ro;
  ro.stability = so.stability;
  ro.max_prefetch = so.max_prefetch_blocks;
  StabilityTracker st;
  RankScratch s;
  SelectResult flat, daemon;
  std::vector<float> aff(kPages);
  int64_t prefetched = 0;
  for (int64_t step = 0; step < 60; ++step) {
    const int64_t budget = 6 + (step * 37) % 150;
    SummaryView view;
    view.dim = kDim;
    view.num_blocks = kPages;
    ScoreInput in;
    in.seed = 11;
    in.step = step;
    ASSERT_OK(ScoreBlocks(ScorerKind::kRandom, view, in, absl::MakeSpan(aff)));
    ASSERT_OK(
        SelectFlat(ro, Step(aff, so.sink_blocks, so.local_blocks, budget, step), &st, &s, &flat));
    SelectRequest r;
    r.context = ctx.get();
    r.scorer = ScorerKind::kRandom;
    r.seed = 11;
    r.step = step;
    r.budget_blocks = budget;
    ASSERT_OK(selector->Select(r, &daemon));
    EXPECT_EQ(flat.blocks, daemon.blocks) << "step " << step;
    EXPECT_EQ(flat.scores, daemon.scores) << "step " << step;
    EXPECT_EQ(flat.prefetch, daemon.prefetch) << "step " << step;
    prefetched += static_cast<int64_t>(daemon.prefetch.size());
  }
  EXPECT_GT(prefetched, 0) << "stability took part";
}

}  // namespace
}  // namespace kvtier::index
