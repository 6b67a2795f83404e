// The mass tree's reuse from step to step (mass_tree.h, MassReuse) on
// synthetic keys: a head whose query holds reopens its kept pages instead
// of descending, and finds what the full descent finds; drift, age, growth
// and a target the sample sees send it back to the full descent; a
// repeated step repeats its choice; the state stays bounded.
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "index/context_index.h"
#include "index/select/mass_test_util.h"
#include "index/select/mass_tree.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::index {
namespace {

using namespace mass_test;  // NOLINT(google-build-using-namespace): the shared fixtures

constexpr int64_t kPages = 4096;
// With 4096 pages (256 chunks) the sample is every 32nd chunk from chunk
// 16 on, and in each its pages 1, 5, 9 and 13: page 48 * 16 + 5 is one.
constexpr int64_t kFar = 700, kSampled = 48 * 16 + 5;

SelectionCalibration Calibration() {
  SelectionCalibration c = BaseCalibration();
  c.head_weights = {0.9f};
  c.head_min_mass = 0.4f;
  return c;
}

std::vector<float> RandomQuery(std::mt19937* rng) {
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> q(kD);
  for (float& x : q) x = noise(*rng);
  return q;
}

// kPages pages of noise keys; page targets[i]'s token 5 is queries[i]
// times 1.5 (a page the flat pass gates, mass_tree_test.cc).
std::unique_ptr<ContextIndex> Context(const std::vector<int64_t>& targets,
                                      const std::vector<std::vector<float>>& queries) {
  std::mt19937 rng(7);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  auto ctx = NewContext(Calibration());
  std::vector<BlockSummary> pages;
  pages.reserve(kPages);
  for (int64_t p = 0; p < kPages; ++p) {
    std::vector<float> keys(kT * kD);
    for (float& k : keys) k = noise(rng);
    for (size_t i = 0; i < targets.size(); ++i) {
      if (targets[i] != p) continue;
      for (int d = 0; d < kD; ++d) keys[5 * kD + d] = 1.5f * queries[i][d];
    }
    pages.push_back(PageOfKeys(keys));
  }
  EXPECT_OK(ctx->AddSegment(pages));
  return ctx;
}

// One step of the tree on ctx with its own reuse state.
struct Step {
  std::vector<MassBump> bumps;
  MassTreeStats stats;
};

Step StepOn(ContextIndex* ctx, const std::vector<float>& q, int64_t step,
            const MassTreeOptions& options, MassTreeScratch* s) {
  MassReuse& reuse = ctx->mass_reuse();
  reuse.Begin(step, 1);
  MassTreeInput in;
  in.table = ctx->keys();
  in.calibration = &ctx->calibration();
  in.slots = ctx->key_slots();
  in.dim = kD;
  in.head_queries = q;
  in.reuse = &reuse;
  Step out;
  EXPECT_OK(MassTreeBumps(in, options, s, &out.bumps, &out.stats));
  return out;
}

bool Bumps(const Step& s, int64_t page) {
  for (const MassBump& b : s.bumps) {
    if (b.page == page) return true;
  }
  return false;
}

// The same query step after step: the first step descends, the next ones
// reopen the kept pages (no summaries screened, no more pages read) and
// give the planted page the share the full descent gives, within 2% (z is
// estimated from fewer pages).
TEST(MassReuseTest, AHeldQueryReopensItsPagesAndFindsWhatTheDescentFinds) {
  std::mt19937 rng(3);
  const std::vector<float> q = RandomQuery(&rng);
  auto ctx = Context({kFar}, {q});
  MassTreeScratch s;
  MassTreeOptions o;
  const Step first = StepOn(ctx.get(), q, 1, o, &s);
  EXPECT_EQ(first.stats.heads_descended, 1);
  EXPECT_EQ(first.stats.heads_reused, 0);
  ASSERT_TRUE(Bumps(first, kFar));
  for (int64_t step = 2; step <= o.reuse_steps + 1; ++step) {
    const Step next = StepOn(ctx.get(), q, step, o, &s);
    EXPECT_EQ(next.stats.heads_reused, 1) << "step " << step;
    EXPECT_EQ(next.stats.pages_screened + next.stats.chunks_screened, 0) << "step " << step;
    EXPECT_LE(next.stats.pages_opened, first.stats.pages_opened) << "step " << step;
    ASSERT_EQ(next.bumps.size(), first.bumps.size()) << "step " << step;
    for (size_t i = 0; i < next.bumps.size(); ++i) {
      EXPECT_EQ(next.bumps[i].page, first.bumps[i].page) << "step " << step;
      EXPECT_NEAR(next.bumps[i].mass, first.bumps[i].mass, 0.02f * first.bumps[i].mass);
    }
  }
  // reuse_steps reusing steps, then the full descent again.
  const Step refresh = StepOn(ctx.get(), q, o.reuse_steps + 2, o, &s);
  EXPECT_EQ(refresh.stats.heads_descended, 1);
  EXPECT_GT(refresh.stats.chunks_screened, 0);
}

// A query that drifted below reuse_min_cosine, more than recent_blocks pages
// appended, or reuse_steps 0: the full descent.
TEST(MassReuseTest, DriftGrowthAndNoReuseDescend) {
  std::mt19937 rng(4);
  const std::vector<float> q = RandomQuery(&rng);
  auto ctx = Context({kFar}, {q});
  MassTreeScratch s;
  MassTreeOptions o;
  ASSERT_EQ(StepOn(ctx.get(), q, 1, o, &s).stats.heads_descended, 1);
  std::vector<float> drifted = RandomQuery(&rng);  // nearly orthogonal to q
  EXPECT_EQ(StepOn(ctx.get(), drifted, 2, o, &s).stats.heads_descended, 1);
  // Back to q: the state the drifted step left is a descent for it, so
  // q reuses only after its own descent.
  EXPECT_EQ(StepOn(ctx.get(), q, 3, o, &s).stats.heads_descended, 1);
  EXPECT_EQ(StepOn(ctx.get(), q, 4, o, &s).stats.heads_reused, 1);
  std::mt19937 page_rng(5);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  for (int32_t i = 0; i <= o.recent_blocks; ++i) {
    std::vector<float> keys(kT * kD);
    for (float& k : keys) k = noise(page_rng);
    ASSERT_OK(ctx->Append(PageOfKeys(keys)));
  }
  EXPECT_EQ(StepOn(ctx.get(), q, 5, o, &s).stats.heads_descended, 1)
      << "recent_blocks + 1 appended";
  MassTreeOptions off;
  off.reuse_steps = 0;
  EXPECT_EQ(StepOn(ctx.get(), q, 6, off, &s).stats.heads_descended, 1);
}

// Reuse at any drift (reuse_min_cosine -1): the query moves to a page the
// descent of the last step did not keep. On a page of the sample, the
// sample sees it and the head descends in the same step, finding it.
TEST(MassReuseTest, ATargetTheSampleSeesSendsTheHeadBackToTheDescent) {
  std::mt19937 rng(6);
  const std::vector<float> qa = RandomQuery(&rng), qb = RandomQuery(&rng);
  auto ctx = Context({kFar, kSampled}, {qa, qb});
  MassTreeScratch s;
  MassTreeOptions o;
  o.reuse_min_cosine = -1.0f;
  const Step a = StepOn(ctx.get(), qa, 1, o, &s);
  ASSERT_TRUE(Bumps(a, kFar));
  ASSERT_FALSE(Bumps(a, kSampled));
  const Step b = StepOn(ctx.get(), qb, 2, o, &s);
  EXPECT_EQ(b.stats.heads_descended, 1);
  EXPECT_EQ(b.stats.heads_reused, 0);
  EXPECT_TRUE(Bumps(b, kSampled));
  EXPECT_FALSE(Bumps(b, kFar));
}

// A step run again starts from the state the last earlier step left: the
// same choice and the same decision, whatever the first run kept.
TEST(MassReuseTest, RepeatingAStepRepeatsItsChoice) {
  std::mt19937 rng(8);
  const std::vector<float> q = RandomQuery(&rng);
  auto ctx = Context({kFar}, {q});
  MassTreeScratch s;
  MassTreeOptions o;
  StepOn(ctx.get(), q, 1, o, &s);
  const Step once = StepOn(ctx.get(), q, 2, o, &s);
  const Step again = StepOn(ctx.get(), q, 2, o, &s);
  EXPECT_EQ(once.stats.heads_reused, 1);
  EXPECT_EQ(again.stats.heads_reused, 1);
  EXPECT_EQ(once.stats.pages_opened, again.stats.pages_opened);
  ASSERT_EQ(once.bumps.size(), again.bumps.size());
  for (size_t i = 0; i < once.bumps.size(); ++i) {
    EXPECT_EQ(once.bumps[i].page, again.bumps[i].page);
    EXPECT_EQ(once.bumps[i].mass, again.bumps[i].mass);
  }
}

// Many strong pages, reuse_max_kept 2: the state keeps two pages per head
// (the strongest), and the context counts its bytes.
TEST(MassReuseTest, TheStateIsBoundedAndCounted) {
  std::mt19937 rng(9);
  const std::vector<float> q = RandomQuery(&rng);
  std::vector<int64_t> targets;
  for (int64_t p = 300; p < 3000; p += 300) targets.push_back(p);
  auto ctx = Context(targets, std::vector<std::vector<float>>(targets.size(), q));
  MassTreeScratch s;
  MassTreeOptions o;
  o.reuse_max_kept = 2;
  const size_t before = ctx->MemoryBytes();
  StepOn(ctx.get(), q, 1, o, &s);
  const MassReuse& reuse = ctx->mass_reuse();
  ASSERT_EQ(reuse.now.size(), 1u);
  EXPECT_TRUE(reuse.now[0].valid);
  EXPECT_EQ(reuse.now[0].kept.size(), 2u);
  EXPECT_EQ(reuse.now[0].query.size(), static_cast<size_t>(kD));
  EXPECT_GE(ctx->MemoryBytes(), before + reuse.MemoryBytes() - 64);
  EXPECT_GT(reuse.MemoryBytes(), 2 * sizeof(int64_t) + kD * sizeof(float));
}

}  // namespace
}  // namespace kvtier::index
