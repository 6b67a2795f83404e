#include "index/select/stability.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testutil/status_matchers.h"

using ::kvtier::testing::StatusIs;

namespace kvtier::index {
namespace {

TEST(StabilityTest, CountsRelevantStepsInTheWindow) {
  StabilityTracker t;
  t.Resize(3);
  for (int64_t step = 1; step <= 20; ++step) {
    ASSERT_OK(t.BeginStep(step));
    t.Observe(0, true);
    t.Observe(1, step % 2 == 0);
  }
  EXPECT_FLOAT_EQ(t.Stability(0, 20), 1.0f);
  EXPECT_FLOAT_EQ(t.Stability(1, 20), 0.5f);
  EXPECT_FLOAT_EQ(t.Stability(2, 20), 0.0f);
  EXPECT_FLOAT_EQ(t.Stability(0, 10), 1.0f);
  // Ten steps without observing page 0: half its window is empty.
  ASSERT_OK(t.BeginStep(30));
  EXPECT_FLOAT_EQ(t.Stability(0, 20), 0.5f);
  ASSERT_OK(t.BeginStep(200));
  EXPECT_FLOAT_EQ(t.Stability(0, 20), 0.0f);
}

// A range observation is the same as observing every page of the range
// relevant, one by one: two trackers, one fed ranges and one fed the same
// bits page by page, agree on every page's stability, rising and
// observed-this-step at every step and window, across appends, skipped and
// repeated step numbers, the log's 64-step horizon and the call counter's
// wrap-around.
TEST(StabilityTest, RangesEqualObservingEveryPage) {
  std::mt19937 rng(5);
  for (uint32_t start_calls : {0u, UINT32_MAX - 100}) {
    StabilityTracker ranged, plain;
    ranged.TEST_SetCalls(start_calls);
    plain.TEST_SetCalls(start_calls);
    int64_t n = 40, step = 0, observed_below = 0;
    for (int call = 0; call < 400; ++call) {
      if (rng() % 5 == 0) n += 1 + static_cast<int64_t>(rng() % 3);
      step += rng() % 9 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % 2);
      // Long quiet stretches let the log's entries age out.
      if (call % 150 == 149) step += 70;
      ranged.Resize(n);
      plain.Resize(n);
      ASSERT_OK(ranged.BeginStep(step));
      ASSERT_OK(plain.BeginStep(step));
      if (rng() % 4 != 0) {
        // A window step: a range, plus a few pages observed one by one.
        const int64_t edge = static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
        // ObserveRange's contract: every page below the range observed.
        for (int64_t p = observed_below; p < edge; ++p) {
          ranged.Observe(p, false);
          plain.Observe(p, false);
        }
        observed_below = n;
        ranged.ObserveRange(edge, n);
        for (int64_t p = edge; p < n; ++p) plain.Observe(p, true);
        for (int i = 0; i < 3; ++i) {
          const int64_t p = static_cast<int64_t>(rng() % static_cast<uint64_t>(edge + 1));
          if (p >= edge) continue;
          ranged.Observe(p, false);
          plain.Observe(p, false);
        }
      } else {
        // Another scorer: pages observed one by one, either bit.
        for (int i = 0; i < 20; ++i) {
          const int64_t p = static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
          const bool bit = rng() % 2 == 0;
          ranged.Observe(p, bit);
          plain.Observe(p, bit);
        }
      }
      for (int64_t p = 0; p < n; ++p) {
        ASSERT_EQ(ranged.ObservedThisStep(p), plain.ObservedThisStep(p)) << call << " " << p;
        for (int32_t w : {1, 7, 20, 21, 64}) {
          ASSERT_EQ(ranged.Stability(p, w), plain.Stability(p, w))
              << "call " << call << " page " << p << " window " << w;
          ASSERT_EQ(ranged.Rising(p, w), plain.Rising(p, w))
              << "call " << call << " page " << p << " window " << w;
        }
      }
    }
  }
}

// Regression: a block appended a moment ago had no history and lost to
// older blocks for that alone (an engine appending each finished block got
// less than a sliding window). A page is judged over its own life.
TEST(StabilityTest, NewPagesAreJudgedOverTheirOwnLife) {
  StabilityTracker t;
  t.Resize(1);
  for (int64_t step = 1; step <= 30; ++step) {
    ASSERT_OK(t.BeginStep(step));
    t.Observe(0, true);
    if (step == 27) t.Resize(2);  // appended at step 27
    if (step >= 27) t.Observe(1, true);
  }
  EXPECT_FLOAT_EQ(t.Stability(0, 20), 1.0f);
  EXPECT_FLOAT_EQ(t.Stability(1, 20), 1.0f);  // 4 of its 4 steps
  ASSERT_OK(t.BeginStep(31));
  t.Observe(1, false);
  EXPECT_FLOAT_EQ(t.Stability(1, 20), 4.0f / 5.0f);
  // Once older than the window it is judged over the window.
  for (int64_t step = 32; step <= 60; ++step) {
    ASSERT_OK(t.BeginStep(step));
    t.Observe(1, step % 4 == 0);
  }
  EXPECT_FLOAT_EQ(t.Stability(1, 20), 5.0f / 20.0f);
  // A page never observed has no stability (and is not rising).
  t.Resize(3);
  EXPECT_FLOAT_EQ(t.Stability(2, 20), 0.0f);
  EXPECT_FALSE(t.Rising(2, 20));
}

TEST(StabilityTest, RisingMeansNewerHalfBeatsOlderHalf) {
  StabilityTracker t;
  t.Resize(2);
  for (int64_t step = 1; step <= 20; ++step) {
    ASSERT_OK(t.BeginStep(step));
    t.Observe(0, true);        // steady
    t.Observe(1, step >= 18);  // new in the last three steps
  }
  EXPECT_FALSE(t.Rising(0, 20));
  EXPECT_TRUE(t.Rising(1, 20));
  ASSERT_OK(t.BeginStep(21));
  t.Observe(1, false);
  EXPECT_FALSE(t.Rising(1, 20));  // not relevant now
}

TEST(StabilityTest, HeldAreStableChosenPagesNotObserved) {
  StabilityTracker t;
  t.Resize(4);
  for (int64_t step = 1; step <= 10; ++step) {
    ASSERT_OK(t.BeginStep(step));
    t.Observe(0, true);
    t.Observe(1, true);
    t.Observe(2, step == 1);
    t.Observe(3, true);
  }
  t.SetChosen({0, 1, 2});
  ASSERT_OK(t.BeginStep(11));
  t.Observe(1, true);
  std::vector<int64_t> held;
  t.CollectHeld(0.4f, 20, &held);
  // 1 was observed, 2 is not stable, 3 was not chosen.
  EXPECT_EQ(held, std::vector<int64_t>{0});
  ASSERT_OK(t.BeginStep(100));
  held.clear();
  t.CollectHeld(0.1f, 20, &held);
  EXPECT_TRUE(held.empty());  // its history aged out
}

TEST(StabilityTest, StepsNeverGoBack) {
  StabilityTracker t;
  t.Resize(1);
  ASSERT_OK(t.BeginStep(5));
  ASSERT_OK(t.BeginStep(5));
  absl::Status s = t.BeginStep(4);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(s.message().find("step (4)"), std::string::npos);
}

TEST(StabilityTest, OptionsAreValidated) {
  StabilityOptions o;
  EXPECT_OK(ValidateStabilityOptions(o));
  o.window_steps = 65;
  EXPECT_NE(ValidateStabilityOptions(o).message().find("window_steps"), std::string::npos);
  o = StabilityOptions();
  o.weight = 1.5f;
  EXPECT_NE(ValidateStabilityOptions(o).message().find("stability.weight"), std::string::npos);
}

}  // namespace
}  // namespace kvtier::index
