// The order in which the placement policies (placement.h) give up copies:
// the policies alone on hand-made entries, then the stability policy
// inside a real BlockStore under put pressure.
#include "storage/store/placement.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"
#include "storage/store/block_store.h"
#include "storage/store/store_test_util.h"
#include "tests/testutil/status_matchers.h"

using ::kvtier::testing::StatusIs;

namespace kvtier {
namespace {

class PolicyTest : public ::testing::Test {
 protected:
  void Use(std::unique_ptr<PlacementPolicy> policy) {
    policy_ = std::move(policy);
    entries_.clear();
    now_ = 0;
  }

  Entry* Add(const std::string& name, std::vector<TierId> tiers = {TierId::kHost}) {
    auto e = std::make_unique<Entry>();
    e->key = BlockKey{"t", 1, name};
    Entry* raw = e.get();
    entries_.push_back(std::move(e));
    for (TierId t : tiers) policy_->Insert(t, raw);
    return raw;
  }

  void Want(Entry* e) { policy_->Want(e, ++now_); }

  // The whole order of a tier, by repeatedly taking the victim and
  // rejecting it afterwards.
  std::vector<std::string> Order(TierId tier = TierId::kHost) {
    absl::flat_hash_set<const Entry*> seen;
    std::vector<std::string> out;
    while (Entry* v = policy_->Victim(tier, [&](const Entry& e) {
      return !seen.contains(&e) && !rejected_.contains(&e);
    })) {
      seen.insert(v);
      out.push_back(v->key.block_id);
    }
    return out;
  }

