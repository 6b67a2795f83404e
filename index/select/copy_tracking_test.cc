// Copy tracking of the mass scorer (calibration.h, copy_run): a retrieval
// head counts only while its strongest key moves forward with the steps
// (a copy), its attention moved copy_lead tokens on; the flat pass and the
// tree agree on it.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "index/context_index.h"
#include "index/select/key_scorers.h"
#include "index/select/mass_test_util.h"
#include "index/select/mass_tree.h"
#include "index/select/selector.h"
#include "index/summary/summary.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::index {
namespace {

using ::kvtier::testing::StatusIs;

using namespace mass_test;  // NOLINT(google-build-using-namespace): the shared fixtures

SelectionCalibration Calibration() {
  SelectionCalibration c = BaseCalibration();
  c.head_min_mass = 0.4f;
  c.copy_run = 3;
  c.copy_hold = 5;
  c.copy_min_blocks = 4;
  c.copy_min_mass = 0.2f;
  c.uncopied_weight = 0.0f;
  return c;
}

// ---- The copy track alone -------------------------------------------------

struct Track {
  SelectionCalibration c = Calibration();
  MassMemory memory;
  // Observes `token` at `step` over `n` pages of kT tokens.
  HeadGate At(int64_t step, int64_t token, int64_t n = 64) {
    memory.Begin(step);
    return ObserveCopy(c, &memory, 0, PositionOf(token, n, kT));
  }
};

TEST(CopyTrackTest, OffCountsEveryHeadAsItIs) {
  Track t;
  t.c.copy_run = 0;
  for (int64_t s = 0; s < 10; ++s) {
    const HeadGate g = t.At(s, 100 + s);
    EXPECT_EQ(g.min_mass, 0.4f);
    EXPECT_EQ(g.weight, 1.0f);
    EXPECT_EQ(g.lead, 0);
  }
  EXPECT_TRUE(t.memory.tracks.empty());
  // Without a memory (no step) as well.
  EXPECT_EQ(ObserveCopy(Calibration(), nullptr, 0, PositionOf(100, 64, kT)).weight, 1.0f);
}

TEST(CopyTrackTest, ARunOfForwardStepsFarBackConfirmsAndHolds) {
  Track t;
  t.c.copy_lead = 1;
  // Token 100 (page 6 of 64: 57 blocks back) moving one token per step:
  // steps 0..2 build the run (0, 1, 2), step 3 has run 3 = copy_run.
  for (int64_t s = 0; s < 3; ++s) {
    const HeadGate g = t.At(s, 100 + s);
    EXPECT_EQ(g.weight, 0.0f) << "step " << s;
    EXPECT_EQ(g.min_mass, 0.4f);
    EXPECT_EQ(g.lead, 0);
  }
  HeadGate g = t.At(3, 103);
  EXPECT_EQ(g.weight, 1.0f);
  EXPECT_EQ(g.min_mass, 0.2f);
  EXPECT_EQ(g.lead, 1);
  EXPECT_EQ(t.memory.tracks[0].confirmed, 3);
  // The head jumps elsewhere: still copying for copy_hold (5) steps after
  // step 3, then not.
  for (int64_t s = 4; s <= 8; ++s) EXPECT_EQ(t.At(s, 7 * s % 50).weight, 1.0f) << s;
  EXPECT_EQ(t.At(9, 900).weight, 0.0f);
}

TEST(CopyTrackTest, CopyWeightScalesOnlyACopyingHead) {
  Track t;
  t.c.copy_weight = 8.0f;
  for (int64_t s = 0; s < 3; ++s) EXPECT_EQ(t.At(s, 100 + s).weight, 0.0f) << "step " << s;
  EXPECT_EQ(t.At(3, 103).weight, 8.0f);
  // The run breaks: still copying for copy_hold (5) steps, weighted.
  for (int64_t s = 4; s <= 8; ++s) EXPECT_EQ(t.At(s, 7 * s % 50).weight, 8.0f) << "step " << s;
  t.c.uncopied_weight = 0.5f;
  EXPECT_EQ(t.At(20, 900).weight, 0.5f);  // past copy_hold: the uncopied weight, not scaled
}

TEST(CopyTrackTest, NearTargetsJumpsAndRepeatsDoNotConfirm) {
  Track near;
  // Page 61 of 64: 2 blocks back, under copy_min_blocks (4).
  for (int64_t s = 0; s < 8; ++s) EXPECT_EQ(near.At(s, 61 * kT + s).weight, 0.0f) << s;
  EXPECT_GE(near.memory.tracks[0].run, 3);
  EXPECT_EQ(near.memory.tracks[0].confirmed, -1);

  Track jumps;
  // Forward twice, then a jump: the run starts again.
  const int64_t tokens[] = {100, 101, 102, 300, 301, 302, 303};
  for (int64_t s = 0; s < 6; ++s) EXPECT_EQ(jumps.At(s, tokens[s]).weight, 0.0f) << s;
  EXPECT_EQ(jumps.At(6, tokens[6]).weight, 1.0f);

  Track repeats;
  // The same step asked again recomputes from the same state: no run.
  for (int i = 0; i < 6; ++i) EXPECT_EQ(repeats.At(0, 100).weight, 0.0f);
  EXPECT_EQ(repeats.memory.tracks[0].run, 0);
  // A skipped step counts when the key moved as far as the steps did.
  Track skips;
  skips.At(0, 100);
  skips.At(2, 102);
  skips.At(5, 105);
  EXPECT_EQ(skips.At(6, 106).weight, 1.0f);
}

// ---- Through the scorers -------------------------------------------------

// Pages of noise keys; the tokens of pages [first, first + span) are the
// passage: token k of page p has the key 80 (0.8 u_p + 0.6 e_k) (u_p, e_k
// random unit vectors), so that the page stands out as a whole (its mean)
// and the query 0.8 u_p + 0.6 e_k scores token k highest within it.
class CopyContext {
 public:
  CopyContext(int64_t pages, int64_t first, int64_t span, uint32_t seed) : rng_(seed) {
    std::normal_distribution<float> noise(0.0f, 1.0f);
    auto unit = [&] {
      std::vector<float> v(kD);
      float norm = 0;
      for (float& x : v) {
        x = noise(rng_);
        norm += x * x;
      }
      for (float& x : v) x /= std::sqrt(norm);
      return v;
    };
    first_token_ = first * kT;
    for (int64_t p = 0; p < span; ++p) {
      const std::vector<float> u = unit();
      for (int t = 0; t < kT; ++t) {
        const std::vector<float> e = unit();
        for (int d = 0; d < kD; ++d) dirs_.push_back(0.8f * u[d] + 0.6f * e[d]);
      }
    }
    for (int64_t p = 0; p < pages; ++p) {
      std::vector<float> keys(kT * kD);
      for (float& k : keys) k = 0.3f * noise(rng_);
      if (p >= first && p < first + span) {
        for (int t = 0; t < kT; ++t) {
          for (int d = 0; d < kD; ++d) {
            keys[t * kD + d] = 80.0f * dirs_[((p - first) * kT + t) * kD + d];
          }
        }
      }
      pages_.push_back(PageOfKeys(keys));
    }
  }

