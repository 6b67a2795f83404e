#include "daemon/summarizer.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/summary/summary_codec.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/synthetic.h"

namespace kvtier::daemon {
namespace {

// 2 layers x 2 kv heads x 4 tokens x 8 dims.
ModelProfile Profile(KvDtype dtype = KvDtype::kFp16) {
  ModelProfile p;
  p.profile_id = 7;
  p.owner = "t";
  p.name = "test";
  p.layers = 2;
  p.kv_heads = 2;
  p.head_dim = 8;
  p.block_size_tokens = 4;
  p.dtype = dtype;
  return p;
}

absl::Span<const uint8_t> Bytes(const std::string& s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

TEST(SummarizerTest, SummaryHoldsTheMeansOfThePayloadKeys) {
  SummarizerOptions options;
  options.encoding = index::SummaryEncoding::kFp32;
  Summarizer summarizer(options);
  const ModelProfile profile = Profile();
  testing::SyntheticPayload payload = testing::MakeBlockPayload(LayoutOf(profile), 3, {});
  auto blob = summarizer.Summarize(profile, Bytes(payload.bytes));
  ASSERT_OK(blob) << blob.status();
  auto summary = index::DecodeSummary(*blob);
  ASSERT_OK(summary) << summary.status();
  ASSERT_EQ(summary->mean.size(), 8u);
  for (int d = 0; d < 8; ++d) {
    EXPECT_NEAR(summary->mean[d], payload.mean[d], 1e-5) << d;
    // Uniform weights before any estimate: the weighted mean is the mean.
    EXPECT_NEAR(summary->weighted_mean[d], summary->mean[d], 1e-5) << d;
  }
  EXPECT_EQ(summary->weights_version, 0u);
  EXPECT_EQ(summary->layer_mean.size(), 2u * 8u);
  EXPECT_EQ(summary->min.size(), 8u);
  EXPECT_GT(summary->radius, 0.0f);
}

TEST(SummarizerTest, HeadWeightsAreEstimatedAfterMinBlocksAndFavourVariedHeads) {
  SummarizerOptions options;
  options.head_weights_min_blocks = 4;
  Summarizer summarizer(options);
  const ModelProfile profile = Profile();
  // Head (layer 0, head 1) varies 4x more than the others.
  const std::vector<float> scale = {1, 4, 1, 1};
  for (int i = 0; i < 3; ++i) {
    auto p = testing::MakeBlockPayload(LayoutOf(profile), 10 + i, scale);
    ASSERT_OK(summarizer.Summarize(profile, Bytes(p.bytes)));
  }
  EXPECT_EQ(summarizer.HeadWeightsOf("t", profile.profile_id).version, 0u);
  EXPECT_TRUE(summarizer.HeadWeightsOf("t", profile.profile_id).weights.empty());
  auto p = testing::MakeBlockPayload(LayoutOf(profile), 13, scale);
  ASSERT_OK(summarizer.Summarize(profile, Bytes(p.bytes)));
  index::HeadWeights w = summarizer.HeadWeightsOf("t", profile.profile_id);
  EXPECT_EQ(w.version, 1u);
  ASSERT_EQ(w.weights.size(), 4u);
  EXPECT_GT(w.weights[1], 2.0f);
  EXPECT_LT(w.weights[0], 1.0f);
  // The next summary is weighted with version 1.
  p = testing::MakeBlockPayload(LayoutOf(profile), 14, scale);
  auto blob = summarizer.Summarize(profile, Bytes(p.bytes));
  ASSERT_OK(blob);
  EXPECT_EQ(index::DecodeSummary(*blob)->weights_version, 1u);
  EXPECT_EQ(summarizer.HeadWeightsOf("t", 999).version, 0u);
  // Another tenant's profile under the same id has weights of its own.
  EXPECT_EQ(summarizer.HeadWeightsOf("u", profile.profile_id).version, 0u);
  ModelProfile theirs = profile;
  theirs.owner = "u";
  auto q = testing::MakeBlockPayload(LayoutOf(theirs), 15, scale);
  blob = summarizer.Summarize(theirs, Bytes(q.bytes));
  ASSERT_OK(blob);
  EXPECT_EQ(index::DecodeSummary(*blob)->weights_version, 0u);
  EXPECT_EQ(summarizer.HeadWeightsOf("t", profile.profile_id).version, 1u);
}

TEST(SummarizerTest, ConcurrentPutsReestimateAtEachDoubling) {
  SummarizerOptions options;
  options.head_weights_min_blocks = 4;
  Summarizer summarizer(options);
  const ModelProfile profile = Profile();
  std::vector<std::thread> threads;
  threads.reserve(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        auto p = testing::MakeBlockPayload(LayoutOf(profile), t * 1000 + i, {});
        EXPECT_OK(summarizer.Summarize(profile, Bytes(p.bytes)));
      }
    });
  }
  for (auto& t : threads) t.join();
  // 200 blocks: estimates at 4, 8, 16, 32, 64 and 128.
  EXPECT_EQ(summarizer.HeadWeightsOf("t", profile.profile_id).version, 6u);
}

