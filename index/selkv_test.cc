// SelKV compaction (index/selkv.h): kept sets, routing, merged values and
// biases against hand computations on tiny heads and a plain reference
// implementation on random ones; input validation; attention-level
// properties (rho = 1 is exact, exact duplicates merged with their bias
// reproduce full attention, merging beats eviction on near-duplicates).
#include "index/selkv.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testutil/status_matchers.h"

using ::kvtier::testing::StatusIs;

namespace kvtier::index {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr float kTol = 1e-5f;

HeadKv Head(int32_t T, int32_t D, const std::vector<float>& keys,
            const std::vector<float>& values) {
  HeadKv h;
  h.num_tokens = T;
  h.head_dim = D;
  h.keys = keys;
  h.values = values;
  return h;
}

CompactOptions Options(float rho, Importance importance, Merge merge, Bias bias) {
  CompactOptions o;
  o.rho = rho;
  o.importance = importance;
  o.merge = merge;
  o.bias = bias;
  return o;
}

CompactedHead MustCompact(const HeadKv& head, const CompactOptions& options) {
  absl::StatusOr<CompactedHead> c = CompactHead(head, options);
  EXPECT_OK(c) << c.status();
  return c.ok() ? *std::move(c) : CompactedHead{};
}

// softmax_i(q . k_i / sqrt(D)) over the first n tokens, in double.
std::vector<double> Softmax(const float* q, const std::vector<float>& keys, int32_t n, int32_t D) {
  std::vector<double> p(n);
  double max_logit = -std::numeric_limits<double>::infinity();
  for (int32_t i = 0; i < n; ++i) {
    double s = 0;
    for (int32_t d = 0; d < D; ++d) s += double{q[d]} * keys[i * D + d];
    p[i] = s / std::sqrt(double{1.0 * D});
    max_logit = std::max(max_logit, p[i]);
  }
  double z = 0;
  for (double& x : p) z += (x = std::exp(x - max_logit));
  for (double& x : p) x /= z;
  return p;
}

// Attention output of q over (keys, values, bias) rows, in double.
std::vector<double> Attend(const float* q, const std::vector<float>& keys,
                           const std::vector<float>& values, const std::vector<float>& bias,
                           int32_t D) {
  const int32_t n = static_cast<int32_t>(keys.size() / D);
  std::vector<double> logit(n);
  double max_logit = -std::numeric_limits<double>::infinity();
  for (int32_t i = 0; i < n; ++i) {
    double s = 0;
    for (int32_t d = 0; d < D; ++d) s += double{q[d]} * keys[i * D + d];
    logit[i] = s / std::sqrt(double{1.0 * D}) + (bias.empty() ? 0.0 : bias[i]);
    max_logit = std::max(max_logit, logit[i]);
  }
  std::vector<double> o(D, 0.0);
  double z = 0;
  for (int32_t i = 0; i < n; ++i) {
    const double p = std::exp(logit[i] - max_logit);
    z += p;
    for (int32_t d = 0; d < D; ++d) o[d] += p * values[i * D + d];
  }
  for (double& x : o) x /= z;
  return o;
}

double RelativeError(const std::vector<double>& o, const std::vector<double>& ref) {
  double e = 0, r = 0;
  for (size_t d = 0; d < o.size(); ++d) {
    e += (o[d] - ref[d]) * (o[d] - ref[d]);
    r += ref[d] * ref[d];
  }
  return std::sqrt(e / r);
}

std::vector<float> Random(size_t n, std::mt19937* rng, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(*rng);
  return v;
}

// ---------------------------------------------------------------------------
// A hand-computed head: T = 4, D = 2, rho = 0.5 (K = 2).
//   keys  k0 = (1, 0)  k1 = (0, 1)  k2 = (1, 0.2)  k3 = (0.2, 1)
//   The normalised keys' mean points along (1, 1): cos = 0.7071 for k0 and
//   k1, 0.8321 for k2 and k3, so KeyDiff keeps {0, 1}. k2 routes to k0
//   (cos 0.981 vs 0.196), k3 to k1.
//   values v0 = (1, 0)  v1 = (0, 2)  v2 = (1, 1)  v3 = (1, -1)
//   g2 = cos(v2, v0) = 1/sqrt(2); g3 = max(cos(v3, v1), 0) = max(-0.707, 0) = 0.
class SelKvHandComputedTest : public ::testing::Test {
 protected:
  const std::vector<float> keys_ = {1, 0, 0, 1, 1, 0.2f, 0.2f, 1};
  const std::vector<float> values_ = {1, 0, 0, 2, 1, 1, 1, -1};
  const double g2_ = 1.0 / std::sqrt(2.0);
  HeadKv head_ = Head(4, 2, keys_, values_);
};

TEST_F(SelKvHandComputedTest, GatedMergeWithoutQueries) {
  const CompactedHead c =
      MustCompact(head_, Options(0.5f, Importance::kKeyDiff, Merge::kGated, Bias::kAttentionRatio));
  EXPECT_THAT(c.positions, ElementsAre(0, 1));
  EXPECT_THAT(c.keys, ElementsAre(1, 0, 0, 1));
  EXPECT_THAT(c.merged, ElementsAre(1, 1));
  // Slot 0: (v0 + g2 v2) / (1 + g2) = (1, g2 / (1 + g2)); bias log(1 + g2).
  EXPECT_NEAR(c.values[0], 1.0, kTol);
  EXPECT_NEAR(c.values[1], g2_ / (1 + g2_), kTol);  // 0.41421
  EXPECT_NEAR(c.bias[0], std::log(1 + g2_), kTol);  // 0.53480
  // Slot 1: g3 = 0, v1 unchanged, bias log(1 + 0) = 0.
  EXPECT_NEAR(c.values[2], 0.0, kTol);
  EXPECT_NEAR(c.values[3], 2.0, kTol);
  EXPECT_NEAR(c.bias[1], 0.0, kTol);
}

TEST_F(SelKvHandComputedTest, UniformMergeWithoutQueries) {
  const CompactedHead c = MustCompact(
      head_, Options(0.5f, Importance::kKeyDiff, Merge::kUniform, Bias::kAttentionRatio));
  EXPECT_THAT(c.positions, ElementsAre(0, 1));
  // (v0 + v2) / 2 = (1, 0.5); (v1 + v3) / 2 = (0.5, 0.5); both bias log 2.
  EXPECT_NEAR(c.values[0], 1.0, kTol);
  EXPECT_NEAR(c.values[1], 0.5, kTol);
  EXPECT_NEAR(c.values[2], 0.5, kTol);
  EXPECT_NEAR(c.values[3], 0.5, kTol);
  EXPECT_NEAR(c.bias[0], std::log(2.0), kTol);
  EXPECT_NEAR(c.bias[1], std::log(2.0), kTol);
}

TEST_F(SelKvHandComputedTest, MergeNoneIsPlainEviction) {
  const CompactedHead c =
      MustCompact(head_, Options(0.5f, Importance::kKeyDiff, Merge::kNone, Bias::kAttentionRatio));
  EXPECT_THAT(c.positions, ElementsAre(0, 1));
  EXPECT_THAT(c.values, ElementsAre(1, 0, 0, 2));
  EXPECT_THAT(c.bias, ElementsAre(0, 0));
  EXPECT_THAT(c.merged, ElementsAre(0, 0));
}

TEST_F(SelKvHandComputedTest, BiasNoneKeepsTheMergedValues) {
  const CompactedHead c =
      MustCompact(head_, Options(0.5f, Importance::kKeyDiff, Merge::kGated, Bias::kNone));
  EXPECT_NEAR(c.values[1], g2_ / (1 + g2_), kTol);
  EXPECT_THAT(c.bias, ElementsAre(0, 0));
  EXPECT_THAT(c.merged, ElementsAre(1, 1));
}

TEST_F(SelKvHandComputedTest, GatedMergeWithQueriesIsAttentionWeighted) {
  // One query q = (2, -1): logits (q . k) / sqrt(2) = 1.414, -0.707, 1.273,
  // -0.424, so a2 < a0 and the ratio stays under the cap log(1 + g2).
  const std::vector<float> q = {2, -1};
  head_.queries = q;
  const std::vector<double> a = Softmax(q.data(), keys_, 4, 2);
  ASSERT_LT(a[2], a[0]);
  const CompactedHead c =
      MustCompact(head_, Options(0.5f, Importance::kKeyDiff, Merge::kGated, Bias::kAttentionRatio));
  EXPECT_THAT(c.positions, ElementsAre(0, 1));
  const double w = a[0] + g2_ * a[2];
  EXPECT_NEAR(c.values[0], (a[0] * 1 + g2_ * a[2] * 1) / w, kTol);
  EXPECT_NEAR(c.values[1], (a[0] * 0 + g2_ * a[2] * 1) / w, kTol);
  EXPECT_NEAR(c.bias[0], std::log(w / a[0]), kTol);
  EXPECT_NEAR(c.values[2], 0.0, kTol);  // g3 = 0
  EXPECT_NEAR(c.values[3], 2.0, kTol);
  EXPECT_NEAR(c.bias[1], 0.0, kTol);

  // Uniform: slot 1 is (a1 v1 + a3 v3) / (a1 + a3). q attends k3 (logit
  // -0.424) more than the kept k1 (-0.707), so the ratio (a1 + a3) / a1
  // exceeds 2 and the bias is capped at log(1 + 1).
  const CompactedHead u = MustCompact(
      head_, Options(0.5f, Importance::kKeyDiff, Merge::kUniform, Bias::kAttentionRatio));
  ASSERT_GT(a[3], a[1]);
  EXPECT_NEAR(u.values[2], (a[1] * 0 + a[3] * 1) / (a[1] + a[3]), kTol);
  EXPECT_NEAR(u.values[3], (a[1] * 2 + a[3] * -1) / (a[1] + a[3]), kTol);
  EXPECT_NEAR(u.bias[1], std::log(2.0), kTol);
  // Slot 0 is under the cap (a2 < a0): the plain ratio.
  EXPECT_NEAR(u.values[1], a[2] / (a[0] + a[2]), kTol);
  EXPECT_NEAR(u.bias[0], std::log((a[0] + a[2]) / a[0]), kTol);
}

TEST_F(SelKvHandComputedTest, AttentionRatioIsCappedAtTheMergedCount) {
  // q = (1, 2) attends k2 (logit 0.990) more than the kept k0 (0.707): the
  // ratio (a0 + g2 a2) / a0 exceeds 1 + g2, so the bias is log(1 + g2); the
  // value is still the attention-weighted mean.
  const std::vector<float> q = {1, 2};
  head_.queries = q;
  const std::vector<double> a = Softmax(q.data(), keys_, 4, 2);
  ASSERT_GT(a[2], a[0]);
  const CompactedHead c =
      MustCompact(head_, Options(0.5f, Importance::kKeyDiff, Merge::kGated, Bias::kAttentionRatio));
  EXPECT_THAT(c.positions, ElementsAre(0, 1));
  EXPECT_NEAR(c.bias[0], std::log(1 + g2_), kTol);
  EXPECT_NEAR(c.values[1], g2_ * a[2] / (a[0] + g2_ * a[2]), kTol);
}

TEST_F(SelKvHandComputedTest, ObservationAttentionIsTheMeanOverRows) {
  // Two rows; the second at position 1 sees tokens 0 and 1 only (token 2
  // gets 0 from it), so a_i = (p_0(i) + p_1(i)) / 2.
  const std::vector<float> q = {2, -1, 1, 0.5f};
  const std::vector<int32_t> pos = {3, 1};
  head_.queries = q;
  head_.query_positions = pos;
  const std::vector<double> p0 = Softmax(&q[0], keys_, 4, 2);
  const std::vector<double> p1 = Softmax(&q[2], keys_, 2, 2);
  const double a0 = (p0[0] + p1[0]) / 2, a2 = p0[2] / 2;
  ASSERT_LT(a2, a0);
  const CompactedHead c =
      MustCompact(head_, Options(0.5f, Importance::kKeyDiff, Merge::kGated, Bias::kAttentionRatio));
  EXPECT_NEAR(c.values[1], g2_ * a2 / (a0 + g2_ * a2), kTol);
  EXPECT_NEAR(c.bias[0], std::log((a0 + g2_ * a2) / a0), kTol);
}

// ---------------------------------------------------------------------------
// Importance.

TEST(SelKvImportanceTest, KeyDiffKeepsTheDistinctKey) {
  // Four keys near (1, 0, 0) and one along (0, 0, 1): K = 1 keeps token 3.
  const std::vector<float> keys = {1, 0.1f, 0, 1, -0.1f, 0, 0.9f, 0, 0.1f, 0.1f, 0, 1, 1, 0, 0};
  const std::vector<float> values(15, 1.0f);
  const CompactedHead c = MustCompact(
      Head(5, 3, keys, values), Options(0.2f, Importance::kKeyDiff, Merge::kNone, Bias::kNone));
  EXPECT_THAT(c.positions, ElementsAre(3));
  // K = 2 adds the next most distinct: tokens 0 and 1 (mirror images in y,
  // cos 0.960 with the mean; token 4: 0.965, token 2: 0.988) tie and the
  // lower index wins.
  const CompactedHead c2 = MustCompact(
      Head(5, 3, keys, values), Options(0.4f, Importance::kKeyDiff, Merge::kNone, Bias::kNone));
  EXPECT_THAT(c2.positions, ElementsAre(0, 3));
}

TEST(SelKvImportanceTest, SnapKVKeepsWhatTheQueriesAttend) {
  // Orthogonal keys; the queries point at tokens 4 and 1.
  std::vector<float> keys(6 * 6, 0.0f);
  for (int i = 0; i < 6; ++i) keys[i * 6 + i] = 1.0f;
  const std::vector<float> values(36, 1.0f);
  const std::vector<float> q = {0, 0, 0, 0, 8, 0,   // token 4
                                0, 0, 0, 0, 6, 0,   // token 4
                                0, 5, 0, 0, 0, 0};  // token 1
  HeadKv head = Head(6, 6, keys, values);
  head.queries = q;
  EXPECT_THAT(MustCompact(head, Options(1.0f / 6, Importance::kSnapKV, Merge::kNone, Bias::kNone))
                  .positions,
              ElementsAre(4));
  EXPECT_THAT(MustCompact(head, Options(2.0f / 6, Importance::kSnapKV, Merge::kNone, Bias::kNone))
                  .positions,
              ElementsAre(1, 4));
  // KeyDiff ignores the queries: all keys are equally distinct, ties keep
  // the lowest indices.
  EXPECT_THAT(MustCompact(head, Options(2.0f / 6, Importance::kKeyDiff, Merge::kNone, Bias::kNone))
                  .positions,
              ElementsAre(0, 1));
}

TEST(SelKvImportanceTest, H2ORespectsCausality) {
  // keys k0 = (1, 0), k1 = (0, 1), k2 = (0, -1), k3 = (-1, 0); every query
  // is (-5, 0), pointing at token 3.
  const std::vector<float> keys = {1, 0, 0, 1, 0, -1, -1, 0};
  const std::vector<float> values(8, 1.0f);
  const std::vector<float> q = {-5, 0, -5, 0, -5, 0};
  HeadKv head = Head(4, 2, keys, values);
  head.queries = q;
  const CompactOptions o = Options(0.25f, Importance::kH2O, Merge::kNone, Bias::kNone);
  // Without positions every query sees token 3 and puts ~0.94 on it.
  EXPECT_THAT(MustCompact(head, o).positions, ElementsAre(3));
  // At positions 0, 1, 2 nobody sees token 3. Sums by hand: row 0 sees only
  // token 0 (1.0); row 1 sees {0, 1}: p1 = 1 / (1 + e^-3.54) = 0.97; row 2
  // sees {0, 1, 2}: 0.49 each for 1 and 2. Token 1: 1.46 > token 0: 1.04.
  const std::vector<int32_t> pos = {0, 1, 2};
  head.query_positions = pos;
  EXPECT_THAT(MustCompact(head, o).positions, ElementsAre(1));
  EXPECT_THAT(
      MustCompact(head, Options(0.5f, Importance::kH2O, Merge::kNone, Bias::kNone)).positions,
      ElementsAre(0, 1));
}

// ---------------------------------------------------------------------------
// Routing.

TEST(SelKvRoutingTest, TiesGoToTheLowerIndexAndZeroKeysToTheFirstSlot) {
  // Tokens 0-2 share one key (KeyDiff ties: {0, 1} kept at K = 2); token 2
  // routes to slot 0 (cos 1 with both).
  const std::vector<float> keys = {0, 1, 0, 1, 0, 1};
  const std::vector<float> values = {1, 0, 0, 1, 1, 0};
  CompactedHead c = MustCompact(Head(3, 2, keys, values),
                                Options(0.6f, Importance::kKeyDiff, Merge::kUniform, Bias::kNone));
  EXPECT_THAT(c.positions, ElementsAre(0, 1));
  EXPECT_THAT(c.merged, ElementsAre(1, 0));

  // A zero key (token 3) gets logit 0 from q = (5, 5), the least attention,
  // and has cosine 0 with every kept key: it goes to slot 0.
  const std::vector<float> keys2 = {1, 0, 0, 1, 1, 1, 0, 0};
  const std::vector<float> values2 = {1, 1, 1, 1, 1, 1, 1, 1};
  const std::vector<float> q = {5, 5};
  HeadKv h = Head(4, 2, keys2, values2);
  h.queries = q;
  c = MustCompact(h, Options(0.75f, Importance::kSnapKV, Merge::kGated, Bias::kNone));
  EXPECT_THAT(c.positions, ElementsAre(0, 1, 2));
  EXPECT_THAT(c.merged, ElementsAre(1, 0, 0));
}

// A plain implementation of the contract, in double, for random heads.
CompactedHead Reference(const HeadKv& h, const CompactOptions& o) {
  const int32_t T = h.num_tokens, D = h.head_dim, K = KeptSlots(T, o.rho);
  const int32_t W = static_cast<int32_t>(h.queries.size() / D);
  auto cos = [&](const float* a, const float* b) {
    double ab = 0, aa = 0, bb = 0;
    for (int32_t d = 0; d < D; ++d) {
      ab += double{a[d]} * b[d];
      aa += double{a[d]} * a[d];
      bb += double{b[d]} * b[d];
    }
    return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0.0;
  };
  std::vector<float> keys(h.keys.begin(), h.keys.end());
  std::vector<double> a(T, 0.0);
  for (int32_t w = 0; w < W; ++w) {
    const int32_t n = h.query_positions.empty() ? T : std::min(T, h.query_positions[w] + 1);
    const std::vector<double> p = Softmax(&h.queries[w * D], keys, n, D);
    for (int32_t i = 0; i < n; ++i) a[i] += p[i] / W;
  }
  std::vector<double> score(T);
  std::vector<double> mean(D, 0.0);
  for (int32_t i = 0; i < T; ++i) {
    double n = 0;
    for (int32_t d = 0; d < D; ++d) n += double{keys[i * D + d]} * keys[i * D + d];
    for (int32_t d = 0; d < D; ++d) mean[d] += keys[i * D + d] / std::sqrt(n);
  }
  std::vector<float> meanf(mean.begin(), mean.end());
  for (int32_t i = 0; i < T; ++i) {
    score[i] = o.importance == Importance::kKeyDiff ? -cos(&keys[i * D], meanf.data()) : a[i];
  }
  std::vector<int32_t> order(T);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t x, int32_t y) { return score[x] > score[y]; });
  std::vector<int32_t> kept(order.begin(), order.begin() + K);
  std::sort(kept.begin(), kept.end());
  CompactedHead out;
  out.positions = kept;
  for (int32_t s = 0; s < K; ++s) {
    const float* vt = &h.values[kept[s] * D];
    out.keys.insert(out.keys.end(), &h.keys[kept[s] * D], &h.keys[kept[s] * D] + D);
    const double wt = W > 0 ? std::max(a[kept[s]], 1e-12) : 1.0;
    std::vector<double> acc(D);
    for (int32_t d = 0; d < D; ++d) acc[d] = wt * vt[d];
    double wsum = 0, gsum = 0;
    int32_t merged = 0;
    for (int32_t e = 0; e < T && o.merge != Merge::kNone; ++e) {
      if (std::binary_search(kept.begin(), kept.end(), e)) continue;
      int32_t best = 0;
      for (int32_t t = 1; t < K; ++t) {
        if (cos(&keys[e * D], &keys[kept[t] * D]) > cos(&keys[e * D], &keys[kept[best] * D])) {
          best = t;
        }
      }
      if (best != s) continue;
      ++merged;
      const double g = o.merge == Merge::kUniform ? 1.0 : std::max(cos(&h.values[e * D], vt), 0.0);
      const double w = g * (W > 0 ? a[e] : 1.0);
      gsum += g;
      wsum += w;
      for (int32_t d = 0; d < D; ++d) acc[d] += w * h.values[e * D + d];
    }
    for (int32_t d = 0; d < D; ++d) out.values.push_back(static_cast<float>(acc[d] / (wt + wsum)));
    out.merged.push_back(merged);
    out.bias.push_back(o.bias == Bias::kNone || wsum == 0
                           ? 0.0f
                           : static_cast<float>(std::min(std::log1p(wsum / wt), std::log1p(gsum))));
  }
  return out;
}

