// Cache semantics of the BlockStore: the last local tier evicts, retained,
// pinned and in-use blocks never go, quotas evict the tenant's own blocks,
// and nothing evicted is ever served or resurrected by a restart.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/store/block_store.h"
#include "storage/store/store_test_util.h"
#include "tests/testutil/status_matchers.h"

using ::kvtier::testing::StatusIs;

namespace kvtier {
namespace {

using ::testing::HasSubstr;

// Present blocks read back exactly; absent ones are NOT_FOUND. Returns how
// many are present.
int CheckEveryBlock(BlockStore& store, const std::function<BlockKey(uint64_t)>& key, int n) {
  int present = 0;
  for (int i = 0; i < n; ++i) {
    std::string out;
    TierId from;
    absl::Status st = store.Get(key(i), &out, &from);
    if (st.code() == absl::StatusCode::kNotFound) {
      EXPECT_FALSE(store.Lookup(key(i)).present) << i;
      continue;
    }
    EXPECT_OK(st) << i << ": " << st;
    std::vector<uint8_t> want = Payload(i);
    EXPECT_EQ(out.size(), want.size());
    EXPECT_EQ(std::memcmp(out.data(), want.data(), want.size()), 0) << "block " << i;
    ++present;
  }
  return present;
}

TEST_F(BlockStoreTest, FullCacheEvictsLeastRecentlyUsedAndNeverRefuses) {
  // host 8 + NVMe 64 blocks: 72 fit; 200 puts all succeed.
  const int n = 200;
  for (int i = 0; i < n; ++i) {
    auto outcome = store_->Put(Key(i), Payload(i));
    ASSERT_OK(outcome) << i << ": " << outcome.status();
    ExpectWithinCapacity();
  }
  BlockStoreStats stats = store_->Stats();
  EXPECT_GE(stats.evicted_blocks, static_cast<uint64_t>(n - 72));
  EXPECT_EQ(stats.blocks, static_cast<uint64_t>(n) - stats.evicted_blocks);
  // The most recent blocks are the ones kept.
  int present = 0;
  for (int i = 0; i < n; ++i) present += store_->Lookup(Key(i)).present;
  EXPECT_EQ(present, static_cast<int>(stats.blocks));
  for (int i = n - 40; i < n; ++i) EXPECT_TRUE(store_->Lookup(Key(i)).present) << i;
  EXPECT_FALSE(store_->Lookup(Key(0)).present);
  // Reading promotes NVMe blocks to host, which may evict others: every
  // read is exact or a miss, never other bytes.
  EXPECT_GT(CheckEveryBlock(
                *store_, [&](uint64_t i) { return Key(i); }, n),
            40);
}

TEST_F(BlockStoreTest, DurableBlocksSurviveUntilEvictedAndEvictionIsDurable) {
  const int n = 150;
  for (int i = 0; i < n; ++i) {
    auto outcome = store_->Put(Key(i), Payload(i), {.durable = true});
    ASSERT_OK(outcome) << i << ": " << outcome.status();
    EXPECT_TRUE(outcome->durable);
  }
  const uint64_t evicted = store_->Stats().evicted_blocks;
  EXPECT_GE(evicted, static_cast<uint64_t>(n - 72));
  const int before = CheckEveryBlock(
      *store_, [&](uint64_t i) { return Key(i); }, n);
  // After a restart only NVMe copies come back: every durable block that was
  // not evicted, and no evicted one (its record went before its extent).
  Reopen();
  BlockStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.quarantined_blocks, 0u) << "a record pointed at reused space";
  EXPECT_EQ(stats.blocks, stats.tiers[2].blocks);
  EXPECT_LE(stats.blocks, static_cast<uint64_t>(before));
  EXPECT_GE(stats.blocks, 60u);
  EXPECT_GE(CheckEveryBlock(
                *store_, [&](uint64_t i) { return Key(i); }, n),
            50);
}

TEST_F(BlockStoreTest, RetainedBlocksAreNeverEvicted) {
  for (int i = 0; i < 10; ++i) {
    auto outcome = store_->Put(Key(i), Payload(i), {.durable = true, .retain = true});
    ASSERT_OK(outcome) << outcome.status();
    EXPECT_TRUE(outcome->retained);
  }
  for (int i = 10; i < 300; ++i) {
    ASSERT_OK(store_->Put(Key(i), Payload(i), {.durable = i % 2 == 0}));
  }
  EXPECT_GT(store_->Stats().evicted_blocks, 0u);
  for (int i = 0; i < 10; ++i) {
    EXPECT_TRUE(store_->Lookup(Key(i)).retained) << i;
    ExpectReadable(i);
  }
  EXPECT_EQ(store_->Stats().retained_bytes, 10 * kBlockBytes);
  Reopen();  // the mark is persisted with the record
  for (int i = 0; i < 10; ++i) {
    EXPECT_TRUE(store_->Lookup(Key(i)).retained) << i;
    ExpectReadable(i);
  }
  EXPECT_EQ(store_->UsageOf("default").retained_bytes, 10 * kBlockBytes);
}

TEST_F(BlockStoreTest, RePutWithRetainMarksAStoredBlock) {
  ASSERT_OK(store_->Put(Key(1), Payload(1), {.durable = true}));
  EXPECT_FALSE(store_->Lookup(Key(1)).retained);
  auto again = store_->Put(Key(1), Payload(1), {.durable = true, .retain = true});
  ASSERT_OK(again) << again.status();
  EXPECT_TRUE(again->existed);
  EXPECT_TRUE(again->retained);
  auto plain = store_->Put(Key(1), Payload(1), {.durable = true});  // never clears the mark
  ASSERT_OK(plain);
  EXPECT_TRUE(plain->retained);
  Reopen();
  EXPECT_TRUE(store_->Lookup(Key(1)).retained);
  ASSERT_OK(store_->Delete(Key(1)));
  EXPECT_EQ(store_->Stats().retained_bytes, 0u);
}

TEST_F(BlockStoreTest, RetainedBytesQuotaNamesItself) {
  TenantLimits limits;
  limits.retained_bytes = 3 * kBlockBytes;
  store_->SetTenantLimits("default", limits);
  for (int i = 0; i < 3; ++i) ASSERT_OK(store_->Put(Key(i), Payload(i), {.retain = true}));
  auto refused = store_->Put(Key(3), Payload(3), {.retain = true});
  ASSERT_THAT(refused.status(), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(refused.status().message(), HasSubstr("retained_bytes"));
  EXPECT_FALSE(store_->Lookup(Key(3)).present);
  EXPECT_OK(store_->Put(Key(3), Payload(3))) << "without retain it is a cache put";
  auto upgrade = store_->Put(Key(3), Payload(3), {.retain = true});
  EXPECT_THAT(upgrade.status(), StatusIs(absl::StatusCode::kResourceExhausted));
  ASSERT_OK(store_->Delete(Key(0)));
  EXPECT_OK(store_->Put(Key(3), Payload(3), {.retain = true}));
  EXPECT_EQ(store_->UsageOf("default").retained_bytes, 3 * kBlockBytes);
}

TEST_F(BlockStoreTest, NvmeQuotaEvictsTheTenantsOwnBlocksOnly) {
  TenantLimits limits;
  limits.nvme_bytes = 4 * kBlockBytes;
  store_->SetTenantLimits("small", limits);
  const uint64_t small_profile = ProfileOf("small");
  auto small_key = [&](uint64_t i) { return BlockKey{"small", small_profile, Id(i)}; };
  for (int i = 0; i < 5; ++i) ASSERT_OK(store_->Put(Key(i), Payload(i), {.durable = true}));
  for (int i = 0; i < 12; ++i) {
    auto outcome = store_->Put(small_key(i), Payload(i), {.durable = true});
    ASSERT_OK(outcome) << i << ": " << outcome.status();
    EXPECT_LE(store_->UsageOf("small").nvme_bytes, 4 * kBlockBytes);
  }
  for (int i = 0; i < 5; ++i) ExpectReadable(i);  // the other tenant's blocks stay
  int durable = 0;
  for (int i = 0; i < 12; ++i) durable += store_->Lookup(small_key(i)).durable;
  EXPECT_GE(durable, 3);
  EXPECT_LE(durable, 4);
  // Retained blocks of the tenant fill its quota: then it is refused.
  limits.retained_bytes = 0;
  store_->SetTenantLimits("small", limits);
  for (int i = 8; i < 12; ++i) {
    ASSERT_OK(store_->Put(small_key(i), Payload(i), {.durable = true, .retain = true})) << i;
  }
  auto refused = store_->Put(small_key(20), Payload(20), {.durable = true});
  ASSERT_THAT(refused.status(), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(refused.status().message(), HasSubstr("nvme_bytes"));
  EXPECT_THAT(refused.status().message(), HasSubstr("retained"));
}

// Writers of one tenant in parallel (a PutBlocks message's blocks are
// stored on several threads): the quota counts copies still being written,
// so together they never take the tenant past its host or NVMe bytes.
TEST_F(BlockStoreTest, ConcurrentPutsOfOneTenantStayWithinItsQuotas) {
  TenantLimits limits;
  limits.host_bytes = 3 * kBlockBytes;
  limits.nvme_bytes = 3 * kBlockBytes;
  store_->SetTenantLimits("small", limits);
  const uint64_t small_profile = ProfileOf("small");
  std::atomic<int> over{0}, stored{0};
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; i < 12; ++i) {
        const uint64_t n = 1000 + t * 100 + i;
        auto outcome = store_->Put(BlockKey{"small", small_profile, Id(n)}, Payload(n),
                                   {.durable = i % 2 == 0});
        if (outcome.ok()) ++stored;
        const TenantUsage u = store_->UsageOf("small");
        if (u.host_bytes > limits.host_bytes || u.nvme_bytes > limits.nvme_bytes) ++over;
      }
    });
  }
  for (std::thread& w : writers) w.join();
  EXPECT_EQ(over.load(), 0);
  EXPECT_GT(stored.load(), 0);
  const TenantUsage u = store_->UsageOf("small");
  EXPECT_LE(u.host_bytes, limits.host_bytes);
  EXPECT_LE(u.nvme_bytes, limits.nvme_bytes);
}

