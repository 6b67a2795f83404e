#include "index/summary/summary_builder.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "index/summary/summary.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/synthetic.h"

using ::kvtier::testing::StatusIs;

namespace kvtier::index {
namespace {

using ::kvtier::testing::MakeBlockPayload;
using ::kvtier::testing::SyntheticPayload;

// Every field, compared bit for bit (floats as their bytes, so that -0.0
// against 0.0 or a NaN would show).
template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

void ExpectIdentical(const BlockSummary& a, const BlockSummary& b) {
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_TRUE(SameBits(a.mean, b.mean));
  EXPECT_TRUE(SameBits(a.weighted_mean, b.weighted_mean));
  EXPECT_EQ(a.weights_version, b.weights_version);
  EXPECT_TRUE(SameBits(a.min, b.min));
  EXPECT_TRUE(SameBits(a.max, b.max));
  EXPECT_EQ(std::bit_cast<uint32_t>(a.radius), std::bit_cast<uint32_t>(b.radius));
  EXPECT_TRUE(SameBits(a.layer_mean, b.layer_mean));
  EXPECT_TRUE(SameBits(a.layer_min, b.layer_min));
  EXPECT_TRUE(SameBits(a.layer_max, b.layer_max));
  EXPECT_EQ(a.key_heads, b.key_heads);
  EXPECT_EQ(a.key_tokens, b.key_tokens);
  EXPECT_TRUE(SameBits(a.head_keys, b.head_keys));
  EXPECT_TRUE(SameBits(a.key_scales, b.key_scales));
}

void ExpectIdentical(const HeadStats& a, const HeadStats& b) {
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.count, b.count);
  EXPECT_TRUE(SameBits(a.mean, b.mean));
  EXPECT_TRUE(SameBits(a.m2, b.m2));
}

// Feeds `payload` to a builder in prefixes that grow by the given steps
// (cycled), as a put copying chunk by chunk would.
absl::StatusOr<BlockSummary> BuildInSteps(const BlockLayout& layout, const std::string& payload,
                                          const SummaryOptions& options, HeadStats* stats,
                                          const std::vector<size_t>& steps) {
  absl::StatusOr<BlockSummaryBuilder> b = BlockSummaryBuilder::Create(layout, options, stats);
  if (!b.ok()) return b.status();
  size_t written = 0;
  for (size_t i = 0; written < payload.size(); ++i) {
    written = std::min(payload.size(), written + steps[i % steps.size()]);
    if (absl::Status s = b->Advance(absl::string_view(payload).substr(0, written)); !s.ok()) {
      return s;
    }
  }
  return b->Finish(payload);
}

class SummaryBuilderTest : public ::testing::TestWithParam<Dtype> {};

// Whatever the chunking (one byte, odd sizes, the put's 32 KiB chunks,
// random splits), the builder's summary and head statistics are the bits
// ComputeBlockSummary gives for the whole payload, with every option on.
TEST_P(SummaryBuilderTest, AnyChunkingGivesTheWholePayloadsBits) {
  const BlockLayout layout = BlockLayout{.num_layers = 3,
                                         .num_kv_heads = 4,
                                         .head_dim = 24,
                                         .block_size_tokens = 9,
                                         .dtype = GetParam()};
  const SyntheticPayload p = MakeBlockPayload(layout, 5, {});
  HeadWeights weights;
  weights.version = 7;
  weights.num_layers = 3;
  weights.num_kv_heads = 4;
  for (int i = 0; i < 12; ++i) weights.weights.push_back(0.25f + 0.1f * i);
  SummaryOptions opt;
  opt.bounds = true;
  opt.per_layer = true;
  opt.per_layer_bounds = true;
  opt.head_weights = &weights;
  opt.key_heads = {1, 6, 11};
  HeadStats want_stats;
  absl::StatusOr<BlockSummary> want = ComputeBlockSummary(layout, p.bytes, opt, &want_stats);
  ASSERT_OK(want) << want.status();

  std::mt19937 rng(3);
  std::vector<size_t> random_steps;
  random_steps.reserve(64);
  for (int i = 0; i < 64; ++i) random_steps.push_back(1 + rng() % 700);
  const std::vector<std::vector<size_t>> chunkings = {
      {1}, {7}, {13, 1000}, {32 << 10}, {p.bytes.size()}, random_steps};
  for (const std::vector<size_t>& steps : chunkings) {
    SCOPED_TRACE(::testing::Message() << "first step " << steps[0]);
    HeadStats stats;
    absl::StatusOr<BlockSummary> got = BuildInSteps(layout, p.bytes, opt, &stats, steps);
    ASSERT_OK(got) << got.status();
    ExpectIdentical(*got, *want);
    ExpectIdentical(stats, want_stats);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SummaryBuilderTest,
                         ::testing::Values(Dtype::kFp16, Dtype::kBf16, Dtype::kFp32));

// A head is summarised once its keys are all there, not before; value
// bytes and a prefix that ends mid-head add nothing.
TEST(SummaryBuilder, SummarisesEachHeadOnceItsKeysAreComplete) {
  const BlockLayout layout = BlockLayout{.num_layers = 2,
                                         .num_kv_heads = 2,
                                         .head_dim = 8,
                                         .block_size_tokens = 4,
                                         .dtype = Dtype::kFp16};
  const SyntheticPayload p = MakeBlockPayload(layout, 9, {});
  const size_t head_bytes = 4 * 8 * 2;  // tokens x dim x fp16
  const SummaryOptions opt;
  absl::StatusOr<BlockSummaryBuilder> b = BlockSummaryBuilder::Create(layout, opt, nullptr);
  ASSERT_OK(b) << b.status();
  const absl::string_view all(p.bytes);
  ASSERT_OK(b->Advance(all.substr(0, head_bytes - 1)));
  EXPECT_EQ(b->heads_done(), 0);
  ASSERT_OK(b->Advance(all.substr(0, head_bytes)));
  EXPECT_EQ(b->heads_done(), 1);
  ASSERT_OK(b->Advance(all.substr(0, 2 * head_bytes)));
  EXPECT_EQ(b->heads_done(), 2);
  // Layer 0's values: nothing new. Layer 1's first head: one more.
  ASSERT_OK(b->Advance(all.substr(0, 4 * head_bytes)));
  EXPECT_EQ(b->heads_done(), 2);
  ASSERT_OK(b->Advance(all.substr(0, 5 * head_bytes)));
  EXPECT_EQ(b->heads_done(), 3);
  // A shorter prefix than before reads nothing again.
  ASSERT_OK(b->Advance(all.substr(0, 1)));
  EXPECT_EQ(b->heads_done(), 3);
  absl::StatusOr<BlockSummary> got = b->Finish(all);
  ASSERT_OK(got) << got.status();
  EXPECT_EQ(b->heads_done(), 4);
  absl::StatusOr<BlockSummary> want = ComputeBlockSummary(layout, p.bytes, opt, nullptr);
  ASSERT_OK(want);
  ExpectIdentical(*got, *want);
}

// Non-finite keys: the head that holds them fails Advance, and the error
// sticks through Finish; bad options and a short payload are named.
TEST(SummaryBuilder, ErrorsStickAndNameTheirCause) {
  const BlockLayout layout = BlockLayout{.num_layers = 2,
                                         .num_kv_heads = 2,
                                         .head_dim = 8,
                                         .block_size_tokens = 4,
                                         .dtype = Dtype::kFp32};
  const SyntheticPayload p = MakeBlockPayload(layout, 4, {});
  std::string bad = p.bytes;
  const float nan = std::nanf("");
  // Layer 1, head 0, token 0, dim 3: after layer 0's keys and values.
  const size_t head_bytes = 4 * 8 * 4;
  std::memcpy(&bad[4 * head_bytes + 3 * 4], &nan, 4);
  const SummaryOptions opt;
  absl::StatusOr<BlockSummaryBuilder> b = BlockSummaryBuilder::Create(layout, opt, nullptr);
  ASSERT_OK(b);
  EXPECT_OK(b->Advance(absl::string_view(bad).substr(0, 4 * head_bytes)));
  absl::Status s = b->Advance(bad);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(std::string(s.message()).find("layer 1 head 0"), std::string::npos) << s;
  EXPECT_THAT(b->Finish(bad).status(), StatusIs(absl::StatusCode::kInvalidArgument));

  absl::StatusOr<BlockSummaryBuilder> fresh = BlockSummaryBuilder::Create(layout, opt, nullptr);
  ASSERT_OK(fresh);
  absl::Status short_payload = fresh->Finish(absl::string_view(p.bytes).substr(1)).status();
  EXPECT_THAT(short_payload, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(std::string(short_payload.message()).find("payload size"), std::string::npos);

  SummaryOptions unsorted;
  unsorted.key_heads = {2, 1};
  absl::Status heads = BlockSummaryBuilder::Create(layout, unsorted, nullptr).status();
  EXPECT_THAT(heads, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(std::string(heads.message()).find("options.key_heads[1]"), std::string::npos);
  BlockLayout no_heads = layout;
  no_heads.num_kv_heads = 0;
  EXPECT_THAT(BlockSummaryBuilder::Create(no_heads, opt, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace kvtier::index