  std::unique_ptr<PlacementPolicy> policy_;
  std::vector<std::unique_ptr<Entry>> entries_;
  absl::flat_hash_set<const Entry*> rejected_;
  uint64_t now_ = 0;
};

using Names = std::vector<std::string>;

TEST_F(PolicyTest, LruIgnoresWantsAndOrdersByUse) {
  Use(NewLruPolicy());
  EXPECT_FALSE(policy_->uses_wants());
  Entry* a = Add("a");
  Add("b");
  Entry* c = Add("c");
  Want(a);  // ignored: a stays the least recently used
  EXPECT_EQ(a->last_wanted_micros, 0u);
  EXPECT_EQ(Order(), (Names{"a", "b", "c"}));
  policy_->Touch(TierId::kHost, a);
  policy_->Insert(TierId::kHost, c);  // already there: a touch
  EXPECT_EQ(Order(), (Names{"b", "a", "c"}));
}

TEST_F(PolicyTest, StabilityDemotesWhatSelectHasNotWantedLatelyFirst) {
  Use(NewStabilityPolicy({}));
  EXPECT_TRUE(policy_->uses_wants());
  EXPECT_STREQ(policy_->name(), "stability");
  Entry* a = Add("a");
  Entry* b = Add("b");
  Entry* c = Add("c");
  Add("d");
  Want(c);
  Want(a);
  EXPECT_NE(a->last_wanted_micros, 0u);
  // b and d were never wanted and rank by their last use (arrival here);
  // c and a by their last want.
  EXPECT_EQ(Order(), (Names{"b", "d", "c", "a"}));
  Want(c);
  EXPECT_EQ(Order(), (Names{"b", "d", "a", "c"}));
  // A never-wanted block is LRU: a touch makes it the newest.
  policy_->Touch(TierId::kHost, b);
  EXPECT_EQ(Order(), (Names{"d", "a", "c", "b"}));
}

TEST_F(PolicyTest, StabilityIgnoresReadsOfWantedBlocks) {
  Use(NewStabilityPolicy({}));
  Entry* a = Add("a");
  Entry* b = Add("b");
  Want(a);
  Want(b);
  // Gets, identical puts and handle requests do not rescue a block that
  // Select stopped wanting; under LRU they would.
  policy_->Touch(TierId::kHost, a);
  policy_->Touch(TierId::kDevice, a);
  EXPECT_EQ(Order(), (Names{"a", "b"}));
}

TEST_F(PolicyTest, StabilityKeepsOneOrderAcrossTiers) {
  Use(NewStabilityPolicy({}));
  Entry* a = Add("a", {TierId::kDevice, TierId::kHost});
  Entry* b = Add("b", {TierId::kHost, TierId::kNvme});
  Entry* c = Add("c", {TierId::kDevice, TierId::kHost, TierId::kNvme});
  Want(a);
  EXPECT_EQ(Order(TierId::kDevice), (Names{"c", "a"}));
  EXPECT_EQ(Order(TierId::kHost), (Names{"b", "c", "a"}));
  EXPECT_EQ(Order(TierId::kNvme), (Names{"b", "c"}));
  // A copy arriving in a tier (a promotion) makes the block the newest in
  // every tier: b's NVMe copy moves too.
  policy_->Insert(TierId::kDevice, b);
  EXPECT_EQ(Order(TierId::kDevice), (Names{"c", "a", "b"}));
  EXPECT_EQ(Order(TierId::kNvme), (Names{"c", "b"}));
  policy_->Remove(TierId::kHost, c);
  EXPECT_EQ(Order(TierId::kHost), (Names{"a", "b"}));
  EXPECT_EQ(Order(TierId::kDevice), (Names{"c", "a", "b"}));
}

TEST_F(PolicyTest, StabilityWantOfANvmeOnlyBlockRanksItsPrefetchedCopy) {
  Use(NewStabilityPolicy({}));
  Entry* far = Add("far", {TierId::kNvme});
  Add("x");
  Add("y");
  Want(far);  // chosen while on NVMe only: PENDING, handed to the prefetcher
  policy_->Insert(TierId::kHost, far);  // the prefetch lands
  Add("z");
  EXPECT_EQ(Order(), (Names{"x", "y", "far", "z"}));
}

TEST_F(PolicyTest, StabilitySkipsWhatEvictableRejects) {
  Use(NewStabilityPolicy({}));
  Entry* a = Add("a");
  Entry* b = Add("b");
  rejected_.insert(a);  // pinned, busy, ...
  EXPECT_EQ(Order(), (Names{"b"}));
  rejected_.insert(b);
  EXPECT_EQ(policy_->Victim(TierId::kHost, [&](const Entry& e) { return !rejected_.contains(&e); }),
            nullptr);
  EXPECT_EQ(policy_->Victim(TierId::kDevice, [](const Entry&) { return true; }), nullptr);
}

TEST_F(PolicyTest, UnwantedFirstPutsEveryNeverWantedCopyFirst) {
  Use(NewStabilityPolicy({.unwanted_first = true}));
  Entry* a = Add("a", {TierId::kDevice, TierId::kHost});
  Entry* b = Add("b");
  Want(a);
  Want(b);
  Entry* fresh = Add("fresh", {TierId::kDevice, TierId::kHost});
  // fresh is the newest, but no Select wanted it yet: it goes first (the
  // default would demote a first).
  EXPECT_EQ(Order(), (Names{"fresh", "a", "b"}));
  EXPECT_EQ(Order(TierId::kDevice), (Names{"fresh", "a"}));
  // Never-wanted copies among themselves: LRU.
  Add("older-touched");
  Entry* last = Add("last");
  policy_->Touch(TierId::kHost, fresh);
  EXPECT_EQ(Order(), (Names{"older-touched", "last", "fresh", "a", "b"}));
  // The first want moves every copy into the wanted order, as the newest.
  Want(fresh);
  EXPECT_EQ(Order(), (Names{"older-touched", "last", "a", "b", "fresh"}));
  EXPECT_EQ(Order(TierId::kDevice), (Names{"a", "fresh"}));
  policy_->Remove(TierId::kHost, fresh);
  policy_->Remove(TierId::kHost, last);
  EXPECT_EQ(Order(), (Names{"older-touched", "a", "b"}));
}

TEST_F(PolicyTest, DefaultOrderRanksNeverWantedCopiesByTheirLastUse) {
  Use(NewStabilityPolicy({}));
  Entry* a = Add("a");
  Want(a);
  Add("fresh");  // just written: its Select has not run yet
  EXPECT_EQ(Order(), (Names{"a", "fresh"}));
}

// The policies inside a real store (RocksDB catalog, shared-memory host
// tier, NVMe files): host holds 8 blocks. Block 0 is the oldest put; a
// selection keeps wanting it while puts of other blocks push the tier.
// (Not parameterised: the fixture names its shm files after the test.)
class StorePlacementTest : public BlockStoreTest {
 protected:
  void UseStability() {
    options_.make_placement = [] { return NewStabilityPolicy({}); };
    Reopen();
  }

