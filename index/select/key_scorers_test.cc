// Per-layer key-key and mass scoring: summaries with per-layer means and
// head keys, their codec, the KeyTable, the scorers against direct
// computations, calibration checks, and the Selector paths that use them.
#include "index/select/key_scorers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/context_index.h"
#include "index/kernels/simd.h"
#include "index/select/selector.h"
#include "index/summary/summary_codec.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/synthetic.h"

using ::kvtier::testing::StatusIs;

namespace kvtier::index {
namespace {

using ::kvtier::testing::MakeBlockPayload;
using ::kvtier::testing::SyntheticPayload;
using ::testing::HasSubstr;

constexpr int32_t kL = 3, kH = 2, kD = 16, kT = 4;

BlockLayout Layout() {
  BlockLayout l;
  l.num_layers = kL;
  l.num_kv_heads = kH;
  l.head_dim = kD;
  l.block_size_tokens = kT;
  l.dtype = Dtype::kFp16;
  return l;
}

const float* KeyOf(const SyntheticPayload& p, int32_t l, int32_t h, int32_t t) {
  return &p.keys[((static_cast<size_t>(l) * kH + h) * kT + t) * kD];
}

// A calibration with retrieval heads (layer 2, q heads 1 and 3) of 4 query
// heads per layer (2 per KV head): both use KV head 2 * kH + {0, 1}.
SelectionCalibration Calibration() {
  SelectionCalibration c;
  c.num_q_heads = 4;
  c.retrieval_heads = {{2, 1}, {2, 3}};
  c.head_weights = {0.5f, 1.0f};
  c.prior = {0.4f, 0.2f, 0.1f};
  c.prior_all = {0.6f, 0.3f, 0.15f};
  return c;
}

BlockSummary Summarise(const SyntheticPayload& p, bool keys = true) {
  SummaryOptions o;
  o.bounds = false;
  o.per_layer = true;
  if (keys) o.key_heads = KeyHeadsOf(Calibration(), kH);
  auto s = ComputeBlockSummary(Layout(), p.bytes, o, nullptr);
  EXPECT_OK(s) << s.status();
  return *s;
}

std::vector<SyntheticPayload> Payloads(int n) {
  std::vector<SyntheticPayload> out;
  for (int i = 0; i < n; ++i) out.push_back(MakeBlockPayload(Layout(), 100 + i, {}));
  return out;
}

TEST(SimdTest, Int8RowDotsAndExpSumsMatchScalarReferences) {
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int> q8(-127, 127);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (size_t dim : {1, 7, 16, 37, 128}) {
    const size_t rows = 9, stride = dim + 5;
    std::vector<int8_t> m(rows * stride);
    for (int8_t& x : m) x = static_cast<int8_t>(q8(rng));
    std::vector<float> q(dim), out(rows);
    for (float& x : q) x = n(rng);
    simd::DotRowsInt8(m.data(), rows, stride, dim, q.data(), out.data());
    for (size_t r = 0; r < rows; ++r) {
      double want = 0;
      for (size_t d = 0; d < dim; ++d) want += double{q[d]} * m[r * stride + d];
      EXPECT_NEAR(out[r], want, 1e-3 * (1 + std::fabs(want))) << dim << "," << r;
    }
  }
  for (size_t len : {1, 8, 13, 64}) {
    std::vector<float> x(len);
    for (float& v : x) v = n(rng) * 5;
    const float top = *std::max_element(x.begin(), x.end());
    for (float scale : {0.0f, 0.3f, 3.0f, 1e30f}) {
      double want = 0;
      for (float v : x) want += std::exp(std::max(-87.0, double{scale} * (v - top)));
      if (scale == 1e30f) want = std::count(x.begin(), x.end(), top);
      EXPECT_NEAR(simd::SumExpBelow(x.data(), len, scale, top), want, 1e-6 * want)
          << len << "," << scale;
    }
  }
}

TEST(CalibrationTest, KeyHeadsAndSlotsFollowGqaGroups) {
  const SelectionCalibration c = Calibration();
  EXPECT_EQ(KeyHeadsOf(c, kH), (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(KeyHeadSlots(c, kH), (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(KeyHeadsOf(SelectionCalibration(), kH).empty());
}

TEST(CalibrationTest, BadCalibrationsNameTheField) {
  auto message = [](SelectionCalibration c) {
    return std::string(ValidateCalibration(c, Layout()).message());
  };
  EXPECT_OK(ValidateCalibration(Calibration(), Layout()));
  EXPECT_OK(ValidateCalibration(SelectionCalibration(), Layout()));
  SelectionCalibration c = Calibration();
  c.num_q_heads = 3;
  EXPECT_THAT(message(c), HasSubstr("calibration.num_q_heads (3)"));
  c = Calibration();
  c.retrieval_heads.push_back({3, 0});
  c.head_weights.push_back(1);
  EXPECT_THAT(message(c), HasSubstr("calibration.retrieval_heads[2]"));
  c = Calibration();
  c.retrieval_heads[1] = c.retrieval_heads[0];
  EXPECT_THAT(message(c), HasSubstr("repeats retrieval_heads[0]"));
  c = Calibration();
  c.prior[1] = std::nanf("");
  EXPECT_THAT(message(c), HasSubstr("calibration.prior[1]"));
  c = Calibration();
  c.prior_all.pop_back();
  EXPECT_THAT(message(c), HasSubstr("same length"));
  c = Calibration();
  c.head_weights[0] = 0;
  EXPECT_THAT(message(c), HasSubstr("calibration.head_weights[0]"));
  SelectionCalibration empty;
  empty.prior = {1};
  EXPECT_THAT(message(empty), HasSubstr("uncalibrated"));
}

TEST(KeySummaryTest, HeadKeysAreTheKeysInInt8) {
  const SyntheticPayload p = MakeBlockPayload(Layout(), 7, {});
  const BlockSummary s = Summarise(p);
  ASSERT_EQ(s.key_heads, (std::vector<int32_t>{4, 5}));
  ASSERT_EQ(s.key_tokens, kT);
  ASSERT_EQ(s.head_keys.size(), 2u * kT * kD);
  for (int32_t j = 0; j < 2; ++j) {
    const int32_t lkv = s.key_heads[j];
    float max_abs = 0;
    for (int32_t t = 0; t < kT; ++t) {
      for (int32_t d = 0; d < kD; ++d) {
        max_abs = std::max(max_abs, std::fabs(KeyOf(p, lkv / kH, lkv % kH, t)[d]));
      }
    }
    EXPECT_FLOAT_EQ(s.key_scales[j], max_abs / 127.0f);
    for (int32_t t = 0; t < kT; ++t) {
      for (int32_t d = 0; d < kD; ++d) {
        const float want = KeyOf(p, lkv / kH, lkv % kH, t)[d];
        const float got = s.head_keys[(j * kT + t) * kD + d] * s.key_scales[j];
        EXPECT_NEAR(got, want, 0.5f * s.key_scales[j] + 1e-6f);
      }
    }
  }
  SummaryOptions bad;
  bad.key_heads = {5, 4};
  EXPECT_THAT(std::string(ComputeBlockSummary(Layout(), p.bytes, bad, nullptr).status().message()),
              HasSubstr("options.key_heads[1]"));
}

TEST(KeySummaryTest, CodecKeepsHeadKeysExactlyAndLayerMeansInInt8) {
  const BlockSummary s = Summarise(MakeBlockPayload(Layout(), 9, {}));
  SummaryCodecOptions o;
  o.encoding = SummaryEncoding::kFp16;
  o.layer_int8 = true;
  auto blob = EncodeSummary(s, o);
  ASSERT_OK(blob) << blob.status();
  EXPECT_EQ(static_cast<uint8_t>((*blob)[4]), 2);  // version 2 sections
  // header + mean fp16 + per-layer int8 (scales + values) + head keys.
  EXPECT_EQ(blob->size(), kSummaryHeaderBytes + kD * 2 + kL * (4 + kD) + 8 + 2 * 8 + 2 * kT * kD);
  auto back = DecodeSummary(*blob);
  ASSERT_OK(back) << back.status();
  EXPECT_EQ(back->head_keys, s.head_keys);
  EXPECT_EQ(back->key_scales, s.key_scales);
  EXPECT_EQ(back->key_heads, s.key_heads);
  ASSERT_EQ(back->layer_mean.size(), s.layer_mean.size());
  for (int32_t l = 0; l < kL; ++l) {
    float max_abs = 0;
    for (int32_t d = 0; d < kD; ++d)
      max_abs = std::max(max_abs, std::fabs(s.layer_mean[l * kD + d]));
    for (int32_t d = 0; d < kD; ++d) {
      EXPECT_NEAR(back->layer_mean[l * kD + d], s.layer_mean[l * kD + d], max_abs / 254 + 1e-6f);
    }
  }
  // Without the new sections the blob stays version 1 (older readers).
  BlockSummary plain = s;
  plain.key_heads.clear();
  plain.head_keys.clear();
  plain.key_scales.clear();
  plain.key_tokens = 0;
  auto v1 = EncodeSummary(plain, SummaryEncoding::kFp16);
  ASSERT_OK(v1);
  EXPECT_EQ(static_cast<uint8_t>((*v1)[4]), 1);
  EXPECT_OK(DecodeSummary(*v1));
  // A flipped byte in the head keys is caught by the checksum.
  std::string bad = *blob;
  bad[bad.size() - 3] ^= 0x40;
  EXPECT_THAT(DecodeSummary(bad).status(), StatusIs(absl::StatusCode::kDataLoss));
  // A truncated head-keys section is refused, not read past its end.
  EXPECT_FALSE(DecodeSummary(absl::string_view(*blob).substr(0, blob->size() - 1)).ok());
}

TEST(KeyTableTest, RefusesSummariesWithoutWhatTheContextNeeds) {
  KeyTableOptions o;
  o.dim = kD;
  o.num_layers = kL;
  o.key_heads = KeyHeadsOf(Calibration(), kH);
  o.key_tokens = kT;
  KeyTable table(o);
  std::vector<BlockSummary> pages = {Summarise(MakeBlockPayload(Layout(), 1, {})),
                                     Summarise(MakeBlockPayload(Layout(), 2, {}), false)};
  EXPECT_THAT(std::string(table.Add(pages).message()), HasSubstr("summaries[1] holds keys of 0"));
  EXPECT_EQ(table.size(), 0);  // all or nothing
  pages[1] = Summarise(MakeBlockPayload(Layout(), 2, {}));
  pages[1].layer_mean.clear();
  EXPECT_THAT(std::string(table.Add(pages).message()),
              HasSubstr("summaries[1] has 0 per-layer means"));
  pages[1] = Summarise(MakeBlockPayload(Layout(), 2, {}));
  ASSERT_OK(table.Add(pages));
  EXPECT_EQ(table.size(), 2);
}

// Direct double-precision references over the dequantised table rows.
double LayerCos(const KeyTable& t, int64_t b, int32_t l, const float* a, bool centered) {
  std::vector<double> r(kD), x(a, a + kD), u(kD, 0);
  for (int32_t d = 0; d < kD; ++d)
    r[d] = static_cast<double>(t.LayerRow(b, l)[d]) * t.LayerScale(b, l);
  if (centered) {
    double n = 0;
    for (int32_t d = 0; d < kD; ++d) {
      u[d] = t.LayerSum(l)[d] / t.size();
      n += u[d] * u[d];
    }
    n = std::sqrt(n);
    double ru = 0, xu = 0;
    for (int32_t d = 0; d < kD; ++d) {
      u[d] /= n;
      ru += r[d] * u[d];
      xu += x[d] * u[d];
    }
    for (int32_t d = 0; d < kD; ++d) {
      r[d] -= ru * u[d];
      x[d] -= xu * u[d];
    }
  }
  double rx = 0, rr = 0, xx = 0;
  for (int32_t d = 0; d < kD; ++d) {
    rx += r[d] * x[d];
    rr += r[d] * r[d];
    xx += x[d] * x[d];
  }
  return rx / std::sqrt(rr * xx);
}

class KeyScorerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KeyTableOptions o;
    o.dim = kD;
    o.num_layers = kL;
    o.key_heads = KeyHeadsOf(Calibration(), kH);
    o.key_tokens = kT;
    table_ = std::make_unique<KeyTable>(o);
    for (const SyntheticPayload& p : Payloads(6)) pages_.push_back(Summarise(p));
    ASSERT_OK(table_->Add(pages_));
    anchor_.resize(kL * kD);
    for (size_t i = 0; i < anchor_.size(); ++i) anchor_[i] = std::sin(0.7 * i) + 0.2f;
  }
  std::unique_ptr<KeyTable> table_;
  std::vector<BlockSummary> pages_;
  std::vector<float> anchor_;
  KeyScorerScratch scratch_;
};

TEST_F(KeyScorerTest, LayerKeyKeyIsTheMeanOfPerLayerCosines) {
  for (bool centered : {false, true}) {
    std::vector<float> out(6);
    ASSERT_OK(LayerKeyKeyScores(*table_, anchor_, centered, &scratch_, absl::MakeSpan(out)));
    for (int64_t b = 0; b < 6; ++b) {
      double want = 0;
      for (int32_t l = 0; l < kL; ++l) {
        want += 0.5 * (1 + LayerCos(*table_, b, l, &anchor_[l * kD], centered)) / kL;
      }
      EXPECT_NEAR(out[b], want, 2e-5) << "page " << b << (centered ? " centred" : "");
    }
  }
}

TEST_F(KeyScorerTest, MassIsThePriorPlusWeightedRetrievalSoftmax) {
  const SelectionCalibration c = Calibration();
  const std::vector<int32_t> slots = KeyHeadSlots(c, kH);
  std::vector<float> q(2 * kD);
  for (size_t i = 0; i < q.size(); ++i) q[i] = 3.0f * std::cos(1.3 * i);
  std::vector<float> out(6);
  ASSERT_OK(MassScores({table_.get(), &c, slots, kD, 6, q}, &scratch_, absl::MakeSpan(out)));
  std::vector<double> want(6);
  for (int64_t b = 0; b < 6; ++b) want[b] = c.prior[std::min<int64_t>(5 - b, 2)];
  for (int i = 0; i < 2; ++i) {
    std::vector<double> lse(6);
    for (int64_t b = 0; b < 6; ++b) {
      double s = 0;
      for (int32_t t = 0; t < kT; ++t) {
        double dot = 0;
        for (int32_t d = 0; d < kD; ++d) {
          dot += double{q[i * kD + d]} * table_->HeadKeys(b, slots[i])[t * kD + d] *
                 table_->HeadScale(b, slots[i]);
        }
        s += std::exp(dot / std::sqrt(double{kD}));
      }
      lse[b] = std::log(s);
    }
    double z = 0;
    for (double x : lse) z += std::exp(x);
    for (int64_t b = 0; b < 6; ++b) want[b] += c.head_weights[i] * std::exp(lse[b]) / z;
  }
  for (int64_t b = 0; b < 6; ++b) EXPECT_NEAR(out[b], want[b], 1e-5) << b;
  // Without queries: prior_all alone; uncalibrated: recency.
  ASSERT_OK(MassScores({table_.get(), &c, slots, kD, 6, {}}, &scratch_, absl::MakeSpan(out)));
  EXPECT_FLOAT_EQ(out[5], c.prior_all[0]);
  EXPECT_FLOAT_EQ(out[0], c.prior_all[2]);
  const SelectionCalibration uncalibrated;
  ASSERT_OK(MassScores({nullptr, &uncalibrated, {}, kD, 6, {}}, &scratch_, absl::MakeSpan(out)));
  EXPECT_FLOAT_EQ(out[0], 1.0f / 6);
  EXPECT_FLOAT_EQ(out[5], 1.0f);
}

TEST_F(KeyScorerTest, HugeFiniteInputsStayFinite) {
  const SelectionCalibration c = Calibration();
  std::vector<float> q(2 * kD, 3e38f);
  std::vector<float> out(6);
  ASSERT_OK(MassScores({table_.get(), &c, KeyHeadSlots(c, kH), kD, 6, q}, &scratch_,
                       absl::MakeSpan(out)));
  for (float x : out) EXPECT_TRUE(std::isfinite(x));
  std::vector<float> a1 = anchor_, a2 = anchor_;
  for (float& x : a2) x *= 1e30f;
  std::vector<float> o1(6), o2(6);
  ASSERT_OK(LayerKeyKeyScores(*table_, a1, true, &scratch_, absl::MakeSpan(o1)));
  ASSERT_OK(LayerKeyKeyScores(*table_, a2, true, &scratch_, absl::MakeSpan(o2)));
  for (int b = 0; b < 6; ++b) EXPECT_NEAR(o1[b], o2[b], 1e-6) << b;
}

// A context of `n` payload pages with per-layer means and head keys; page
// `target` gets keys of the retrieval KV head that match `query` strongly.
std::unique_ptr<ContextIndex> MassContext(int n, int target, const std::vector<float>& query) {
  ContextIndexOptions o;
  o.tree.dim = kD;
  o.tree.block_size_tokens = kT;
  o.tree.pages_per_chunk = 4;
  o.num_layers = kL;
  o.num_kv_heads = kH;
  o.keep_layer_means = true;
  o.calibration = Calibration();
  auto ctx = ContextIndex::Create(o);
  EXPECT_OK(ctx) << ctx.status();
  std::vector<BlockSummary> pages;
  for (int i = 0; i < n; ++i) {
    BlockSummary s = Summarise(MakeBlockPayload(Layout(), 500 + i, {}));
    if (i == target) {
      // Slot 1 (the KV head of retrieval head 1): one token = 127 * q / |q|.
      float m = 0;
      for (float x : query) m = std::max(m, std::fabs(x));
      for (int32_t d = 0; d < kD; ++d) {
        s.head_keys[(1 * kT + 2) * kD + d] =
            static_cast<int8_t>(std::lround(127 * query[kD + d] / m));
      }
      s.key_scales[1] = 1.0f;
    }
    pages.push_back(std::move(s));
  }
  EXPECT_OK((*ctx)->AddSegment(pages));
  return std::move(*ctx);
}

TEST(SelectorKeyTest, MassFindsTheBlockTheRetrievalHeadLooksFor) {
  std::vector<float> q(2 * kD);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(2.1 * i + 0.3);
  auto ctx = MassContext(24, /*target=*/5, q);
  SelectorOptions so;
  so.sink_blocks = 1;
  so.local_blocks = 1;
  auto selector = Selector::Create(so);
  ASSERT_OK(selector);
  SelectRequest r;
  r.context = ctx.get();
  r.scorer = ScorerKind::kMass;
  r.budget_blocks = 4;
  r.head_queries = q;
  r.step = 1;
  SelectResult out;
  ASSERT_OK((*selector)->Select(r, &out));
  EXPECT_EQ(out.blocks, (std::vector<int64_t>{0, 5, 22, 23}));
  ASSERT_EQ(out.scores.size(), 4u);
  EXPECT_FLOAT_EQ(out.scores[1], 1.0f);  // the best page after min-max
  // Without queries the prior alone: the most recent blocks (ties in the
  // prior's flat tail go to the more recent block; the stability filter
  // would hold block 5, relevant at its one step so far).
  r.head_queries = {};
  r.stability = false;
  r.step = 2;
  r.budget_blocks = 5;
  ASSERT_OK((*selector)->Select(r, &out));
  EXPECT_EQ(out.blocks, (std::vector<int64_t>{0, 20, 21, 22, 23}));
}

TEST(SelectorKeyTest, BadAnchorsAndHeadQueriesNameTheExpectedSizes) {
  std::vector<float> q(2 * kD, 1.0f);
  auto ctx = MassContext(8, 3, q);
  auto selector = Selector::Create(SelectorOptions());
  ASSERT_OK(selector);
  SelectResult out;
  SelectRequest r;
  r.context = ctx.get();
  r.budget_blocks = 6;
  r.scorer = ScorerKind::kKeyKey;
  const std::vector<float> odd(kD + 1, 1.0f);
  r.anchor = odd;
  EXPECT_THAT(std::string((*selector)->Select(r, &out).message()),
              HasSubstr("expected 16 (pooled over layers and KV heads) or 48 (3 layers x 16"));
  std::vector<float> layered(kL * kD, 1.0f);
  std::fill(layered.begin() + kD, layered.begin() + 2 * kD, 0.0f);
  r.anchor = layered;
  EXPECT_THAT(std::string((*selector)->Select(r, &out).message()),
              HasSubstr("anchor row 1 (layer 1) is all zero"));
  layered[kD] = std::numeric_limits<float>::infinity();
  EXPECT_THAT(std::string((*selector)->Select(r, &out).message()), HasSubstr("not finite"));
  r.scorer = ScorerKind::kMass;
  r.anchor = {};
  const std::vector<float> short_q(kD, 1.0f);
  r.head_queries = short_q;
  EXPECT_THAT(std::string((*selector)->Select(r, &out).message()),
              HasSubstr("head_queries has 16 values; expected 32 (2 retrieval heads x 16)"));
  // A valid per-layer anchor selects through the per-layer scorer.
  std::vector<float> good(kL * kD);
  for (size_t i = 0; i < good.size(); ++i) good[i] = std::cos(0.3 * i) + 0.1f;
  r.scorer = ScorerKind::kKeyKey;
  r.head_queries = {};
  r.anchor = good;
  r.recency_weight = 0.0f;
  ASSERT_OK((*selector)->Select(r, &out)) << (*selector)->Select(r, &out);
  EXPECT_EQ(out.blocks.size(), 6u);
  r.recency_weight = 2.0f;
  r.step = 5;
  EXPECT_THAT(std::string((*selector)->Select(r, &out).message()), HasSubstr("recency_weight"));
}

TEST(SelectorKeyTest, ScaleDoesNotChangeTheSelection) {
  testing::SyntheticContextOptions so;
  so.num_blocks = 300;
  so.dim = 64;
  const testing::SyntheticContext syn = testing::MakeSyntheticContext(so);
  TreeOptions to;
  to.dim = syn.dim;
  to.keep_summaries = false;
  std::vector<float> big = syn.anchor, tiny = syn.anchor;
  for (float& x : big) x *= 1e30f;
  for (float& x : tiny) x *= 1e-30f;
  std::vector<std::vector<int64_t>> chosen;
  const std::vector<const std::vector<float>*> anchors = {&syn.anchor, &big, &tiny};
  for (const std::vector<float>* a : anchors) {
    auto ctx = ContextIndex::Create(to);
    ASSERT_OK(ctx);
    ASSERT_OK((*ctx)->tree().AddSegment(syn.vectors));
    auto selector = Selector::Create(SelectorOptions());
    SelectRequest r;
    r.context = ctx->get();
    r.anchor = *a;
    r.budget_blocks = 20;
    SelectResult out;
    ASSERT_OK((*selector)->Select(r, &out));
    chosen.push_back(out.blocks);
    for (float s : out.scores) EXPECT_TRUE(std::isfinite(s));
  }
  EXPECT_EQ(chosen[1], chosen[0]);
  EXPECT_EQ(chosen[2], chosen[0]);
  // Not the degenerate answer a zeroed anchor gives: sinks, the first
  // pages and the local window.
  std::vector<int64_t> degenerate;
  for (int64_t p = 0; p < 16; ++p) degenerate.push_back(p);
  for (int64_t p = 296; p < 300; ++p) degenerate.push_back(p);
  EXPECT_NE(chosen[0], degenerate);
}

TEST(SelectorKeyTest, QuestRanksTheSameAtAnyQueryScale) {
  ContextIndexOptions o;
  o.tree.dim = 2;
  o.tree.keep_summaries = true;
  auto ctx = ContextIndex::Create(o);
  ASSERT_OK(ctx);
  std::vector<BlockSummary> pages(8);
  for (int i = 0; i < 8; ++i) {
    pages[i].dim = 2;
    pages[i].mean = {1.0f, 0.1f * i};
    pages[i].min = {0.0f, -1.0f};
    pages[i].max = {1.0f, 1.0f + (i == 3 ? 9.0f : 0.5f * (i % 3))};
    pages[i].radius = 1;
  }
  ASSERT_OK((*ctx)->AddSegment(pages));
  SelectorOptions so;
  so.stability.weight = 0;
  std::vector<std::vector<int64_t>> chosen;
  for (float scale : {1.0f, 3e38f}) {
    auto selector = Selector::Create(so);
    const std::vector<float> q = {0.5f * scale, scale};
    SelectRequest r;
    r.context = ctx->get();
    r.scorer = ScorerKind::kQuest;
    r.query = q;
    r.budget_blocks = 7;
    r.step = scale > 1 ? 2 : 1;
    SelectResult out;
    ASSERT_OK((*selector)->Select(r, &out));
    chosen.push_back(out.blocks);
  }
  EXPECT_EQ(chosen[0], chosen[1]);
}

}  // namespace
}  // namespace kvtier::index