// The read, promotion and demotion counters the metrics endpoint exports.
TEST_F(BlockStoreTest, ReadsPromotionsAndDemotionsAreCounted) {
  ASSERT_OK(store_->Put(Key(0), Payload(0)));
  std::string out;
  TierId from;
  ASSERT_OK(store_->Get(Key(0), &out, &from));           // from host
  EXPECT_FALSE(store_->Get(Key(99), &out, &from).ok());  // a miss
  std::vector<absl::StatusOr<DeviceHandle>> handles;
  auto lease = store_->AcquireHandles("default", {Key(0)}, 0, &handles);  // host -> device
  ASSERT_OK(lease) << lease.status();
  handles.clear();
  auto again = store_->AcquireHandles("default", {Key(0)}, 0, &handles);  // device hit
  ASSERT_OK(again) << again.status();
  BlockStoreStats s = store_->Stats();
  EXPECT_EQ(s.reads_from[static_cast<int>(TierId::kHost)], 2u);
  EXPECT_EQ(s.reads_from[static_cast<int>(TierId::kDevice)], 1u);
  EXPECT_EQ(s.read_misses, 1u);
  EXPECT_EQ(s.promotions[static_cast<int>(TierId::kDevice)], 1u);
  EXPECT_EQ(s.demotions, 0u);
  // Twice the host tier: the oldest last copies move to NVMe.
  const uint64_t host_slots = options_.host_capacity_bytes / kBlockBytes;
  for (uint64_t n = 1; n <= 2 * host_slots; ++n) {
    ASSERT_OK(store_->Put(Key(n), Payload(n))) << n;
  }
  s = store_->Stats();
  EXPECT_GE(s.demotions, host_slots - 1);
  // A read of a demoted block is an NVMe read that promotes it to host.
  ASSERT_EQ(store_->Lookup(Key(1)).tier, TierId::kNvme);
  ASSERT_OK(store_->Get(Key(1), &out, &from));
  const BlockStoreStats after = store_->Stats();
  EXPECT_EQ(after.reads_from[static_cast<int>(TierId::kNvme)], 1u);
  EXPECT_EQ(after.promotions[static_cast<int>(TierId::kHost)], 1u);
  ExpectReadable(1);
}

