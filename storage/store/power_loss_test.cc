// Simulated power loss of the whole BlockStore: NVMe block files and the
// RocksDB catalog both go through one FaultInjectionEnv (the catalog through
// FaultFileSystem). A cycle runs a seeded load of puts, deletes and gets,
// leaves durable puts in flight (written, never synced), destroys the store
// (RocksDB closes cleanly but leaves unsynced data unsynced), drops every
// unsynced byte, reopens and checks an oracle:
//   * every acknowledged durable block that was not deleted reads back
//     bit-exact;
//   * every deleted block, and every put that failed, is NOT_FOUND;
//   * a non-durable block is gone or bit-exact, never other bytes;
//   * Stats agree with ForEachBlock, and NVMe space is exactly the blocks'
//     (no orphan extents).
#include <unistd.h>

#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gpu/cpu/shm_device_ops.h"
#include "gtest/gtest.h"
#include "storage/catalog/fault_file_system.h"
#include "storage/env/fault_injection_env.h"
#include "storage/env/test_util.h"
#include "storage/store/block_store.h"
#include "storage/store/store_test_util.h"
#include "tests/testutil/status_matchers.h"

using ::kvtier::testing::StatusIs;

namespace kvtier {
namespace {

// SmallProfile() and kBlockBytes (16 KiB blocks): store_test_util.h.
constexpr uint32_t kNvmeBlocks = 64;  // 2 files x 32 blocks
// Live blocks stay below NVMe capacity, so nothing is evicted and every
// durable block must survive.
constexpr size_t kMaxLiveBlocks = 40;

enum class State {
  kDurable,   // acknowledged durable: must read back bit-exact
  kVolatile,  // acknowledged, not durable: gone or bit-exact
  kGone,      // deleted or never acknowledged: NOT_FOUND
  // A durable put failed at its catalog write, which may still have
  // reached the WAL: after a restart gone or bit-exact.
  kUncertain,
};
struct Expected {
  State state = State::kGone;
  std::string bytes;
};

class PowerLossTest : public ::testing::Test {
 protected:
  void SetUp() override {
    shm_prefix_ = "/dev/shm/kvtier-plt-" + std::to_string(::getpid()) + "-" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name();
    gpu::GpuStatus created = gpu::ShmDeviceOps::Create(shm_prefix_ + "-arena", 8 * kBlockBytes,
                                                       gpu::ShmDeviceOpsOptions(), &device_ops_);
    ASSERT_OK(created) << created.ToString();
    options_ =
        SmallStoreOptions(dir_.path(), shm_prefix_, &faults_, device_ops_.get(), kNvmeBlocks);
    options_.catalog_env = catalog_env_.get();
    Open();
  }
  void TearDown() override { store_.reset(); }

  void Open() {
    auto store = BlockStore::Open(options_);
    ASSERT_OK(store) << store.status();
    store_ = std::move(*store);
    auto profile = store_->RegisterProfile(SmallProfile(), "default");
    ASSERT_OK(profile) << profile.status();
    profile_id_ = profile->profile.profile_id;
  }
  // The store goes away without Drain; then every unsynced byte of both
  // tiers is lost.
  void PowerLossAndReopen() {
    store_.reset();
    ASSERT_OK(faults_.DropUnsyncedData());
    Open();
  }

  BlockKey Key(const std::string& id) const { return BlockKey{"default", profile_id_, id}; }
  static std::string RandomBytes(std::mt19937_64& rng) {
    std::string data(kBlockBytes, '\0');
    for (size_t i = 0; i < data.size(); i += 8) {
      const uint64_t v = rng();
      std::memcpy(&data[i], &v, 8);
    }
    return data;
  }
  size_t LiveBlocks() const {
    size_t live = 0;
    for (const auto& [id, e] : oracle_) live += e.state != State::kGone;
    return live;
  }

  // Puts a fresh block; records what the store acknowledged.
  absl::Status PutFresh(std::mt19937_64& rng, bool durable) {
    const std::string id = "b" + std::to_string(next_id_++);
    Expected& e = oracle_[id];
    e.bytes = RandomBytes(rng);
    auto outcome = store_->Put(
        Key(id), absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(e.bytes.data()), kBlockBytes),
        {.durable = durable});
    if (!outcome.ok()) {
      EXPECT_FALSE(store_->Lookup(Key(id)).present) << id << ": a failed put keeps nothing";
      if (durable && absl::StrContains(outcome.status().message(), "/catalog")) {
        e.state = State::kUncertain;
      }
      return outcome.status();
    }
    EXPECT_EQ(outcome->durable, durable) << id;
    e.state = outcome->durable ? State::kDurable : State::kVolatile;
    return absl::OkStatus();
  }
  absl::Status Delete(const std::string& id) {
    absl::Status st = store_->Delete(Key(id));
    if (st.ok()) {
      oracle_[id].state = State::kGone;
    } else {
      EXPECT_TRUE(store_->Lookup(Key(id)).present)
          << id << ": a failed delete keeps the block: " << st;
    }
    return st;
  }
  absl::Status DeleteRandom(std::mt19937_64& rng) {
    std::vector<std::string> live;
    for (const auto& [id, e] : oracle_) {
      if (e.state == State::kDurable || e.state == State::kVolatile) live.push_back(id);
    }
    if (live.empty()) return absl::OkStatus();
    return Delete(live[rng() % live.size()]);
  }

