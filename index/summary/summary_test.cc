#include "index/summary/summary.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "index/summary/summary_codec.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/synthetic.h"

using ::kvtier::testing::StatusIs;

namespace kvtier::index {
namespace {

using ::kvtier::testing::MakeBlockPayload;
using ::kvtier::testing::SyntheticPayload;

BlockLayout Layout(Dtype dtype, int32_t layers = 3, int32_t heads = 2, int32_t dim = 40,
                   int32_t tokens = 5) {
  BlockLayout l;
  l.num_layers = layers;
  l.num_kv_heads = heads;
  l.head_dim = dim;
  l.block_size_tokens = tokens;
  l.dtype = dtype;
  return l;
}

// Keys of (l, h, t) in the payload's key array.
const float* Key(const SyntheticPayload& p, const BlockLayout& l, int32_t layer, int32_t head,
                 int32_t t) {
  return &p.keys[((static_cast<size_t>(layer) * l.num_kv_heads + head) * l.block_size_tokens + t) *
                 l.head_dim];
}

class SummaryDtypeTest : public ::testing::TestWithParam<Dtype> {};

TEST_P(SummaryDtypeTest, EqualsScalarReference) {
  for (int32_t dim : {40, 128, 7}) {
    const BlockLayout layout = Layout(GetParam(), 3, 2, dim, 5);
    const SyntheticPayload p = MakeBlockPayload(layout, 11 + dim, {});
    SummaryOptions opt;
    opt.per_layer = true;
    opt.per_layer_bounds = true;
    auto s = ComputeBlockSummary(layout, p.bytes, opt, nullptr);
    ASSERT_OK(s) << s.status();
    ASSERT_EQ(s->mean.size(), static_cast<size_t>(dim));
    std::vector<float> lo(dim, 1e30f), hi(dim, -1e30f);
    for (int32_t l = 0; l < 3; ++l) {
      std::vector<double> lsum(dim, 0.0);
      std::vector<float> llo(dim, 1e30f), lhi(dim, -1e30f);
      for (int32_t h = 0; h < 2; ++h) {
        for (int32_t t = 0; t < 5; ++t) {
          const float* k = Key(p, layout, l, h, t);
          for (int32_t d = 0; d < dim; ++d) {
            lsum[d] += k[d];
            lo[d] = std::min(lo[d], k[d]);
            hi[d] = std::max(hi[d], k[d]);
            llo[d] = std::min(llo[d], k[d]);
            lhi[d] = std::max(lhi[d], k[d]);
          }
        }
      }
      for (int32_t d = 0; d < dim; ++d) {
        EXPECT_NEAR(s->layer_mean[l * dim + d], lsum[d] / 10.0, 1e-5);
        EXPECT_EQ(s->layer_min[l * dim + d], llo[d]);
        EXPECT_EQ(s->layer_max[l * dim + d], lhi[d]);
      }
    }
    double r2 = 0;
    for (size_t i = 0; i < p.keys.size(); i += dim) {
      double s2 = 0;
      for (int32_t d = 0; d < dim; ++d) {
        const double dev = p.keys[i + d] - p.mean[d];
        s2 += dev * dev;
      }
      r2 = std::max(r2, s2);
    }
    for (int32_t d = 0; d < dim; ++d) {
      EXPECT_NEAR(s->mean[d], p.mean[d], 1e-5) << "dim " << d;
      EXPECT_EQ(s->min[d], lo[d]);
      EXPECT_EQ(s->max[d], hi[d]);
    }
    EXPECT_NEAR(s->radius, std::sqrt(r2), 1e-4);
    EXPECT_TRUE(s->weighted_mean.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, SummaryDtypeTest,
                         ::testing::Values(Dtype::kFp16, Dtype::kBf16, Dtype::kFp32));

TEST(SummaryTest, HeadVarianceWeightsFavourHighVarianceHeads) {
  const BlockLayout layout = Layout(Dtype::kFp32, 2, 2, 16, 32);
  // Head (1, 0) varies 4x, head (0, 1) 0.25x, the others 1x.
  const std::vector<float> scale = {1.0f, 0.25f, 4.0f, 1.0f};
  HeadVarianceTracker tracker(2, 2, 16);
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    HeadStats stats;
    const SyntheticPayload p = MakeBlockPayload(layout, seed, scale);
    ASSERT_OK(ComputeBlockSummary(layout, p.bytes, {}, &stats));
    ASSERT_OK(tracker.Merge(stats));
  }
  EXPECT_EQ(tracker.Count(1, 0), 20 * 32);
  EXPECT_GT(tracker.Variance(1, 0), 10 * tracker.Variance(0, 0));
  EXPECT_LT(tracker.Variance(0, 1), tracker.Variance(0, 0));
  const HeadWeights w = tracker.ComputeWeights();
  EXPECT_EQ(w.version, 1u);
  ASSERT_EQ(w.weights.size(), 4u);
  EXPECT_GT(w.weights[2], w.weights[0]);
  EXPECT_GT(w.weights[2], w.weights[3]);
  EXPECT_LT(w.weights[1], w.weights[0]);
  EXPECT_NEAR((w.weights[0] + w.weights[1] + w.weights[2] + w.weights[3]) / 4, 1.0, 1e-5);
  EXPECT_EQ(tracker.ComputeWeights().version, 2u);
}

TEST(SummaryTest, WelfordMergeEqualsOnePass) {
  const BlockLayout layout = Layout(Dtype::kFp32, 1, 1, 8, 16);
  HeadVarianceTracker tracker(1, 1, 8);
  std::vector<float> all;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    HeadStats stats;
    const SyntheticPayload p = MakeBlockPayload(layout, seed, {2.0f});
    ASSERT_OK(ComputeBlockSummary(layout, p.bytes, {}, &stats));
    ASSERT_OK(tracker.Merge(stats));
    all.insert(all.end(), p.keys.begin(), p.keys.end());
  }
  std::vector<double> mean(8, 0.0);
  const double n = static_cast<double>(all.size()) / 8;
  for (size_t i = 0; i < all.size(); ++i) mean[i % 8] += all[i] / n;
  double m2 = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    m2 += (all[i] - mean[i % 8]) * (all[i] - mean[i % 8]);
  }
  EXPECT_NEAR(tracker.Variance(0, 0), m2 / (n * 8), 1e-6 * m2 / (n * 8));
}

TEST(SummaryTest, WeightedMeanUsesHeadWeights) {
  const BlockLayout layout = Layout(Dtype::kFp32, 1, 2, 4, 3);
  const SyntheticPayload p = MakeBlockPayload(layout, 5, {});
  HeadWeights w;
  w.version = 7;
  w.num_layers = 1;
  w.num_kv_heads = 2;
  w.weights = {3.0f, 1.0f};
  SummaryOptions opt;
  opt.head_weights = &w;
  auto s = ComputeBlockSummary(layout, p.bytes, opt, nullptr);
  ASSERT_OK(s) << s.status();
  EXPECT_EQ(s->weights_version, 7u);
  for (int32_t d = 0; d < 4; ++d) {
    double h0 = 0, h1 = 0;
    for (int32_t t = 0; t < 3; ++t) {
      h0 += Key(p, layout, 0, 0, t)[d] / 3.0;
      h1 += Key(p, layout, 0, 1, t)[d] / 3.0;
    }
    EXPECT_NEAR(s->weighted_mean[d], (3 * h0 + h1) / 4, 1e-5);
  }
  // The same weights reduce a per-head anchor alike.
  std::vector<float> per_head = {1, 0, 0, 0, 0, 1, 0, 0};
  auto a = WeightedAnchor(per_head, 4, w);
  ASSERT_OK(a);
  EXPECT_FLOAT_EQ((*a)[0], 0.75f);
  EXPECT_FLOAT_EQ((*a)[1], 0.25f);
  EXPECT_FALSE(WeightedAnchor({1, 2, 3}, 4, w).ok());
}

TEST(SummaryTest, BadInputNamesTheField) {
  BlockLayout layout = Layout(Dtype::kFp32, 1, 1, 4, 2);
  const SyntheticPayload p = MakeBlockPayload(layout, 1, {});
  auto s = ComputeBlockSummary(layout, p.bytes.substr(1), {}, nullptr);
  EXPECT_THAT(s.status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(s.status().message().find("payload size"), std::string::npos);

  BlockLayout bad = layout;
  bad.num_kv_heads = 0;
  s = ComputeBlockSummary(bad, p.bytes, {}, nullptr);
  EXPECT_NE(s.status().message().find("layout.num_kv_heads"), std::string::npos);

  std::string nan_payload = p.bytes;
  const float nan = std::nanf("");
  std::memcpy(&nan_payload[4], &nan, 4);
  s = ComputeBlockSummary(layout, nan_payload, {}, nullptr);
  EXPECT_NE(s.status().message().find("not finite"), std::string::npos);

  HeadWeights w;
  w.num_layers = 2;
  w.num_kv_heads = 1;
  w.weights = {1, 1};
  SummaryOptions opt;
  opt.head_weights = &w;
  s = ComputeBlockSummary(layout, p.bytes, opt, nullptr);
  EXPECT_NE(s.status().message().find("head_weights"), std::string::npos);

  HeadVarianceTracker tracker(2, 2, 4);
  HeadStats stats;
  ASSERT_OK(ComputeBlockSummary(layout, p.bytes, {}, &stats));
  EXPECT_THAT(tracker.Merge(stats), StatusIs(absl::StatusCode::kInvalidArgument));
}

BlockSummary FullSummary() {
  const BlockLayout layout = Layout(Dtype::kBf16, 3, 2, 24, 4);
  const SyntheticPayload p = MakeBlockPayload(layout, 9, {});
  HeadWeights w;
  w.version = 3;
  w.num_layers = 3;
  w.num_kv_heads = 2;
  w.weights = {1, 2, 1, 0.5, 1, 1};
  SummaryOptions opt;
  opt.per_layer = true;
  opt.per_layer_bounds = true;
  opt.head_weights = &w;
  return *ComputeBlockSummary(layout, p.bytes, opt, nullptr);
}

TEST(SummaryCodecTest, RoundTripFp32IsExact) {
  const BlockSummary s = FullSummary();
  auto blob = EncodeSummary(s, SummaryEncoding::kFp32);
  ASSERT_OK(blob) << blob.status();
  EXPECT_EQ(blob->size(), kSummaryHeaderBytes + (4 * 24 + 9 * 24) * 4);
  auto back = DecodeSummary(*blob);
  ASSERT_OK(back) << back.status();
  EXPECT_EQ(back->dim, s.dim);
  EXPECT_EQ(back->num_layers, 3);
  EXPECT_EQ(back->weights_version, 3u);
  EXPECT_EQ(back->radius, s.radius);
  EXPECT_EQ(back->mean, s.mean);
  EXPECT_EQ(back->weighted_mean, s.weighted_mean);
  EXPECT_EQ(back->min, s.min);
  EXPECT_EQ(back->max, s.max);
  EXPECT_EQ(back->layer_mean, s.layer_mean);
  EXPECT_EQ(back->layer_min, s.layer_min);
  EXPECT_EQ(back->layer_max, s.layer_max);
}

TEST(SummaryCodecTest, RoundTripFp16IsClose) {
  BlockSummary s = FullSummary();
  s.layer_mean.clear();
  s.layer_min.clear();
  s.layer_max.clear();
  s.num_layers = 0;
  auto blob = EncodeSummary(s, SummaryEncoding::kFp16);
  ASSERT_OK(blob) << blob.status();
  EXPECT_EQ(blob->size(), kSummaryHeaderBytes + 4 * 24 * 2);
  auto back = DecodeSummary(*blob);
  ASSERT_OK(back) << back.status();
  EXPECT_TRUE(back->layer_mean.empty());
  for (int d = 0; d < 24; ++d) {
    EXPECT_NEAR(back->mean[d], s.mean[d], 2e-3 * (1 + std::fabs(s.mean[d])));
    EXPECT_NEAR(back->max[d], s.max[d], 2e-3 * (1 + std::fabs(s.max[d])));
  }
  s.max[0] = 1e6f;  // beyond fp16
  EXPECT_NE(EncodeSummary(s, SummaryEncoding::kFp16).status().message().find("summary.max[0]"),
            std::string::npos);
}

TEST(SummaryCodecTest, PeekSummaryMeanEqualsTheDecodedMean) {
  // Format version 2 (int8 layer means) is read from its header; version 1
  // (fp16, no layers) takes the full decode. Both give the decoded mean.
  BlockSummary v1 = FullSummary();
  v1.layer_mean.clear();
  v1.layer_min.clear();
  v1.layer_max.clear();
  v1.num_layers = 0;
  SummaryCodecOptions int8_layers;
  int8_layers.encoding = SummaryEncoding::kFp32;
  int8_layers.layer_int8 = true;
  const absl::StatusOr<std::string> blobs[] = {
      EncodeSummary(FullSummary(), int8_layers),
      EncodeSummary(v1, SummaryEncoding::kFp16),
  };
  ASSERT_OK(blobs[0]) << blobs[0].status();
  ASSERT_OK(blobs[1]) << blobs[1].status();
  EXPECT_EQ((*blobs[0])[4], 2);
  EXPECT_EQ((*blobs[1])[4], 1);
  for (const absl::StatusOr<std::string>& blob : blobs) {
    auto decoded = DecodeSummary(*blob);
    ASSERT_OK(decoded) << decoded.status();
    const std::optional<std::vector<float>> mean = PeekSummaryMean(*blob);
    ASSERT_TRUE(mean.has_value());
    EXPECT_EQ(*mean, decoded->mean);
    // Too short for its mean, not a summary, an unknown version, or empty:
    // nothing.
    EXPECT_FALSE(PeekSummaryMean(blob->substr(0, kSummaryHeaderBytes + 4)).has_value());
    std::string bad = *blob;
    bad[0] = 'X';
    EXPECT_FALSE(PeekSummaryMean(bad).has_value());
    bad = *blob;
    bad[4] = 9;
    EXPECT_FALSE(PeekSummaryMean(bad).has_value());
    EXPECT_FALSE(PeekSummaryMean("").has_value());
  }
}

TEST(SummaryCodecTest, CorruptInputIsRejected) {
  auto blob = EncodeSummary(FullSummary(), SummaryEncoding::kFp32);
  ASSERT_OK(blob);
  // Every truncation and every single-byte change is caught.
  for (size_t len = 0; len < blob->size(); len += 7) {
    EXPECT_FALSE(DecodeSummary(blob->substr(0, len)).ok()) << len;
  }
  for (size_t i = 0; i < blob->size(); ++i) {
    std::string bad = *blob;
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    EXPECT_FALSE(DecodeSummary(bad).ok()) << "byte " << i;
  }
  EXPECT_FALSE(DecodeSummary(*blob + "x").ok());
  std::string bad = *blob;
  bad[4] = 9;
  EXPECT_NE(DecodeSummary(bad).status().message().find("version"), std::string::npos);
  bad = *blob;
  bad[20] ^= 1;
  EXPECT_THAT(DecodeSummary(bad).status(), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(DecodeSummary("").status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(SummaryCodecTest, EncodeRejectsInconsistentSummary) {
  BlockSummary s = FullSummary();
  s.mean.pop_back();
  EXPECT_NE(EncodeSummary(s, SummaryEncoding::kFp32).status().message().find("summary.mean"),
            std::string::npos);
  s = FullSummary();
  s.min[3] = std::nanf("");
  EXPECT_NE(EncodeSummary(s, SummaryEncoding::kFp32).status().message().find("summary.min[3]"),
            std::string::npos);
}

}  // namespace
}  // namespace kvtier::index