TEST_F(BlockStoreTest, PinnedBlocksAreNotEvicted) {
  for (int i = 0; i < 2; ++i) ASSERT_OK(store_->Put(Key(i), Payload(i)));
  std::vector<absl::StatusOr<DeviceHandle>> handles;
  auto lease = store_->AcquireHandles("default", {Key(0), Key(1)}, 5000, &handles);
  ASSERT_OK(lease) << lease.status();
  for (int i = 2; i < 200; ++i) ASSERT_OK(store_->Put(Key(i), Payload(i))) << i;
  EXPECT_GT(store_->Stats().evicted_blocks, 0u);
  ExpectReadable(0);
  ExpectReadable(1);
  EXPECT_TRUE(store_->Lookup(Key(0)).pinned);
}

TEST_F(BlockStoreTest, MemoryOnlyHandlesNeverReadNvmeAndPrefetchBringsBlocksBack) {
  for (int i = 0; i < 20; ++i) ASSERT_OK(store_->Put(Key(i), Payload(i))) << i;
  ASSERT_EQ(store_->Lookup(Key(0)).tier, TierId::kNvme);  // demoted by the later puts
  std::vector<absl::StatusOr<DeviceHandle>> handles;
  auto lease =
      store_->AcquireHandles("default", {Key(0), Key(19)}, 1000, &handles, {.memory_only = true});
  ASSERT_OK(lease) << lease.status();
  ASSERT_EQ(handles.size(), 2u);
  EXPECT_THAT(handles[0].status(), StatusIs(absl::StatusCode::kUnavailable)) << handles[0].status();
  EXPECT_OK(handles[1]) << handles[1].status();
  EXPECT_EQ(store_->Lookup(Key(0)).tier, TierId::kNvme) << "not read";
  ASSERT_OK(store_->Release("default", *lease));
  EXPECT_EQ(store_->Prefetch({Key(0)}), 1u);
  EXPECT_EQ(store_->Lookup(Key(0)).tier, TierId::kHost);
  lease = store_->AcquireHandles("default", {Key(0)}, 1000, &handles, {.memory_only = true});
  ASSERT_OK(lease) << lease.status();
  EXPECT_OK(handles[0]) << handles[0].status();
}