  void KeepWantingBlockZeroUnderPressure(bool stability) {
    const std::vector<BlockKey> wanted = {Key(0)};
    for (int i = 0; i < 8; ++i) ASSERT_OK(store_->Put(Key(i), Payload(i))) << i;
    int next = 8;
    for (int round = 0; round < 6; ++round) {
      env_->AdvanceMicros(1000);
      store_->MarkWanted(wanted);
      store_->MarkWanted({});  // nothing to do
      for (int k = 0; k < 4; ++k, ++next) {
        ASSERT_OK(store_->Put(Key(next), Payload(next))) << next;
        ExpectWithinCapacity();
      }
      const BlockLocation w = store_->Lookup(Key(0));
      ASSERT_TRUE(w.present);
      // LRU ignores wants: the oldest put goes first.
      EXPECT_EQ(w.tier, stability ? TierId::kHost : TierId::kNvme) << "round " << round;
    }
    // 32 blocks for 8 host slots: every other early block was demoted.
    for (int i = 1; i < 8; ++i) EXPECT_EQ(store_->Lookup(Key(i)).tier, TierId::kNvme) << i;
    for (int i = next - 4; i < next; ++i) {
      EXPECT_EQ(store_->Lookup(Key(i)).tier, TierId::kHost) << i;
    }
    ExpectReadable(0);
    // Unknown keys are skipped.
    store_->MarkWanted({Key(999)});
    EXPECT_FALSE(store_->Lookup(Key(999)).present);
  }
};

TEST_F(StorePlacementTest, ABlockSelectKeepsWantingSurvivesPutPressure) {
  UseStability();
  KeepWantingBlockZeroUnderPressure(/*stability=*/true);
}

// The daemon's Select path tells the policy through AcquireHandles
// (mark_wanted: one lookup per key for both). With unwanted_first, a block
// wanted once outlives every later put that no Select wanted, though it is
// the least recently used; without the want it would be the first victim.
TEST_F(StorePlacementTest, AcquireHandlesCanMarkWhatItPinsWanted) {
  for (bool mark : {true, false}) {
    SCOPED_TRACE(mark ? "mark_wanted" : "no mark");
    options_.make_placement = [] { return NewStabilityPolicy({.unwanted_first = true}); };
    Reopen();
    for (int i = 0; i < 8; ++i) ASSERT_OK(store_->Put(Key(i), Payload(i))) << i;
    std::vector<absl::StatusOr<DeviceHandle>> handles;
    absl::StatusOr<uint64_t> lease = store_->AcquireHandles(
        Key(0).tenant, {Key(0), Key(999)}, 0, &handles, {.memory_only = true, .mark_wanted = mark});
    ASSERT_OK(lease) << lease.status();
    ASSERT_EQ(handles.size(), 2u);
    EXPECT_OK(handles[0]) << handles[0].status();
    EXPECT_THAT(handles[1].status(), StatusIs(absl::StatusCode::kNotFound));
    ASSERT_OK(store_->Release(Key(0).tenant, *lease));
    ASSERT_OK(store_->Evict(Key(0), TierId::kDevice));  // its host copy is what counts
    for (int i = 8; i < 24; ++i) {
      env_->AdvanceMicros(1000);
      ASSERT_OK(store_->Put(Key(i), Payload(i))) << i;
      ExpectWithinCapacity();
    }
    EXPECT_EQ(store_->Lookup(Key(0)).tier, mark ? TierId::kHost : TierId::kNvme);
    ExpectReadable(0);
    for (int i = 0; i < 24; ++i) ASSERT_OK(store_->Delete(Key(i))) << i;
  }
}

TEST_F(StorePlacementTest, UnderLruTheSameBlockIsDemotedFirst) {
  KeepWantingBlockZeroUnderPressure(/*stability=*/false);
}

}  // namespace
}  // namespace kvtier