TEST(SelKvReferenceTest, RandomHeadsMatchAPlainImplementation) {
  std::mt19937 rng(11);
  int checked = 0;
  for (int32_t T : {1, 5, 23, 40}) {
    for (float rho : {0.05f, 0.3f, 0.5f, 0.9f}) {
      for (Importance imp : {Importance::kKeyDiff, Importance::kSnapKV, Importance::kH2O}) {
        for (Merge merge : {Merge::kGated, Merge::kUniform, Merge::kNone}) {
          for (bool positions : {false, true}) {
            const int32_t D = 8, W = 5;
            const std::vector<float> keys = Random(T * D, &rng);
            const std::vector<float> values = Random(T * D, &rng);
            const std::vector<float> q = Random(W * D, &rng, 2.0f);
            std::vector<int32_t> pos(W);
            for (int32_t w = 0; w < W; ++w) pos[w] = std::max(0, T - 1 - 3 * w);
            HeadKv h = Head(T, D, keys, values);
            h.queries = q;
            if (positions) h.query_positions = pos;
            const CompactOptions o = Options(rho, imp, merge, Bias::kAttentionRatio);
            const CompactedHead got = MustCompact(h, o);
            const CompactedHead want = Reference(h, o);
            ASSERT_EQ(got.positions, want.positions) << T << " " << rho;
            ASSERT_EQ(got.merged, want.merged) << T << " " << rho;
            ASSERT_EQ(got.keys, want.keys);
            ASSERT_EQ(got.values.size(), want.values.size());
            for (size_t i = 0; i < got.values.size(); ++i) {
              ASSERT_NEAR(got.values[i], want.values[i], 1e-4) << i;
            }
            for (size_t i = 0; i < got.bias.size(); ++i) {
              ASSERT_NEAR(got.bias[i], want.bias[i], 1e-5) << i;
            }
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 4 * 4 * 3 * 3 * 2);
}

TEST(SelKvReferenceTest, KeysOnlyMatchesAPlainImplementation) {
  std::mt19937 rng(12);
  for (int32_t T : {9, 17, 33}) {  // K not a multiple of the 8-key tile
    const int32_t D = 5;
    const std::vector<float> keys = Random(T * D, &rng);
    const std::vector<float> values = Random(T * D, &rng);
    for (Merge merge : {Merge::kGated, Merge::kUniform}) {
      const CompactOptions o = Options(0.4f, Importance::kKeyDiff, merge, Bias::kAttentionRatio);
      const HeadKv h = Head(T, D, keys, values);
      const CompactedHead got = MustCompact(h, o);
      const CompactedHead want = Reference(h, o);
      ASSERT_EQ(got.positions, want.positions);
      ASSERT_EQ(got.merged, want.merged);
      for (size_t i = 0; i < got.values.size(); ++i)
        ASSERT_NEAR(got.values[i], want.values[i], 1e-4);
      for (size_t i = 0; i < got.bias.size(); ++i) ASSERT_NEAR(got.bias[i], want.bias[i], 1e-5);
    }
  }
}

// ---------------------------------------------------------------------------
// Retention and validation.

TEST(SelKvKeptSlotsTest, CeilOfRhoTimesTokens) {
  EXPECT_EQ(KeptSlots(768, 0.25f), 192);
  EXPECT_EQ(KeptSlots(768, 0.5f), 384);
  EXPECT_EQ(KeptSlots(1000, 0.1f), 100);  // 0.1f * 1000 = 100.0000015
  EXPECT_EQ(KeptSlots(1000, 0.3f), 300);
  EXPECT_EQ(KeptSlots(1001, 0.1f), 101);
  EXPECT_EQ(KeptSlots(3, 0.5f), 2);
  EXPECT_EQ(KeptSlots(10, 0.01f), 1);
  EXPECT_EQ(KeptSlots(7, 1.0f), 7);
  EXPECT_EQ(KeptSlots(65536, 0.25f), 16384);
  EXPECT_EQ(KeptSlots(0, 0.5f), 0);
  EXPECT_EQ(KeptSlots(10, 0.0f), 1);
  EXPECT_EQ(KeptSlots(10, std::nanf("")), 1);
  EXPECT_EQ(KeptSlots(10, 2.0f), 10);
}

TEST(SelKvValidationTest, EveryInvalidArgumentNamesTheField) {
  const std::vector<float> keys = {1, 0, 0, 1, 1, 1};
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  auto expect = [&](const HeadKv& h, const CompactOptions& o, const char* field) {
    absl::StatusOr<CompactedHead> c = CompactHead(h, o);
    ASSERT_FALSE(c.ok()) << field;
    EXPECT_THAT(c.status(), StatusIs(absl::StatusCode::kInvalidArgument)) << field;
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(field));
  };
  const HeadKv ok = Head(3, 2, keys, values);
  const CompactOptions base =
      Options(0.5f, Importance::kKeyDiff, Merge::kGated, Bias::kAttentionRatio);
  for (float rho : {0.0f, -0.25f, 1.5f, nan, inf}) {
    CompactOptions o = base;
    o.rho = rho;
    expect(ok, o, "rho");
  }
  CompactOptions o = base;
  o.importance = static_cast<Importance>(7);
  expect(ok, o, "importance");
  o = base;
  o.merge = static_cast<Merge>(3);
  expect(ok, o, "merge");
  o = base;
  o.bias = static_cast<Bias>(2);
  expect(ok, o, "bias");

  expect(Head(0, 2, {}, {}), base, "num_tokens");
  expect(Head(3, 0, keys, values), base, "head_dim");
  expect(Head(3, 2, {1, 0, 0, 1}, values), base, "keys");
  expect(Head(3, 2, keys, {1, 2, 3}), base, "values");
  const std::vector<float> nan_key = {1, 0, nan, 1, 1, 1};
  expect(Head(3, 2, nan_key, values), base, "keys");
  const std::vector<float> inf_value = {1, 2, 3, inf, 5, 6};
  expect(Head(3, 2, keys, inf_value), base, "values");

  HeadKv h = ok;
  const std::vector<float> q3 = {1, 2, 3};
  h.queries = q3;
  expect(h, base, "queries");
  const std::vector<float> nan_q = {1, nan};
  h.queries = nan_q;
  expect(h, base, "queries");
  const std::vector<float> q2 = {1, 2, 3, 4};
  h.queries = q2;
  const std::vector<int32_t> pos1 = {1};
  h.query_positions = pos1;
  expect(h, base, "query_positions");
  const std::vector<int32_t> neg = {1, -1};
  h.query_positions = neg;
  expect(h, base, "query_positions");

  for (Importance imp : {Importance::kSnapKV, Importance::kH2O}) {
    o = base;
    o.importance = imp;
    expect(ok, o, "queries");
    o.rho = 1.0f;  // validated even when nothing is compacted
    expect(ok, o, "queries");
  }
}

TEST(SelKvValidationTest, FullRetentionReturnsTheInputUnchanged) {
  std::mt19937 rng(3);
  const std::vector<float> keys = Random(7 * 4, &rng);
  const std::vector<float> values = Random(7 * 4, &rng);
  const std::vector<float> q = Random(2 * 4, &rng);
  HeadKv h = Head(7, 4, keys, values);
  h.queries = q;
  for (Importance imp : {Importance::kKeyDiff, Importance::kSnapKV, Importance::kH2O}) {
    const CompactedHead c =
        MustCompact(h, Options(1.0f, imp, Merge::kUniform, Bias::kAttentionRatio));
    EXPECT_THAT(c.positions, ElementsAre(0, 1, 2, 3, 4, 5, 6));
    EXPECT_EQ(c.keys, keys);
    EXPECT_EQ(c.values, values);
    EXPECT_THAT(c.bias, ::testing::Each(0.0f));
    EXPECT_THAT(c.merged, ::testing::Each(0));
  }
}

// ---------------------------------------------------------------------------
// Attention-level properties.

TEST(SelKvPropertyTest, FullRetentionGivesFullAttention) {
  std::mt19937 rng(5);
  const int32_t T = 50, D = 16;
  const std::vector<float> keys = Random(T * D, &rng);
  const std::vector<float> values = Random(T * D, &rng);
  const CompactedHead c =
      MustCompact(Head(T, D, keys, values),
                  Options(1.0f, Importance::kKeyDiff, Merge::kGated, Bias::kAttentionRatio));
  for (int i = 0; i < 20; ++i) {
    const std::vector<float> q = Random(D, &rng, 2.0f);
    EXPECT_LT(RelativeError(Attend(q.data(), c.keys, c.values, c.bias, D),
                            Attend(q.data(), keys, values, {}, D)),
              1e-12);
  }
}

// Sum of the first `n` keys scaled to unit length: the direction the
// least distinct key (KeyDiff's last choice) points along.
std::vector<float> SumOfUnitKeys(const std::vector<float>& keys, int32_t n, int32_t dim) {
  std::vector<float> sum(dim, 0.0f);
  for (int32_t i = 0; i < n; ++i) {
    double norm = 0;
    for (int32_t d = 0; d < dim; ++d) norm += keys[i * dim + d] * keys[i * dim + d];
    for (int32_t d = 0; d < dim; ++d) sum[d] += keys[i * dim + d] / std::sqrt(norm);
  }
  return sum;
}

// Token `dup` is the key closest to the keys' mean direction; tokens T and
// T + 1 are exact copies of it. They tie as the least distinct (KeyDiff) or,
// with queries pointing away from it, the least attended, so K = T keeps
// token `dup` and evicts both copies into it: g = 1, bias log 3, value
// unchanged. Full attention over T + 2 tokens is then reproduced for any
// query.
TEST(SelKvPropertyTest, ExactDuplicatesMergedWithBiasReproduceFullAttention) {
  std::mt19937 rng(7);
  const int32_t T = 24, D = 16;
  std::vector<float> keys = Random(T * D, &rng);
  std::vector<float> values = Random(T * D, &rng);
  // Token 5: along the mean of the normalised keys (the least distinct).
  const std::vector<float> mean = SumOfUnitKeys(keys, T, D);
  const int32_t dup = 5;
  for (int32_t d = 0; d < D; ++d) keys[dup * D + d] = mean[d];
  for (int c = 0; c < 2; ++c) {
    keys.insert(keys.end(), keys.begin() + dup * D, keys.begin() + (dup + 1) * D);
    values.insert(values.end(), values.begin() + dup * D, values.begin() + (dup + 1) * D);
  }
  const int32_t n = T + 2;
  const float rho = static_cast<float>(T) / n;
  ASSERT_EQ(KeptSlots(n, rho), T);

  // Observation queries pointing away from token 5's key.
  std::vector<float> q_obs;
  for (int w = 0; w < 4; ++w) {
    std::vector<float> q = Random(D, &rng, 0.5f);
    for (int32_t d = 0; d < D; ++d) q[d] -= 2.0f * mean[d];
    q_obs.insert(q_obs.end(), q.begin(), q.end());
  }
  for (bool with_queries : {false, true}) {
    HeadKv h = Head(n, D, keys, values);
    if (with_queries) h.queries = q_obs;
    const CompactOptions merge_opts =
        Options(rho, with_queries ? Importance::kSnapKV : Importance::kKeyDiff, Merge::kGated,
                Bias::kAttentionRatio);
    CompactOptions evict_opts = merge_opts;
    evict_opts.merge = Merge::kNone;
    evict_opts.bias = Bias::kNone;
    const CompactedHead merged = MustCompact(h, merge_opts);
    const CompactedHead evicted = MustCompact(h, evict_opts);
    std::vector<int32_t> first_t(T);
    std::iota(first_t.begin(), first_t.end(), 0);
    ASSERT_EQ(merged.positions, first_t) << with_queries;
    ASSERT_EQ(evicted.positions, first_t) << with_queries;
    EXPECT_EQ(merged.merged[dup], 2);
    EXPECT_NEAR(merged.bias[dup], std::log(3.0), 1e-6);
    for (int32_t s = 0; s < T; ++s) {
      if (s != dup) {
        EXPECT_EQ(merged.bias[s], 0.0f) << s;
      }
    }
    double worst_evict = 0;
    for (int i = 0; i < 50; ++i) {
      std::vector<float> q = Random(D, &rng, 1.5f);
      if (i % 5 == 0) {  // queries that do attend the duplicated token
        for (int32_t d = 0; d < D; ++d) q[d] = 3.0f * keys[dup * D + d];
      }
      const std::vector<double> full = Attend(q.data(), keys, values, {}, D);
      EXPECT_LT(RelativeError(Attend(q.data(), merged.keys, merged.values, merged.bias, D), full),
                1e-6)
          << "query " << i << (with_queries ? " with" : " without") << " queries";
      worst_evict = std::max(
          worst_evict,
          RelativeError(Attend(q.data(), evicted.keys, evicted.values, evicted.bias, D), full));
    }
    EXPECT_GT(worst_evict, 1e-2);  // eviction does lose the copies' mass
  }
}

// Near-duplicates: as above, but the copies' values carry noise (keys
// exact, so the kept set and routing are the same; the gate is ~0.99, not
// 1). Gated merge with bias is no longer exact, but its error stays finite
// and well below plain eviction's.
TEST(SelKvPropertyTest, GatedMergeBeatsEvictionOnNearDuplicates) {
  std::mt19937 rng(9);
  const int32_t T = 24, D = 16, copies = 3, dup = 7;
  std::vector<float> keys = Random(T * D, &rng);
  std::vector<float> values = Random(T * D, &rng);
  const std::vector<float> mean = SumOfUnitKeys(keys, T, D);
  for (int32_t d = 0; d < D; ++d) keys[dup * D + d] = mean[d] / 4;
  std::normal_distribution<float> noise(0.0f, 0.1f);
  for (int c = 0; c < copies; ++c) {
    for (int32_t d = 0; d < D; ++d) keys.push_back(keys[dup * D + d]);
    for (int32_t d = 0; d < D; ++d) values.push_back(values[dup * D + d] + noise(rng));
  }
  const int32_t n = T + copies;
  const HeadKv h = Head(n, D, keys, values);
  const float rho = static_cast<float>(T) / n;
  const CompactedHead merged =
      MustCompact(h, Options(rho, Importance::kKeyDiff, Merge::kGated, Bias::kAttentionRatio));
  const CompactedHead evicted =
      MustCompact(h, Options(rho, Importance::kKeyDiff, Merge::kNone, Bias::kNone));
  std::vector<int32_t> first_t(T);
  std::iota(first_t.begin(), first_t.end(), 0);
  ASSERT_EQ(merged.positions, first_t);
  EXPECT_EQ(merged.merged[dup], copies);
  EXPECT_GT(merged.bias[dup], std::log(1.0 + 0.95 * copies));
  EXPECT_LT(merged.bias[dup], std::log(1.0 + copies));
  double err_merge = 0, err_evict = 0;
  for (int i = 0; i < 100; ++i) {
    const std::vector<float> q = Random(D, &rng, 1.0f);
    const std::vector<double> full = Attend(q.data(), keys, values, {}, D);
    const double em =
        RelativeError(Attend(q.data(), merged.keys, merged.values, merged.bias, D), full);
    ASSERT_TRUE(std::isfinite(em));
    err_merge += em;
    err_evict +=
        RelativeError(Attend(q.data(), evicted.keys, evicted.values, evicted.bias, D), full);
  }
  EXPECT_LT(err_merge, 0.25 * err_evict) << err_merge / 100 << " vs " << err_evict / 100;
}

TEST(SelKvScaleTest, EightThousandTokens) {
  std::mt19937 rng(13);
  const int32_t T = 8192, D = 64;
  const std::vector<float> keys = Random(static_cast<size_t>(T) * D, &rng);
  const std::vector<float> values = Random(static_cast<size_t>(T) * D, &rng);
  const CompactedHead c =
      MustCompact(Head(T, D, keys, values),
                  Options(0.125f, Importance::kKeyDiff, Merge::kGated, Bias::kAttentionRatio));
  ASSERT_EQ(c.positions.size(), 1024u);
  EXPECT_EQ(c.values.size(), 1024u * D);
  EXPECT_EQ(std::accumulate(c.merged.begin(), c.merged.end(), 0), T - 1024);
  EXPECT_TRUE(std::is_sorted(c.positions.begin(), c.positions.end()));
  for (float b : c.bias) ASSERT_TRUE(b >= 0.0f && std::isfinite(b));
}

}  // namespace
}  // namespace kvtier::index
