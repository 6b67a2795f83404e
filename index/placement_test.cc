#include "index/placement.h"

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::index {
namespace {

// Blocks 0-2 point along the context's mean direction; block 3 is distinct.
const std::vector<float> kVectors = {1, 0.1f, 2, 0.2f, 1, 0, 0, 1};

TEST(PlacementTest, RedundantBlocksAreDemotedFirst) {
  DemotionInput in;
  in.dim = 2;
  in.vectors = kVectors;
  const std::vector<int64_t> access = {5, 5, 5, 5};
  in.last_access = access;
  std::vector<float> prio;
  auto order = RankForDemotion(in, {}, &prio);
  ASSERT_OK(order) << order.status();
  ASSERT_EQ(order->size(), 4u);
  EXPECT_EQ(order->back(), 3);  // the distinct block goes last
  EXPECT_GT(prio[2], prio[3]);
}

TEST(PlacementTest, LruWhenOnlyAgeCounts) {
  DemotionInput in;
  in.dim = 2;
  in.vectors = kVectors;
  const std::vector<int64_t> access = {40, 10, 30, 20};
  in.last_access = access;
  DemotionWeights lru;
  lru.redundancy_weight = 0;
  lru.stability_weight = 0;
  lru.age_weight = 1;
  auto order = RankForDemotion(in, lru, nullptr);
  ASSERT_OK(order);
  EXPECT_EQ(*order, (std::vector<int32_t>{1, 3, 2, 0}));
}

TEST(PlacementTest, StableBlocksAreProtected) {
  DemotionInput in;
  in.dim = 2;
  in.vectors = kVectors;
  const std::vector<int64_t> access = {5, 5, 5, 5};
  const std::vector<float> stability = {0, 1, 0, 0};
  in.last_access = access;
  in.stability = stability;
  auto order = RankForDemotion(in, {}, nullptr);
  ASSERT_OK(order);
  EXPECT_EQ(order->back(), 1);
}

TEST(PlacementTest, BadInputNamesTheField) {
  DemotionInput in;
  in.dim = 2;
  EXPECT_NE(RankForDemotion(in, {}, nullptr).status().message().find("no blocks"),
            std::string::npos);
  const std::vector<int64_t> access = {1, 2, 3, 4};
  in.last_access = access;
  in.vectors = absl::MakeConstSpan(kVectors).subspan(0, 6);
  EXPECT_NE(RankForDemotion(in, {}, nullptr).status().message().find("vectors has 6"),
            std::string::npos);
  in.vectors = kVectors;
  const std::vector<float> stability = {0, 2, 0, 0};
  in.stability = stability;
  EXPECT_NE(RankForDemotion(in, {}, nullptr).status().message().find("stability[1]"),
            std::string::npos);
  in.stability = {};
  std::vector<float> nan_vectors = kVectors;
  nan_vectors[5] = std::nanf("");
  in.vectors = nan_vectors;
  EXPECT_NE(RankForDemotion(in, {}, nullptr).status().message().find("vectors[5]"),
            std::string::npos);
}

}  // namespace
}  // namespace kvtier::index