// The Select path (memory_only) makes device room from last copies too,
// by moving them to host memory, but never writes NVMe for it: when host
// memory holds only last copies, the pin fails instead and nothing moves.
TEST_F(BlockStoreTest, MemoryOnlyHandlesMoveLastDeviceCopiesToHostMemoryOnly) {
  // Device holds 4 blocks, host 8. Blocks 0-3 end up with their only copy
  // in the arena.
  for (int i = 0; i < 6; ++i) ASSERT_OK(store_->Put(Key(i), Payload(i))) << i;
  std::vector<absl::StatusOr<DeviceHandle>> handles;
  auto lease = store_->AcquireHandles("default", {Key(0), Key(1), Key(2), Key(3)}, 0, &handles,
                                      {.memory_only = true});
  ASSERT_OK(lease) << lease.status();
  for (const auto& h : handles) ASSERT_OK(h) << h.status();
  ASSERT_OK(store_->Release("default", *lease));
  for (int i = 0; i < 4; ++i) ASSERT_OK(store_->Evict(Key(i), TierId::kHost)) << i;
  for (int i = 0; i < 4; ++i) ASSERT_EQ(store_->Lookup(Key(i)).tier, TierId::kDevice) << i;

  // Host memory has room: one last copy moves there, block 4 is pinned.
  const uint64_t nvme_used = store_->Stats().tiers[2].used_bytes;
  lease = store_->AcquireHandles("default", {Key(4)}, 0, &handles, {.memory_only = true});
  ASSERT_OK(lease) << lease.status();
  ASSERT_OK(handles[0]) << handles[0].status();
  int moved = 0;
  for (int i = 0; i < 4; ++i) moved += store_->Lookup(Key(i)).tier == TierId::kHost;
  EXPECT_EQ(moved, 1);
  EXPECT_EQ(store_->Stats().tiers[2].used_bytes, nvme_used) << "nothing written to NVMe";
  EXPECT_EQ(store_->Stats().demotions, 0u);
  ASSERT_OK(store_->Release("default", *lease));

  // Pin 4 device blocks' worth again, then fill host memory with last
  // copies (these puts may demote to NVMe: they are not the Select path).
  lease = store_->AcquireHandles("default", {Key(4)}, 0, &handles, {.memory_only = true});
  ASSERT_OK(lease);
  for (int i = 6; i < 20; ++i) ASSERT_OK(store_->Put(Key(i), Payload(i))) << i;
  ExpectWithinCapacity();
  std::vector<BlockKey> host_only;
  for (int i = 0; i < 20; ++i) {
    const BlockLocation loc = store_->Lookup(Key(i));
    if (loc.present && loc.tier == TierId::kHost) host_only.push_back(Key(i));
  }
  ASSERT_FALSE(host_only.empty());
  const BlockStoreStats before = store_->Stats();
  std::vector<absl::StatusOr<DeviceHandle>> more;
  auto second = store_->AcquireHandles("default", host_only, 0, &more, {.memory_only = true});
  ASSERT_OK(second) << second.status();
  const BlockStoreStats after = store_->Stats();
  EXPECT_EQ(after.tiers[2].used_bytes, before.tiers[2].used_bytes) << "nothing written to NVMe";
  EXPECT_EQ(after.demotions, before.demotions);
  size_t refused = 0;
  for (const auto& h : more) {
    if (!h.ok()) {
      EXPECT_THAT(h.status(), StatusIs(absl::StatusCode::kResourceExhausted)) << h.status();
      ++refused;
    }
  }
  EXPECT_GT(refused, 0u) << "host memory full of last copies: some pins must fail";
  ExpectWithinCapacity();
  for (int i = 0; i < 20; ++i) ExpectReadable(i);
}