  std::unique_ptr<ContextIndex> NewIndex(const SelectionCalibration& c) const {
    std::unique_ptr<ContextIndex> ctx = NewContext(c);
    EXPECT_OK(ctx->AddSegment(pages_));
    return ctx;
  }

  // The query that scores passage token `k` highest (its key's direction).
  std::vector<float> QueryFor(int64_t k) const {
    const int64_t i = k - first_token_;
    return std::vector<float>(dirs_.begin() + i * kD, dirs_.begin() + (i + 1) * kD);
  }

 private:
  std::mt19937 rng_;
  std::vector<float> dirs_;
  int64_t first_token_ = 0;
  std::vector<BlockSummary> pages_;
};

// The flat pass follows a head reading a passage: nothing before the run
// confirms, then the page of its next token (copy_lead 1).
TEST(CopyTrackTest, FlatPassCountsTheHeadOnlyWhileItCopies) {
  constexpr int64_t kPages = 64, kFirst = 10;
  const CopyContext cc(kPages, kFirst, 4, 3);
  SelectionCalibration c = Calibration();
  c.copy_lead = 1;
  auto ctx = cc.NewIndex(c);
  KeyScorerScratch scratch;
  std::vector<float> out(kPages), prior(kPages);
  for (int64_t b = 0; b < kPages; ++b) prior[b] = PriorOf(c, true, kPages, b);
  const std::vector<int32_t> slots = KeyHeadSlots(c, kKv);
  // The head reads tokens 171.. (page 10, offsets 11..15, then page 11).
  for (int64_t s = 0; s < 8; ++s) {
    const int64_t token = kFirst * kT + 11 + s;
    const std::vector<float> q = cc.QueryFor(token);
    ctx->mass_memory().Begin(s);
    ASSERT_OK(MassScores({ctx->keys(), &c, slots, kD, kPages, q, &ctx->mass_memory()}, &scratch,
                         absl::MakeSpan(out)));
    const int64_t next_page = (token + 1) / kT;
    if (s < c.copy_run) {
      EXPECT_EQ(out, prior) << "step " << s << ": not copying yet";
    } else {
      EXPECT_GT(out[next_page] - prior[next_page], 0.5f) << "step " << s;
      for (int64_t b = 0; b < kPages; ++b) {
        if (b != next_page) EXPECT_NEAR(out[b], prior[b], 0.2f) << "step " << s << " page " << b;
      }
    }
  }
}

// The tree (a long context) and the flat pass choose the same blocks step
// by step while a head copies from far back, and neither before.
TEST(CopyTrackTest, TreeAndFlatPassAgreeWhileTheHeadCopies) {
  constexpr int64_t kPages = 1024, kFirst = 300;
  const CopyContext cc(kPages, kFirst, 4, 4);
  SelectionCalibration c = Calibration();
  c.copy_lead = 1;
  auto flat = cc.NewIndex(c), sparse = cc.NewIndex(c);
  SelectorOptions fo, so;
  fo.sink_blocks = so.sink_blocks = 1;
  fo.local_blocks = so.local_blocks = 1;
  fo.mass_tree.min_blocks = int64_t{1} << 40;
  so.mass_tree.min_blocks = 0;
  auto flat_sel = *Selector::Create(fo);
  auto sparse_sel = *Selector::Create(so);
  for (int64_t s = 0; s < 30; ++s) {
    const int64_t token = kFirst * kT + 3 + s;
    const std::vector<float> q = cc.QueryFor(token);
    SelectRequest r;
    r.scorer = ScorerKind::kMass;
    r.stability = false;
    r.budget_blocks = 6;
    r.step = s;
    r.head_queries = q;
    SelectResult a, b;
    r.context = flat.get();
    ASSERT_OK(flat_sel->Select(r, &a));
    r.context = sparse.get();
    ASSERT_OK(sparse_sel->Select(r, &b));
    EXPECT_FALSE(a.mass_sparse);
    EXPECT_TRUE(b.mass_sparse);
    EXPECT_EQ(a.blocks, b.blocks) << "step " << s;
    const int64_t next_page = (token + 1) / kT;
    const bool chosen = std::count(a.blocks.begin(), a.blocks.end(), next_page) > 0;
    EXPECT_EQ(chosen, s >= c.copy_run) << "step " << s;
    EXPECT_EQ(flat->mass_memory().tracks, sparse->mass_memory().tracks) << "step " << s;
  }
}

// With one free slot, the block after the sink and the local block that the
// prior ranks first (distance 1, prior 1.5 here) outranks a copy target
// whose term is at most 1; copy_weight 8 gives the target the slot, and
// only once the head copies.
TEST(CopyTrackTest, CopyWeightGivesACopyTargetTheFreeSlot) {
  constexpr int64_t kPages = 64, kFirst = 10;
  const CopyContext cc(kPages, kFirst, 4, 5);
  for (float weight : {1.0f, 8.0f}) {
    SelectionCalibration c = Calibration();
    c.copy_lead = 1;
    c.prior[1] = 1.5f;
    c.copy_weight = weight;
    auto ctx = cc.NewIndex(c);
    SelectorOptions o;
    o.sink_blocks = 1;
    o.local_blocks = 1;
    auto sel = *Selector::Create(o);
    for (int64_t s = 0; s < 8; ++s) {
      const int64_t token = kFirst * kT + 3 + s;
      const std::vector<float> q = cc.QueryFor(token);
      SelectRequest r;
      r.context = ctx.get();
      r.scorer = ScorerKind::kMass;
      r.stability = false;
      r.budget_blocks = 3;
      r.step = s;
      r.head_queries = q;
      SelectResult out;
      ASSERT_OK(sel->Select(r, &out));
      const int64_t next_page = (token + 1) / kT;
      const bool target = std::count(out.blocks.begin(), out.blocks.end(), next_page) > 0;
      const bool recent = std::count(out.blocks.begin(), out.blocks.end(), kPages - 2) > 0;
      const bool wins = weight > 1.0f && s >= c.copy_run;
      EXPECT_EQ(target, wins) << "weight " << weight << " step " << s;
      EXPECT_EQ(recent, !wins) << "weight " << weight << " step " << s;
    }
  }
}

TEST(CopyTrackTest, ValidationNamesTheCopyFields) {
  BlockLayout layout;
  layout.num_layers = kLayers;
  layout.num_kv_heads = kKv;
  layout.head_dim = kD;
  layout.block_size_tokens = kT;
  auto check = [&](auto edit, const char* field) {
    SelectionCalibration c = Calibration();
    edit(c);
    EXPECT_THAT(ValidateCalibration(c, layout),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr(field)));
  };
  EXPECT_OK(ValidateCalibration(Calibration(), layout));
  check([](SelectionCalibration& c) { c.copy_run = -1; }, "calibration.copy_run");
  check([](SelectionCalibration& c) { c.copy_run = 5000; }, "calibration.copy_run");
  check([](SelectionCalibration& c) { c.copy_hold = -2; }, "calibration.copy_hold");
  check([](SelectionCalibration& c) { c.copy_min_blocks = 4097; }, "calibration.copy_min_blocks");
  check([](SelectionCalibration& c) { c.copy_lead = -1; }, "calibration.copy_lead");
  check([](SelectionCalibration& c) { c.copy_min_mass = 1.0f; }, "calibration.copy_min_mass");
  check([](SelectionCalibration& c) { c.uncopied_weight = 1.5f; }, "calibration.uncopied_weight");
  check([](SelectionCalibration& c) { c.copy_weight = 0.5f; }, "calibration.copy_weight");
  check([](SelectionCalibration& c) { c.copy_weight = 65.0f; }, "calibration.copy_weight");
  check([](SelectionCalibration& c) { c.copy_weight = NAN; }, "calibration.copy_weight");
  // An uncalibrated value with copy fields set is refused.
  SelectionCalibration none;
  none.copy_run = 4;
  EXPECT_THAT(ValidateCalibration(none, layout),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("calibration.num_q_heads is 0")));
  SelectionCalibration weighted;
  weighted.copy_weight = 2.0f;
  EXPECT_THAT(ValidateCalibration(weighted, layout),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("calibration.num_q_heads is 0")));
}

}  // namespace
}  // namespace kvtier::index
