// The descent's int8 page scoring (SelectorOptions::q8_pages) against fp16
// scoring of every candidate: the same results, bit for bit.
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "index/selector.h"
#include "index/selector_test_util.h"
#include "tests/testutil/synthetic.h"

namespace kvtier::index {
namespace {

using ::kvtier::testutil::MakeSyntheticContext;
using ::kvtier::testutil::SyntheticContext;
using ::kvtier::testutil::SyntheticContextOptions;

std::unique_ptr<ContextIndex> MakeContext(const std::vector<float>& vectors, int32_t dim, bool q8) {
  TreeOptions o;
  o.dim = dim;
  o.q8_pages = q8;
  return MakeTestContext(vectors, o);
}

std::unique_ptr<Selector> MakeSelector(const SelectorOptions& o) { return MakeTestSelector(o); }

// Contexts whose keys share a strong common direction (many near-ties in
// affinity), anchors drifting between topics, appends, steps with and
// without stability, budgets from "nothing free" to "more than the
// candidates".
TEST(SelectorQ8Test, EqualsFp16ScoringStepForStep) {
  for (uint64_t seed : {1, 2, 3}) {
    SyntheticContextOptions so;
    so.num_blocks = 3000 + 1000 * seed;
    so.num_planted = 24;
    so.planted_run = 3;
    so.common = 2.0f;
    so.seed = seed;
    const SyntheticContext syn = MakeSyntheticContext(so);
    auto q8_ctx = MakeContext(syn.vectors, syn.dim, /*q8=*/true);
    auto fp16_ctx = MakeContext(syn.vectors, syn.dim, /*q8=*/false);
    ASSERT_TRUE(q8_ctx->tree().options().q8_pages);
    ASSERT_NE(q8_ctx->tree().q8_pages(), nullptr);
    ASSERT_EQ(fp16_ctx->tree().q8_pages(), nullptr);
    SelectorOptions o;
    o.grid_keep_fraction = 0.75;
    o.chunk_keep_fraction = 0.3;
    o.page_keep_fraction = 0.05;
    o.stability.theta = 0.75f;
    auto q8 = MakeSelector(o);
    auto fp16 = MakeSelector(o);
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::normal_distribution<float> normal;
    std::vector<float> anchor = syn.anchor;
    int64_t candidates = 0, rescored = 0;
    for (int64_t step = 0; step < 150; ++step) {
      for (float& x : anchor) x += 0.15f * normal(rng);
      if (step % 4 == 0) {
        std::vector<float> v(syn.dim);
        for (float& x : v) x = normal(rng);
        ASSERT_TRUE(q8_ctx->tree().Append(v).ok());
        ASSERT_TRUE(fp16_ctx->tree().Append(v).ok());
      }
      const int64_t n = q8_ctx->tree().num_pages();
      SelectRequest r;
      r.anchor = anchor;
      r.step = step;
      r.stability = step % 7 != 0;
      switch (step % 10) {
        case 0:
          r.budget_blocks = 5;
          break;  // sinks + locals only
        case 1:
          r.budget_blocks = n / 2;
          break;  // more than the candidates
        default:
          r.budget_blocks = 5 + n / 100 + step % 13;
      }
      SelectResult a, b;
      r.context = q8_ctx.get();
      ASSERT_TRUE(q8->Select(r, &a).ok());
      r.context = fp16_ctx.get();
      ASSERT_TRUE(fp16->Select(r, &b).ok());
      ASSERT_EQ(a.blocks, b.blocks) << "seed " << seed << " step " << step;
      ASSERT_EQ(a.scores, b.scores) << "seed " << seed << " step " << step;
      ASSERT_EQ(a.prefetch, b.prefetch) << "seed " << seed << " step " << step;
      EXPECT_EQ(a.candidates, b.candidates);
      EXPECT_EQ(a.held, b.held);
      EXPECT_EQ(a.rows_scored, b.rows_scored);
      EXPECT_EQ(b.rescored, 0);
      candidates += a.candidates;
      rescored += a.rescored;
    }
    // The int8 rows did the work: most candidates were never re-scored.
    EXPECT_GT(rescored, 0) << "seed " << seed;
    EXPECT_LT(rescored, candidates / 2) << "seed " << seed;
  }
}

// Turning the option off (or a tree without int8 rows) scores in fp16.
TEST(SelectorQ8Test, OptionOffScoresInFp16) {
  SyntheticContextOptions so;
  so.num_blocks = 2048;
  const SyntheticContext syn = MakeSyntheticContext(so);
  auto ctx = MakeContext(syn.vectors, syn.dim, /*q8=*/true);
  auto ctx2 = MakeContext(syn.vectors, syn.dim, /*q8=*/true);
  SelectorOptions o;
  o.q8_pages = false;
  auto off = MakeSelector(o);
  o.q8_pages = true;
  auto on = MakeSelector(o);
  SelectRequest r;
  r.context = ctx.get();
  r.anchor = syn.anchor;
  r.budget_blocks = 40;
  SelectResult a, b;
  ASSERT_TRUE(off->Select(r, &a).ok());
  r.context = ctx2.get();
  ASSERT_TRUE(on->Select(r, &b).ok());
  EXPECT_EQ(a.rescored, 0);
  EXPECT_GT(b.rescored, 0);
  EXPECT_LT(b.rescored, b.candidates);
  EXPECT_EQ(a.blocks, b.blocks);
  EXPECT_GE(
      ctx->tree().MemoryBytes(),
      MakeContext(syn.vectors, syn.dim, /*q8=*/false)->tree().MemoryBytes() + 2048u * (128 + 16));
}

}  // namespace
}  // namespace kvtier::index