  // Power is lost while durable puts are in flight: their NVMe bytes are
  // written but their sync never completes, so the puts fail and the drop
  // has unsynced data to undo.
  void InFlightPutsAtPowerLoss(uint64_t seed) {
    std::mt19937_64 rng(seed);
    faults_.SetSyncErrorOneIn(1);
    for (int i = 0; i < 2; ++i) EXPECT_FALSE(PutFresh(rng, /*durable=*/true).ok());
    faults_.SetSyncErrorOneIn(0);
    EXPECT_GT(faults_.unsynced_write_count(), 0u);
  }

  enum class Phase { kRunning, kRunningWithFaults, kAfterRestart };
  // A seeded mix of fresh puts (half durable), deletes and reads.
  void RunLoad(uint64_t seed, int ops, Phase phase) {
    std::mt19937_64 rng(seed);
    for (int i = 0; i < ops; ++i) {
      const uint64_t r = rng() % 10;
      absl::Status st;
      if (r < 6 && LiveBlocks() < kMaxLiveBlocks) {
        st = PutFresh(rng, rng() % 2 == 0);
      } else if (r < 8 || LiveBlocks() >= kMaxLiveBlocks) {
        st = DeleteRandom(rng);
      } else {
        ExpectAllReadable(phase);
      }
      if (phase == Phase::kRunningWithFaults) {
        // Every error names the file whose I/O failed.
        const std::string message(st.message());
        EXPECT_TRUE(st.ok() || message.find("/nvme/nvme-") != std::string::npos ||
                    message.find("/catalog") != std::string::npos)
            << st;
      } else {
        ASSERT_OK(st) << "op " << i << ": " << st;
      }
    }
  }

  // Reads every block of the oracle. Deleted and failed blocks are always
  // NOT_FOUND. While faults are injected a read may fail (making room in
  // the host tier writes), but never returns other bytes. After a restart
  // a non-durable block is gone or bit-exact (then durable: it was demoted
  // to NVMe before the power loss).
  void ExpectAllReadable(Phase phase) {
    for (auto& [id, e] : oracle_) {
      std::string out;
      TierId from;
      absl::Status st = store_->Get(Key(id), &out, &from);
      if (e.state == State::kGone) {
        EXPECT_THAT(st, StatusIs(absl::StatusCode::kNotFound)) << id << ": " << st;
        continue;
      }
      if (e.state == State::kUncertain && phase != Phase::kAfterRestart) {
        EXPECT_THAT(st, StatusIs(absl::StatusCode::kNotFound)) << id << ": failed put: " << st;
        continue;
      }
      if (phase == Phase::kAfterRestart &&
          (e.state == State::kVolatile || e.state == State::kUncertain) && absl::IsNotFound(st)) {
        e.state = State::kGone;
        continue;
      }
      if (phase == Phase::kRunningWithFaults && !st.ok()) continue;
      ASSERT_OK(st) << id << ": " << st;
      ASSERT_EQ(out.size(), kBlockBytes) << id;
      EXPECT_TRUE(out == e.bytes) << id << " came back with other bytes";
      if (phase == Phase::kAfterRestart) e.state = State::kDurable;
    }
  }

  // ForEachBlock against the oracle, Stats against ForEachBlock; every used
  // byte of the host and NVMe tiers belongs to a copy there.
  void ExpectStatsReconcile() {
    std::map<std::string, BlockLocation> listed;
    store_->ForEachBlock(
        0, [&](const BlockKey& key, const BlockLocation& loc) { listed[key.block_id] = loc; });
    size_t durable = 0;
    for (const auto& [id, loc] : listed) {
      durable += loc.durable;
      auto it = oracle_.find(id);
      EXPECT_TRUE(it != oracle_.end() && it->second.state != State::kGone)
          << id << " is listed but was deleted or never acknowledged";
    }
    for (const auto& [id, e] : oracle_) {
      if (e.state == State::kDurable) {
        EXPECT_TRUE(listed.contains(id)) << id << " is missing";
      }
    }
    const BlockStoreStats stats = store_->Stats();
    EXPECT_EQ(stats.blocks, listed.size());
    EXPECT_EQ(stats.quarantined_blocks, 0u);
    const TierUsage& host = stats.tiers[static_cast<int>(TierId::kHost)];
    const TierUsage& nvme = stats.tiers[static_cast<int>(TierId::kNvme)];
    EXPECT_EQ(nvme.blocks, durable) << "a block has an NVMe copy iff it is durable";
    EXPECT_EQ(nvme.used_bytes, nvme.blocks * kBlockBytes) << "orphan NVMe space";
    EXPECT_EQ(host.used_bytes, host.blocks * kBlockBytes) << "orphan host space";
  }