TEST_F(BlockStoreTest, EvictGivesUpOneTierAsTheCacheWould) {
  ASSERT_OK(store_->Put(Key(0), Payload(0)));
  ASSERT_OK(store_->Put(Key(1), Payload(1), {.retain = true}));
  EXPECT_THAT(store_->Evict(Key(0), TierId::kDevice), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_->Evict(Key(9), TierId::kNvme), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_->Evict(Key(0), TierId::kRemote), StatusIs(absl::StatusCode::kInvalidArgument));

  std::vector<absl::StatusOr<DeviceHandle>> handles;
  auto lease = store_->AcquireHandles("default", {Key(0)}, 0, &handles);
  ASSERT_OK(lease) << lease.status();
  ASSERT_OK(handles[0]);
  EXPECT_THAT(store_->Evict(Key(0), TierId::kDevice),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_OK(store_->Release("default", *lease));
  ASSERT_OK(store_->Evict(Key(0), TierId::kDevice));
  EXPECT_EQ(store_->Lookup(Key(0)).tier, TierId::kHost);

  // The host copy is the last one: it is written to NVMe first (durable).
  ASSERT_OK(store_->Evict(Key(0), TierId::kHost));
  BlockLocation loc = store_->Lookup(Key(0));
  EXPECT_EQ(loc.tier, TierId::kNvme);
  EXPECT_TRUE(loc.durable);
  ExpectReadable(0);

  // nvme: the block leaves the store; a retained one stays.
  const uint64_t evicted = store_->Stats().evicted_blocks;
  ASSERT_OK(store_->Evict(Key(0), TierId::kNvme));
  EXPECT_FALSE(store_->Lookup(Key(0)).present);
  EXPECT_EQ(store_->Stats().evicted_blocks, evicted + 1);
  EXPECT_THAT(store_->Evict(Key(1), TierId::kNvme),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  ExpectReadable(1);
  // A device copy that is a block's only copy goes to the host tier first.
  lease = store_->AcquireHandles("default", {Key(1)}, 0, &handles);
  ASSERT_OK(lease);
  ASSERT_OK(store_->Release("default", *lease));
  ASSERT_OK(store_->Evict(Key(1), TierId::kHost));  // the device copy remains
  ASSERT_OK(store_->Evict(Key(1), TierId::kDevice));
  ExpectReadable(1);

  const std::vector<ModelProfile> profiles = store_->ListProfiles();
  ASSERT_EQ(profiles.size(), 1u);
  EXPECT_EQ(profiles[0].profile_id, profile_id_);
  EXPECT_EQ(profiles[0].name, SmallProfile().name);
}

}  // namespace
}  // namespace kvtier
