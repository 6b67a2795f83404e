// The catalog on real RocksDB files under injected faults: write and sync
// errors, no space, read errors and a power loss (DropUnsyncedData), all
// from one FaultInjectionEnv through FaultFileSystem.
#include <set>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/catalog/catalog.h"
#include "storage/catalog/fault_file_system.h"
#include "storage/env/fault_injection_env.h"
#include "storage/env/test_util.h"
#include "tests/testutil/status_matchers.h"

using ::kvtier::testing::StatusIs;

namespace kvtier {
namespace {

using ::testing::HasSubstr;

BlockKey Key(int n) { return BlockKey{"tenant", 1, "block-" + std::to_string(n)}; }

BlockRecord Record(int n, bool durable) {
  BlockRecord r;
  r.size_bytes = 4096;
  r.checksum = 0x9e3779b97f4a7c15ull * (n + 1);
  if (durable) {
    r.nvme = NvmeExtent{0, 4096ull * n, 4096};
    r.durable = true;
  }
  r.created_micros = 1000 + n;
  r.last_access_micros = 2000 + n;
  r.summary = "v_b:" + std::to_string(n);
  return r;
}

class CatalogFaultTest : public ::testing::Test {
 protected:
  void SetUp() override { Reopen(); }
  void TearDown() override { catalog_.reset(); }

  static CatalogOptions Options(rocksdb::Env* env) {
    CatalogOptions options;
    options.block_cache_bytes = 4 << 20;
    options.memtable_bytes = 1 << 20;
    options.memtable_total_bytes = 8 << 20;
    options.rocksdb_env = env;
    return options;
  }
  absl::StatusOr<std::unique_ptr<Catalog>> Open() {
    return Catalog::Open(dir_.File("catalog"), Options(rocks_env_.get()));
  }
  void Reopen() {
    catalog_.reset();
    auto opened = Open();
    ASSERT_OK(opened) << opened.status();
    catalog_ = std::move(*opened);
  }
  // A power loss: a clean close keeps the WAL's unsynced tail unsynced,
  // the drop then removes it.
  void PowerLossAndReopen() {
    catalog_.reset();
    ASSERT_OK(faults_.DropUnsyncedData());
    Reopen();
  }

  void ExpectStored(int n, bool durable) {
    absl::StatusOr<BlockRecord> got = catalog_->GetBlock(Key(n));
    ASSERT_OK(got) << "block " << n << ": " << got.status();
    EXPECT_EQ(*got, Record(n, durable)) << "block " << n;
  }
  void ExpectAbsent(int n) {
    EXPECT_THAT(catalog_->GetBlock(Key(n)).status(), StatusIs(absl::StatusCode::kNotFound))
        << "block " << n;
  }
  // A failed write names the injection (RocksDB repeats the first failure
  // for later writes once it stopped accepting them).
  static void ExpectInjected(const absl::Status& st, absl::StatusCode code) {
    EXPECT_EQ(st.code(), code) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr("injected")) << st;
  }

