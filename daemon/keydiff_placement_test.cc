#include "daemon/keydiff_placement.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"
#include "index/summary/summary.h"
#include "index/summary/summary_codec.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::daemon {
namespace {

constexpr int32_t kDim = 4;

class KeyDiffPlacementTest : public ::testing::Test {
 protected:
  // A block of `profile` whose v_b is `v`, last used at `micros`.
  Entry* Add(const std::string& name, std::vector<float> v, uint64_t micros, uint64_t profile = 1,
             TierId tier = TierId::kHost) {
    auto e = std::make_unique<Entry>();
    e->key = BlockKey{"t", profile, name};
    e->last_access_micros = micros;
    if (!v.empty()) {
      index::BlockSummary s;
      s.dim = kDim;
      s.mean = std::move(v);
      if (full_summaries_) {  // as the summarizer writes them
        s.weighted_mean = {0.5f, -1, 2, 0};
        s.min = {-3, -3, -3, -3};
        s.max = {3, 3, 3, 3};
        s.radius = 2;
        s.num_layers = 2;
        s.layer_mean = {9, 9, 9, 9, -9, -9, -9, -9};
      }
      auto encoded = index::EncodeSummary(
          s, full_summaries_ ? index::SummaryEncoding::kFp16 : index::SummaryEncoding::kFp32);
      EXPECT_OK(encoded) << encoded.status();
      e->summary = *encoded;
    }
    Entry* raw = e.get();
    entries_.push_back(std::move(e));
    policy_->Insert(tier, raw);
    return raw;
  }

  Entry* Victim(TierId tier = TierId::kHost) {
    return policy_->Victim(tier, [this](const Entry& e) { return !rejected_.contains(&e); });
  }

  // The ranking tests sample the whole tier (newest_protected 0).
  void Make(float redundancy_weight, float age_weight, int32_t sample,
            float newest_protected = 0.0f) {
    KeyDiffPlacementOptions options;
    options.redundancy_weight = redundancy_weight;
    options.age_weight = age_weight;
    options.sample_blocks = sample;
    options.newest_protected = newest_protected;
    policy_ = NewKeyDiffPlacement(options);
  }

  void SetUp() override { Make(1.0f, 0.0f, 16); }

