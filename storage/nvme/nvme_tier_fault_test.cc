// The NVMe tier under injected faults: power loss before Sync, EIO, ENOSPC.
#include <vector>

#include "gtest/gtest.h"
#include "storage/env/fault_injection_env.h"
#include "storage/nvme/nvme_test_util.h"
#include "storage/nvme/nvme_tier.h"
#include "tests/testutil/status_matchers.h"

using ::kvtier::testing::StatusIs;

namespace kvtier {
namespace {

using ::kvtier::testing::RandomBytes;

class NvmeTierFaultTest : public testing::NvmeTierFixture {
 protected:
  Env* env() override { return &env_; }

  FaultInjectionEnv env_{Env::Default(), /*seed=*/7};
};

TEST_F(NvmeTierFaultTest, PowerLossDropsOnlyUnsyncedBlocks) {
  const auto synced = RandomBytes(100000, 1);
  const auto unsynced = RandomBytes(200000, 2);
  auto synced_at = tier_->Write(synced);
  ASSERT_OK(synced_at);
  ASSERT_OK(tier_->Sync());
  auto unsynced_at = tier_->Write(unsynced);
  ASSERT_OK(unsynced_at);
  // Before the crash both read back.
  std::vector<uint8_t> out(unsynced.size());
  ASSERT_OK(tier_->Read(*unsynced_at, NvmeChecksum(unsynced), absl::MakeSpan(out)));

  // Crash: close, lose what was not synced, restart from the catalog.
  tier_.reset();
  ASSERT_OK(env_.DropUnsyncedData());
  Reopen();
  ASSERT_OK(tier_->Reserve(*synced_at));
  ASSERT_OK(tier_->Reserve(*unsynced_at));

  std::vector<uint8_t> back(synced.size());
  EXPECT_OK(tier_->Read(*synced_at, NvmeChecksum(synced), absl::MakeSpan(back)));
  EXPECT_EQ(back, synced);
  absl::Status lost = tier_->Read(*unsynced_at, NvmeChecksum(unsynced), absl::MakeSpan(out));
  EXPECT_THAT(lost, StatusIs(absl::StatusCode::kDataLoss)) << lost;
  EXPECT_EQ(out, std::vector<uint8_t>(out.size(), 0));
}

TEST_F(NvmeTierFaultTest, SyncedBlocksSurvivePowerLoss) {
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<absl::Span<const uint8_t>> spans;
  for (int i = 0; i < 10; ++i) payloads.push_back(RandomBytes(50000 + i, i));
  for (const auto& p : payloads) spans.push_back(p);
  auto locations = tier_->WriteBatch(spans);
  ASSERT_OK(tier_->Sync());
  EXPECT_EQ(env_.unsynced_write_count(), 0u);
  tier_.reset();
  ASSERT_OK(env_.DropUnsyncedData());
  Reopen();
  for (size_t i = 0; i < payloads.size(); ++i) {
    ASSERT_OK(locations[i]);
    ASSERT_OK(tier_->Reserve(*locations[i]));
    std::vector<uint8_t> out(payloads[i].size());
    ASSERT_OK(tier_->Read(*locations[i], NvmeChecksum(payloads[i]), absl::MakeSpan(out)));
    EXPECT_EQ(out, payloads[i]);
  }
}

TEST_F(NvmeTierFaultTest, InjectedIoErrorsSurfaceAndNeverReturnWrongBytes) {
  env_.SetWriteErrorOneIn(4);
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<absl::Span<const uint8_t>> spans;
  for (int i = 0; i < 40; ++i) payloads.push_back(RandomBytes(9000 + i, i));
  for (const auto& p : payloads) spans.push_back(p);
  auto locations = tier_->WriteBatch(spans);
  int write_failures = 0;
  for (const auto& location : locations) {
    if (location.ok()) continue;
    ++write_failures;
    EXPECT_THAT(location.status(), StatusIs(absl::StatusCode::kInternal));
    EXPECT_NE(location.status().message().find("nvme-00"), absl::string_view::npos)
        << location.status();
  }
  EXPECT_GT(write_failures, 0);
  EXPECT_LT(write_failures, 40);
  EXPECT_EQ(tier_->stats().blocks, 40u - write_failures) << "failed writes leave no allocation";

  env_.SetWriteErrorOneIn(0);
  env_.SetReadErrorOneIn(3);
  int read_failures = 0;
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < payloads.size(); ++i) {
      if (!locations[i].ok()) continue;
      std::vector<uint8_t> out(payloads[i].size(), 0xee);
      absl::Status status =
          tier_->Read(*locations[i], NvmeChecksum(payloads[i]), absl::MakeSpan(out));
      if (status.ok()) {
        ASSERT_EQ(out, payloads[i]);
      } else {
        ++read_failures;
        EXPECT_THAT(status, StatusIs(absl::StatusCode::kInternal)) << status;
        ASSERT_EQ(out, std::vector<uint8_t>(out.size(), 0));
      }
    }
  }
  EXPECT_GT(read_failures, 0);
  EXPECT_EQ(env_.injected_error_count(), static_cast<uint64_t>(write_failures + read_failures));
}

TEST_F(NvmeTierFaultTest, NoSpaceIsResourceExhausted) {
  env_.SetNoSpace(true);
  auto location = tier_->Write(RandomBytes(8192, 1));
  EXPECT_THAT(location.status(), StatusIs(absl::StatusCode::kResourceExhausted))
      << location.status();
  EXPECT_EQ(tier_->stats().used_bytes, 0u);

  NvmeTierOptions elsewhere = options_;
  elsewhere.directory = dir_.path() + "/other";
  EXPECT_THAT(NvmeTier::Open(elsewhere).status(), StatusIs(absl::StatusCode::kResourceExhausted));

  env_.SetNoSpace(false);
  EXPECT_OK(tier_->Write(RandomBytes(8192, 1)));
}

// A failed Sync is counted and not sticky: the next Sync syncs the same
// files again, and a caller compares sync_failures() around its write.
TEST_F(NvmeTierFaultTest, SyncErrorIsCountedAndTheNextSyncWorks) {
  const auto a = RandomBytes(50000, 3);
  const uint64_t before_a = tier_->sync_failures();
  auto a_at = tier_->Write(a);
  ASSERT_OK(a_at);
  env_.SetSyncErrorOneIn(1);
  absl::Status failed = tier_->Sync();
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(std::string(failed.message()).find("not durable"), std::string::npos) << failed;
  env_.SetSyncErrorOneIn(0);
  EXPECT_EQ(tier_->sync_failures(), before_a + 1);
  // The retry succeeds, but a's caller saw the failure in between.
  ASSERT_OK(tier_->Sync());
  EXPECT_NE(tier_->sync_failures(), before_a);
  EXPECT_EQ(env_.unsynced_write_count(), 0u) << "the retry synced the file again";

  const auto b = RandomBytes(50000, 4);
  const uint64_t before_b = tier_->sync_failures();
  auto b_at = tier_->Write(b);
  ASSERT_OK(b_at);
  ASSERT_OK(tier_->Sync());
  EXPECT_EQ(tier_->sync_failures(), before_b) << "b is durable";
  // A power loss keeps b.
  tier_.reset();
  ASSERT_OK(env_.DropUnsyncedData());
  Reopen();
  ASSERT_OK(tier_->Reserve(*b_at));
  std::vector<uint8_t> back(b.size());
  ASSERT_OK(tier_->Read(*b_at, NvmeChecksum(b), absl::MakeSpan(back)));
  EXPECT_EQ(back, b);
}

}  // namespace
}  // namespace kvtier