  testing::ScopedTempDir dir_;
  FaultInjectionEnv faults_{Env::Default(), /*seed=*/11};
  std::unique_ptr<rocksdb::Env> rocks_env_ = NewFaultCatalogEnv(&faults_);
  std::unique_ptr<Catalog> catalog_;
};

TEST_F(CatalogFaultTest, WriteErrorsFailPutsClearlyAndOnlyAcknowledgedOnesSurvive) {
  faults_.SetWriteErrorOneIn(4);
  std::set<int> acked, failed;
  for (int n = 0; n < 40; ++n) {
    absl::Status st = catalog_->PutBlock(Key(n), Record(n, n % 2 == 0));
    if (st.ok()) {
      acked.insert(n);
    } else {
      failed.insert(n);
      ExpectInjected(st, absl::StatusCode::kInternal);
      ExpectAbsent(n);
    }
  }
  EXPECT_FALSE(acked.empty());
  ASSERT_FALSE(failed.empty());
  EXPECT_GT(faults_.injected_error_count(), 0u);
  // With paranoid_checks a WAL write error stops every later write until
  // the DB is reopened (RocksDB refuses to resume): every put after the
  // first failure fails too, although the catalog tried to resume.
  EXPECT_EQ(*failed.begin() + static_cast<int>(failed.size()), 40);
  EXPECT_GT(catalog_->recoveries_attempted(), 0u);
  EXPECT_EQ(catalog_->recoveries_succeeded(), 0u);

  faults_.SetWriteErrorOneIn(0);
  Reopen();
  for (int n : acked) ExpectStored(n, n % 2 == 0);
  for (int n : failed) ExpectAbsent(n);
  ASSERT_OK(catalog_->PutBlock(Key(100), Record(100, true))) << "writable again";
}

TEST_F(CatalogFaultTest, NoSpaceIsResourceExhaustedAndLeavesEarlierRecords) {
  for (int n = 0; n < 5; ++n) ASSERT_OK(catalog_->PutBlock(Key(n), Record(n, true)));
  faults_.SetNoSpace(true);
  absl::Status put = catalog_->PutBlock(Key(5), Record(5, true));
  EXPECT_THAT(put, StatusIs(absl::StatusCode::kResourceExhausted)) << put;
  EXPECT_NE(catalog_->PutBlock(Key(6), Record(6, false)).code(), absl::StatusCode::kOk);
  EXPECT_FALSE(catalog_->Flush().ok());
  auto fresh = Catalog::Open(dir_.File("other"), Options(rocks_env_.get()));
  EXPECT_THAT(fresh.status(), StatusIs(absl::StatusCode::kResourceExhausted)) << fresh.status();
  ExpectStored(0, true);  // reads still work

  faults_.SetNoSpace(false);
  Reopen();
  for (int n = 0; n < 5; ++n) ExpectStored(n, true);
  ExpectAbsent(5);
  ExpectAbsent(6);
}

TEST_F(CatalogFaultTest, PowerLossKeepsEverySyncedRecordAndDropsTheUnsyncedTail) {
  int next = 0;
  std::vector<int> durable;
  for (int cycle = 0; cycle < 3; ++cycle) {
    for (int i = 0; i < 30; ++i, ++next) {
      const bool is_durable = i % 3 == 0;
      ASSERT_OK(catalog_->PutBlock(Key(next), Record(next, is_durable)));
      if (is_durable) durable.push_back(next);
      if (i == 15) {
        ASSERT_OK(catalog_->Flush());  // an SST and a MANIFEST edit
      }
    }
    // Written after the last synced write: nothing syncs them.
    const int tail_begin = next;
    for (int i = 0; i < 5; ++i, ++next) {
      ASSERT_OK(catalog_->PutBlock(Key(next), Record(next, false)));
    }
    ASSERT_OK(catalog_->DeleteBlock(Key(durable.front()), /*sync=*/false));

    PowerLossAndReopen();
    for (int n : durable) ExpectStored(n, true);
    for (int n = tail_begin; n < next; ++n) ExpectAbsent(n);
  }
  // The synced record deleted without sync came back; a synced delete holds.
  ASSERT_OK(catalog_->DeleteBlock(Key(durable.front())));
  PowerLossAndReopen();
  ExpectAbsent(durable.front());
}

// writes_done() tickets against synced_through(): an unsynced removal is
// synced by SyncWal or by any later synced write, and until then a power
// loss undoes it.
TEST_F(CatalogFaultTest, UnsyncedRemovalsAreSyncedBySyncWalOrALaterSyncedWrite) {
  for (int n = 1; n <= 3; ++n) ASSERT_OK(catalog_->PutBlock(Key(n), Record(n, true)));
  EXPECT_EQ(catalog_->synced_through(), catalog_->writes_done() - 1)
      << "a synced write covers the writes before it";
  ASSERT_OK(catalog_->DeleteBlock(Key(1), /*sync=*/false));
  const uint64_t first = catalog_->writes_done();
  EXPECT_GT(first, catalog_->synced_through());
  ASSERT_OK(catalog_->SyncWal());
  EXPECT_GE(catalog_->synced_through(), first);

  ASSERT_OK(catalog_->DeleteBlock(Key(2), /*sync=*/false));
  const uint64_t second = catalog_->writes_done();
  EXPECT_GT(second, catalog_->synced_through());
  ASSERT_OK(catalog_->PutBlock(Key(4), Record(4, true)));  // synced
  EXPECT_GE(catalog_->synced_through(), second);

  ASSERT_OK(catalog_->DeleteBlock(Key(3), /*sync=*/false));
  EXPECT_GT(catalog_->writes_done(), catalog_->synced_through());
  faults_.SetSyncErrorOneIn(1);
  const uint64_t before = catalog_->synced_through();
  EXPECT_FALSE(catalog_->SyncWal().ok());
  EXPECT_EQ(catalog_->synced_through(), before) << "a failed sync settles nothing";
  faults_.SetSyncErrorOneIn(0);

  PowerLossAndReopen();
  ExpectAbsent(1);
  ExpectAbsent(2);
  ExpectStored(3, true);  // its removal was never synced
  ExpectStored(4, true);
}

TEST_F(CatalogFaultTest, SyncErrorsFailDurablePutsAndPowerLossRemovesThem) {
  ASSERT_OK(catalog_->PutBlock(Key(1), Record(1, true)));
  faults_.SetSyncErrorOneIn(1);
  ExpectInjected(catalog_->PutBlock(Key(2), Record(2, true)), absl::StatusCode::kInternal);
  faults_.SetSyncErrorOneIn(0);
  // The record reached the WAL but not the disk: only a power loss decides.
  PowerLossAndReopen();
  ExpectStored(1, true);
  ExpectAbsent(2);
}

TEST_F(CatalogFaultTest, ReadErrorsSurfaceAsErrors) {
  for (int n = 0; n < 20; ++n) ASSERT_OK(catalog_->PutBlock(Key(n), Record(n, true)));
  ASSERT_OK(catalog_->Flush());
  Reopen();  // a cold block cache: reads go to the SST
  faults_.SetReadErrorOneIn(1);
  absl::StatusOr<BlockRecord> got = catalog_->GetBlock(Key(3));
  ExpectInjected(got.status(), absl::StatusCode::kInternal);
  auto scan = catalog_->ForEachBlock(
      [](const BlockKey&, const absl::StatusOr<BlockRecord>&) { return true; });
  EXPECT_THAT(scan.status(), StatusIs(absl::StatusCode::kInternal)) << scan.status();
  catalog_.reset();
  EXPECT_FALSE(Open().ok()) << "opening reads the MANIFEST";

  faults_.SetReadErrorOneIn(0);
  Reopen();
  for (int n = 0; n < 20; ++n) ExpectStored(n, true);
}

TEST_F(CatalogFaultTest, ConcurrentWritersUnderWriteErrors) {
  faults_.SetWriteErrorOneIn(10);
  constexpr int kThreads = 4, kPerThread = 50;
  std::vector<std::set<int>> acked(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const int n = t * 1000 + i;
        if (catalog_->PutBlock(Key(n), Record(n, i % 2 == 0)).ok()) acked[t].insert(n);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  faults_.SetWriteErrorOneIn(0);
  Reopen();
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      const int n = t * 1000 + i;
      if (acked[t].contains(n)) {
        ExpectStored(n, i % 2 == 0);
      } else {
        ExpectAbsent(n);
      }
    }
  }
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

ContextVersionRecord FaultVersion(int n) {
  ContextVersionRecord v;
  v.version = static_cast<uint32_t>(n);
  v.context_key = "context";
  v.block_ids = {"block-" + std::to_string(n)};
  v.tokens = 16;
  v.retention = 0.5f;
  v.created_unix_ms = 1000 + n;
  return v;
}

// Compaction versions are synced writes like durable blocks: under write
// errors every acknowledged one survives a power loss, every failed one is
// absent, and the slot records of its batch with it.
TEST_F(CatalogFaultTest, CompactionVersionsAckedSurvivePowerLossFailedAreAbsent) {
  faults_.SetWriteErrorOneIn(5);
  std::set<int> acked, failed;
  for (int n = 0; n < 30; ++n) {
    CatalogBatch batch;
    ASSERT_OK(batch.PutContextVersion("tenant", 1, FaultVersion(n)));
    ASSERT_OK(batch.PutCompactedSlots(Key(n), CompactedSlotsRecord{1, {n}, {0.5f}, {1}}));
    absl::Status st = catalog_->Write(batch);
    if (st.ok()) {
      acked.insert(n);
    } else {
      failed.insert(n);
      ExpectInjected(st, absl::StatusCode::kInternal);
    }
  }
  ASSERT_FALSE(acked.empty());
  ASSERT_FALSE(failed.empty());
  faults_.SetWriteErrorOneIn(0);
  PowerLossAndReopen();

  absl::StatusOr<std::vector<ContextVersionRecord>> versions =
      catalog_->ContextVersions("tenant", 1, "context");
  ASSERT_OK(versions) << versions.status();
  std::set<int> stored;
  for (const ContextVersionRecord& v : *versions) {
    stored.insert(static_cast<int>(v.version));
    EXPECT_EQ(v, FaultVersion(static_cast<int>(v.version)));
  }
  EXPECT_EQ(stored, acked);
  for (int n : acked) {
    absl::StatusOr<CompactedSlotsRecord> slots = catalog_->GetCompactedSlots(Key(n));
    ASSERT_OK(slots) << n << ": " << slots.status();
    EXPECT_EQ(slots->positions, std::vector<int32_t>{n});
  }
  for (int n : failed) {
    EXPECT_THAT(catalog_->GetCompactedSlots(Key(n)).status(),
                StatusIs(absl::StatusCode::kNotFound));
  }
}

}  // namespace
}  // namespace kvtier