  testing::ScopedTempDir dir_;
  FaultInjectionEnv faults_{Env::Default(), /*seed=*/2024};
  std::unique_ptr<rocksdb::Env> catalog_env_ = NewFaultCatalogEnv(&faults_);
  std::string shm_prefix_;
  std::unique_ptr<gpu::ShmDeviceOps> device_ops_;
  BlockStoreOptions options_;
  std::unique_ptr<BlockStore> store_;
  uint64_t profile_id_ = 0;
  std::map<std::string, Expected> oracle_;  // by block id
  uint64_t next_id_ = 0;
};

TEST_F(PowerLossTest, TwentyCyclesKeepEveryAcknowledgedDurableBlock) {
  for (uint64_t cycle = 1; cycle <= 20; ++cycle) {
    SCOPED_TRACE(::testing::Message() << "cycle " << cycle);
    RunLoad(/*seed=*/cycle, /*ops=*/25, Phase::kRunning);
    ExpectStatsReconcile();
    InFlightPutsAtPowerLoss(/*seed=*/1000 + cycle);
    PowerLossAndReopen();
    ExpectStatsReconcile();
    ExpectAllReadable(Phase::kAfterRestart);
    if (HasFatalFailure()) return;
  }
  size_t durable = 0;
  for (const auto& [id, e] : oracle_) durable += e.state == State::kDurable;
  EXPECT_GT(durable, 10u) << "the cycles kept durable blocks to check";
}

TEST_F(PowerLossTest, WriteErrorsOnBothTiersFailPutsCleanly) {
  RunLoad(/*seed=*/100, /*ops=*/15, Phase::kRunning);
  faults_.SetWriteErrorOneIn(20);
  RunLoad(/*seed=*/101, /*ops=*/80, Phase::kRunningWithFaults);
  EXPECT_GT(faults_.injected_error_count(), 0u);
  faults_.SetWriteErrorOneIn(0);
  PowerLossAndReopen();
  ExpectStatsReconcile();
  ExpectAllReadable(Phase::kAfterRestart);
  RunLoad(/*seed=*/102, /*ops=*/10, Phase::kRunning);  // writable again
}

TEST_F(PowerLossTest, SyncErrorsOnBothTiersFailPutsCleanly) {
  RunLoad(/*seed=*/200, /*ops=*/15, Phase::kRunning);
  faults_.SetSyncErrorOneIn(10);
  RunLoad(/*seed=*/201, /*ops=*/60, Phase::kRunningWithFaults);
  EXPECT_GT(faults_.injected_error_count(), 0u);
  faults_.SetSyncErrorOneIn(0);
  PowerLossAndReopen();
  ExpectStatsReconcile();
  ExpectAllReadable(Phase::kAfterRestart);
}

// Regression: a delete whose catalog write fails must fail and keep the
// block. Reporting success while the record stays would bring the block
// back after a restart, its NVMe extent possibly reused by then.
TEST_F(PowerLossTest, DeleteWhoseCatalogWriteFailsKeepsTheBlock) {
  std::mt19937_64 rng(7);
  ASSERT_OK(PutFresh(rng, /*durable=*/true));
  const std::string id = oracle_.begin()->first;
  faults_.SetWriteErrorOneIn(1);
  EXPECT_FALSE(Delete(id).ok()) << "the catalog refused the delete";
  faults_.SetWriteErrorOneIn(0);
  PowerLossAndReopen();
  ExpectStatsReconcile();
  ExpectAllReadable(Phase::kAfterRestart);
}

// A failed WAL sync leaves the record in RocksDB's WAL, which the next open
// replays: the store must not reuse the extent that record names until
// then (it keeps it allocated; Open frees it if no record names it), or the
// failed put's record would point at other bytes after a clean restart.
TEST_F(PowerLossTest, FailedCatalogSyncNeverLeavesARecordOnReusedSpace) {
  // Sync errors for the catalog only: NVMe syncs succeed.
  FaultInjectionEnv catalog_faults(Env::Default(), /*seed=*/5);
  std::unique_ptr<rocksdb::Env> catalog_env = NewFaultCatalogEnv(&catalog_faults);
  store_.reset();
  options_.catalog_env = catalog_env.get();
  Open();
  std::mt19937_64 rng(9);
  catalog_faults.SetSyncErrorOneIn(1);
  EXPECT_FALSE(PutFresh(rng, /*durable=*/true).ok()) << "its catalog sync failed";
  catalog_faults.SetSyncErrorOneIn(0);
  const std::string failed = oracle_.begin()->first;
  // Fill the host tier: making room demotes to NVMe, into the freed extent.
  for (int i = 0; i < 10; ++i) PutFresh(rng, /*durable=*/false).IgnoreError();

  store_.reset();  // a clean restart: nothing is dropped
  Open();
  std::string out;
  TierId from;
  absl::Status st = store_->Get(Key(failed), &out, &from);
  EXPECT_TRUE(st.ok() ? out == oracle_[failed].bytes : absl::IsNotFound(st)) << st;
  EXPECT_EQ(std::string(st.message()).find("DATA_LOSS"), std::string::npos) << st;
  EXPECT_EQ(store_->Stats().quarantined_blocks, 0u);
  store_.reset();  // before catalog_env goes
}

// A full NVMe tier evicts: the victim's record removal is written unsynced
// (no disk wait under the store's lock) and its extent is reused only
// after a catalog sync. Evictions settled by the next durable put stay
// gone across a power loss; a block deleted after its eviction stays gone;
// one whose removal never got synced (the catalog sync failed) comes back
// after the power loss with its own bytes; no record ever names reused
// space.
TEST_F(PowerLossTest, EvictionsNeverLeaveARecordOnReusedSpace) {
  FaultInjectionEnv catalog_faults(Env::Default(), /*seed=*/6);
  std::unique_ptr<rocksdb::Env> catalog_env = NewFaultCatalogEnv(&catalog_faults);
  store_.reset();
  options_.catalog_env = catalog_env.get();
  Open();
  std::mt19937_64 rng(77);
  for (uint32_t i = 0; i < 2 * kNvmeBlocks; ++i) {
    ASSERT_OK(PutFresh(rng, /*durable=*/true)) << "put " << i;
  }
  size_t evicted = 0;
  std::string evicted_then_deleted;
  for (auto& [id, e] : oracle_) {
    if (e.state != State::kDurable || store_->Lookup(Key(id)).present) continue;
    e.state = State::kGone;  // its removal was synced by a later durable put
    ++evicted;
    if (evicted_then_deleted.empty()) evicted_then_deleted = id;
  }
  EXPECT_GE(evicted, kNvmeBlocks - 8) << "the NVMe tier did not evict";
  EXPECT_EQ(store_->Stats().evicted_blocks, evicted);
  EXPECT_EQ(store_->Stats().tiers[2].releasing_bytes, 0u) << "evicted space was not freed";
  EXPECT_TRUE(absl::IsNotFound(store_->Delete(Key(evicted_then_deleted))));

  // The catalog sync that would free the next victim's extent fails: the
  // put fails, the victim is evicted but its extent stays allocated.
  std::set<std::string> present_before;
  for (const auto& [id, e] : oracle_) {
    if (e.state == State::kDurable) present_before.insert(id);
  }
  catalog_faults.SetSyncErrorOneIn(1);
  EXPECT_FALSE(PutFresh(rng, /*durable=*/true).ok());
  std::string unsynced_victim;
  for (const std::string& id : present_before) {
    if (!store_->Lookup(Key(id)).present) unsynced_victim = id;
  }
  ASSERT_FALSE(unsynced_victim.empty()) << "nothing was evicted for the failed put";
  oracle_[unsynced_victim].state = State::kVolatile;  // gone or bit-exact
  EXPECT_EQ(store_->Stats().tiers[2].releasing_bytes, kBlockBytes);
  // Power loss with the catalog's syncs still failing (its clean close
  // cannot sync either).
  store_.reset();
  ASSERT_OK(faults_.DropUnsyncedData());
  ASSERT_OK(catalog_faults.DropUnsyncedData());
  catalog_faults.SetSyncErrorOneIn(0);
  Open();
  ExpectAllReadable(Phase::kAfterRestart);
  ExpectStatsReconcile();
  EXPECT_TRUE(store_->Lookup(Key(unsynced_victim)).present)
      << "the unsynced removal was undone by the power loss: the block is back";
  EXPECT_FALSE(store_->Lookup(Key(evicted_then_deleted)).present);
  RunLoad(/*seed=*/78, /*ops=*/20, Phase::kRunning);
  ExpectAllReadable(Phase::kRunning);
  store_.reset();  // before catalog_env goes
}

}  // namespace
}  // namespace kvtier