TEST(SummarizerTest, NonFiniteKeysStoreTheBlockWithoutSummary) {
  SummarizerOptions options;
  options.head_weights_min_blocks = 1;
  Summarizer summarizer(options);
  const ModelProfile profile = Profile(KvDtype::kFp32);
  auto p = testing::MakeBlockPayload(LayoutOf(profile), 1, {});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(p.bytes.data() + 12, &nan, 4);  // a key of layer 0, head 0
  auto blob = summarizer.Summarize(profile, Bytes(p.bytes));
  ASSERT_OK(blob) << blob.status();
  EXPECT_TRUE(blob->empty());
  EXPECT_EQ(summarizer.blocks_without_summary(), 1u);
  // It did not count towards the head statistics.
  EXPECT_EQ(summarizer.HeadWeightsOf("t", profile.profile_id).version, 0u);
  // A value (NaN) in V does not matter.
  p = testing::MakeBlockPayload(LayoutOf(profile), 2, {});
  const size_t v_offset = size_t{2} * 4 * 8 * 4;  // layer 0: K of 2 heads, then V
  std::memcpy(p.bytes.data() + v_offset, &nan, 4);
  blob = summarizer.Summarize(profile, Bytes(p.bytes));
  ASSERT_OK(blob);
  EXPECT_FALSE(blob->empty());
  EXPECT_EQ(summarizer.HeadWeightsOf("t", profile.profile_id).version, 1u);
}

TEST(SummarizerTest, ValuesBeyondFp16AreKeptInFp32) {
  Summarizer summarizer(SummarizerOptions{});  // fp16 encoding
  const ModelProfile profile = Profile(KvDtype::kFp32);
  auto p = testing::MakeBlockPayload(LayoutOf(profile), 1, {});
  for (size_t i = 0; i < p.bytes.size(); i += 4) {
    const float big = 1e6f;
    std::memcpy(p.bytes.data() + i, &big, 4);
  }
  auto blob = summarizer.Summarize(profile, Bytes(p.bytes));
  ASSERT_OK(blob) << blob.status();
  auto summary = index::DecodeSummary(*blob);
  ASSERT_OK(summary);
  EXPECT_FLOAT_EQ(summary->mean[0], 1e6f);
}

// Begin's stream, fed the payload chunk by chunk as a put copies it, gives
// the bytes Summarize gives, and moves the head weights the same way; a
// streamed block with NaN keys is kept without a summary.
TEST(SummarizerTest, StreamedSummaryEqualsTheWholePayloads) {
  SummarizerOptions options;
  options.head_weights_min_blocks = 2;
  options.per_layer_bounds = true;
  Summarizer whole(options), streamed(options);
  const ModelProfile profile = Profile();
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    auto p = testing::MakeBlockPayload(LayoutOf(profile), seed, {});
    auto want = whole.Summarize(profile, Bytes(p.bytes));
    ASSERT_OK(want) << want.status();
    std::unique_ptr<SummaryStream> stream = streamed.Begin(profile);
    for (size_t written = 0; written < p.bytes.size();) {
      written = std::min(p.bytes.size(), written + 37);
      stream->Advance(Bytes(p.bytes).first(written));
    }
    auto got = stream->Finish(Bytes(p.bytes));
    ASSERT_OK(got) << got.status();
    EXPECT_EQ(*got, *want) << "seed " << seed;
  }
  EXPECT_EQ(streamed.HeadWeightsOf("t", 7).version, whole.HeadWeightsOf("t", 7).version);
  EXPECT_GT(streamed.HeadWeightsOf("t", 7).version, 0u);

  const ModelProfile fp32 = Profile(KvDtype::kFp32);
  auto bad = testing::MakeBlockPayload(LayoutOf(fp32), 1, {});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bad.bytes.data() + 12, &nan, 4);
  std::unique_ptr<SummaryStream> stream = streamed.Begin(fp32);
  stream->Advance(Bytes(bad.bytes));
  auto blob = stream->Finish(Bytes(bad.bytes));
  ASSERT_OK(blob) << blob.status();
  EXPECT_TRUE(blob->empty());
  EXPECT_EQ(streamed.blocks_without_summary(), 1u);
}

}  // namespace
}  // namespace kvtier::daemon