  bool full_summaries_ = false;
  std::vector<std::unique_ptr<Entry>> entries_;
  std::unique_ptr<PlacementPolicy> policy_;
  absl::flat_hash_set<const Entry*> rejected_;
};

TEST_F(KeyDiffPlacementTest, DemotesTheBlockMostLikeTheProfileMeanFirst) {
  // Most keys point along e0; the least recently used block is distinct.
  Entry* distinct = Add("distinct", {0, 0, 1, 0}, 10);
  Add("near", {1, 0.5f, 0, 0}, 10);
  Entry* aligned = Add("aligned", {2, 0, 0, 0}, 10);
  Add("other", {0, 1, 0, 0}, 10);
  for (int i = 0; i < 6; ++i) Add("bulk" + std::to_string(i), {1, 0, 0, 0}, 20);
  EXPECT_STREQ(policy_->name(), "keydiff");
  // As redundant as the bulk blocks, and older.
  EXPECT_EQ(Victim(), aligned);
  policy_->Remove(TierId::kHost, aligned);
  Entry* next = Victim();
  ASSERT_NE(next, nullptr);
  EXPECT_NE(next, distinct);
  EXPECT_EQ(next->key.block_id.substr(0, 4), "bulk");
}

TEST_F(KeyDiffPlacementTest, ReadsVbFromFp16SummariesWithEverySection) {
  full_summaries_ = true;
  Entry* distinct = Add("distinct", {0, 0, 1, 0}, 10);
  Entry* aligned = Add("aligned", {2, 0, 0, 0}, 10);
  for (int i = 0; i < 4; ++i) Add("bulk" + std::to_string(i), {1, 0, 0, 0}, 20);
  EXPECT_EQ(Victim(), aligned);
  rejected_.insert(aligned);
  for (int i = 0; i < 4; ++i) rejected_.insert(entries_[2 + i].get());
  EXPECT_EQ(Victim(), distinct);
}

TEST_F(KeyDiffPlacementTest, WithoutRedundancyWeightItIsLru) {
  Make(0.0f, 0.5f, 16);
  Entry* first = Add("a", {0, 0, 1, 0}, 10);
  Add("b", {1, 0, 0, 0}, 20);
  Add("c", {1, 0, 0, 0}, 30);
  EXPECT_EQ(Victim(), first);
  policy_->Touch(TierId::kHost, first);
  first->last_access_micros = 40;
  EXPECT_EQ(Victim()->key.block_id, "b");
}

TEST_F(KeyDiffPlacementTest, OnlyTheLeastRecentlyUsedSampleIsCompared) {
  Make(1.0f, 0.0f, 2);
  Add("d1", {0, 0, 1, 0}, 10);
  Entry* d2 = Add("d2", {0, 1, 0, 0}, 11);
  Add("r1", {1, 0, 0, 0}, 12);  // most redundant, but outside the sample
  Add("r2", {1, 0, 0, 0}, 13);
  Add("r3", {1, 0, 0, 0}, 14);
  Entry* v = Victim();
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(v->key.block_id == "d1" || v->key.block_id == "d2");
  // Touching moves a block out of the sample.
  policy_->Touch(TierId::kHost, entries_[0].get());
  policy_->Touch(TierId::kHost, d2);
  EXPECT_EQ(Victim()->key.block_id.substr(0, 1), "r");
}

TEST_F(KeyDiffPlacementTest, AgeBreaksTheTieBetweenEquallyRedundantBlocks) {
  Make(1.0f, 0.5f, 16);
  Add("new", {1, 0, 0, 0}, 100);
  Entry* old = Add("old", {1, 0, 0, 0}, 10);
  EXPECT_EQ(Victim(), old);
}

TEST_F(KeyDiffPlacementTest, RejectedCopiesAreSkipped) {
  Entry* aligned = Add("aligned", {1, 0, 0, 0}, 10);
  Entry* second = Add("second", {1, 0.2f, 0, 0}, 10);
  Add("distinct", {-1, 0, 0, 0}, 10);
  rejected_.insert(aligned);
  EXPECT_EQ(Victim(), second);
  rejected_.insert(second);
  EXPECT_EQ(Victim()->key.block_id, "distinct");
  rejected_.insert(entries_[2].get());
  EXPECT_EQ(Victim(), nullptr);
}

TEST_F(KeyDiffPlacementTest, BlocksWithoutSummaryCountAsHalfRedundant) {
  Entry* aligned1 = Add("aligned1", {1, 0, 0, 0}, 10);
  Add("aligned2", {1, 0, 0, 0}, 10);
  Entry* bare = Add("bare", {}, 10);
  Add("opposite", {-1, 0, 0, 0}, 10);
  // The profile mean points along e0: aligned blocks (redundancy 1) go
  // first, then the bare one (0.5), then the opposite one (0).
  EXPECT_EQ(Victim(), aligned1);
  rejected_.insert(entries_[0].get());
  rejected_.insert(entries_[1].get());
  EXPECT_EQ(Victim(), bare);
}

TEST_F(KeyDiffPlacementTest, EachProfileHasItsOwnMean) {
  for (int i = 0; i < 4; ++i) Add("p1-" + std::to_string(i), {1, 0, 0, 0}, 10, 1);
  for (int i = 0; i < 4; ++i) Add("p2-" + std::to_string(i), {0, 1, 0, 0}, 10, 2);
  // Like profile 1's mean, unlike profile 2's: not redundant in profile 2.
  Entry* p2_outlier = Add("p2-outlier", {1, 0, 0, 0}, 5, 2);
  Entry* v = Victim();
  ASSERT_NE(v, nullptr);
  EXPECT_NE(v, p2_outlier);
  EXPECT_EQ(v->key.profile_id, 1u);
}

TEST_F(KeyDiffPlacementTest, TiersAreIndependentAndRemoveForgets) {
  Entry* a = Add("a", {1, 0, 0, 0}, 10, 1, TierId::kDevice);
  policy_->Insert(TierId::kNvme, a);
  EXPECT_EQ(Victim(TierId::kHost), nullptr);
  EXPECT_EQ(Victim(TierId::kDevice), a);
  policy_->Remove(TierId::kDevice, a);
  EXPECT_EQ(Victim(TierId::kDevice), nullptr);
  EXPECT_EQ(Victim(TierId::kNvme), a);
  policy_->Remove(TierId::kNvme, a);
  EXPECT_EQ(Victim(TierId::kNvme), nullptr);
  policy_->Remove(TierId::kNvme, a);  // absent: no-op
}

// A burst of inserts into a full tier (blocks prefetched for one Select)
// does not make one of the tier's newest half the next victim, however
// redundant it is; when every older copy is rejected, the least recently
// used evictable copy goes, as under LRU.
TEST_F(KeyDiffPlacementTest, NewestCopiesAreNotSampled) {
  // Six older blocks, then six "prefetched" ones along the profile's mean.
  auto fill = [this] {
    entries_.clear();
    rejected_.clear();
    for (int i = 0; i < 4; ++i) Add("old-a" + std::to_string(i), {0, 1, 0, 0}, 10 + i);
    for (int i = 0; i < 2; ++i) Add("old-b" + std::to_string(i), {0, 0, 1, 0}, 20 + i);
    std::vector<Entry*> fresh;
    for (int i = 0; i < 6; ++i)
      fresh.push_back(Add("fresh" + std::to_string(i), {1, 0, 0, 0}, 100 + i));
    return fresh;
  };
  Make(1.0f, 0.0f, 16, /*newest_protected=*/0.0f);
  std::vector<Entry*> fresh = fill();
  ASSERT_NE(Victim(), nullptr);
  EXPECT_EQ(Victim()->key.block_id.substr(0, 5), "fresh") << "unprotected: the most redundant";

  Make(1.0f, 0.0f, 16, /*newest_protected=*/0.5f);
  fresh = fill();
  Entry* v = Victim();
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->key.block_id.substr(0, 5), "old-a") << "the newest half is never sampled";
  // Once a newer block arrives, fresh0 is no longer among the newest half.
  policy_->Remove(TierId::kHost, v);
  rejected_.insert(v);
  fresh.push_back(Add("fresh6", {1, 0, 0, 0}, 106));
  EXPECT_EQ(Victim(), fresh[0]);
  // Every older copy pinned: the least recently used evictable one.
  for (const auto& e : entries_) {
    if (e->key.block_id.substr(0, 3) == "old") rejected_.insert(e.get());
  }
  rejected_.insert(fresh[0]);
  EXPECT_EQ(Victim(), fresh[1]);
}

}  // namespace
}  // namespace kvtier::daemon
