// ContextManager over a real BlockStore (RocksDB catalog, shared-memory
// tiers, NVMe files) whose clock is manual, so idle reaping is exact.
#include "daemon/context_manager.h"

#include <unistd.h>

#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "daemon/prefetcher.h"
#include "daemon/summarizer.h"
#include "gmock/gmock.h"
#include "gpu/cpu/shm_device_ops.h"
#include "gtest/gtest.h"
#include "storage/env/fault_injection_env.h"
#include "storage/env/test_util.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/synthetic.h"

namespace kvtier::daemon {
namespace {

using ::testing::HasSubstr;
using testing::StatusIs;

// 1 layer x 1 kv head x 4 tokens x 16 dims x fp32 = 512-byte blocks.
ModelProfile SmallProfile() {
  ModelProfile p;
  p.name = "ctx-test";
  p.revision = "1";
  p.layers = 1;
  p.kv_heads = 1;
  p.head_dim = 16;
  p.block_size_tokens = 4;
  p.dtype = KvDtype::kFp32;
  return p;
}

class ContextManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    env_ = std::make_unique<FaultInjectionEnv>(Env::Default(), 1);
    env_->SetNowMicros(1'000'000);
    shm_prefix_ = "/dev/shm/kvtier-cmt-" + std::to_string(::getpid()) + "-" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_OK(gpu::ShmDeviceOps::Create(shm_prefix_ + "-arena", 256 << 10, {}, &device_ops_));
    summarizer_ = std::make_unique<Summarizer>(SummarizerOptions{});
    BlockStoreOptions options;
    options.data_dir = dir_.path();
    options.env = env_.get();
    options.device_ops = device_ops_.get();
    options.device_capacity_bytes = 256 << 10;
    options.host_shm_path = shm_prefix_ + "-host";
    options.host_capacity_bytes = 1 << 20;
    options.staging_name = shm_prefix_ + "-staging";
    options.staging_capacity_bytes = 64 << 10;
    options.nvme_dir = dir_.path() + "/nvme";
    options.nvme_file_count = 1;
    options.nvme_file_size_bytes = 4 << 20;
    options.nvme_direct_io = testing::DirectIoSupported(Env::Default(), dir_.path());
    options.nvme_io_threads = 1;
    options.nvme_queue_depth = 16;
    options.default_lease_ttl_ms = 1000;
    options.max_lease_ttl_ms = 10000;
    options.summarize = [this](const ModelProfile& p, absl::Span<const uint8_t> data) {
      return summarizer_->Summarize(p, data);
    };
    auto store = BlockStore::Open(options);
    ASSERT_OK(store);
    store_ = std::move(*store);
    auto profile = store_->RegisterProfile(SmallProfile(), "t");
    ASSERT_OK(profile);
    profile_ = profile->profile;
    Make(ContextManagerOptions{});
  }

  void TearDown() override {
    contexts_.reset();
    store_.reset();
  }

  void Make(ContextManagerOptions options) {
    options.max_ttl_ms = 10000;
    options.default_ttl_ms = 1000;
    contexts_.reset();
    contexts_ = std::make_unique<ContextManager>(store_.get(), env_.get(), options);
  }

  // Stores blocks "b<first>".."b<first+n-1>"; returns their ids.
  std::vector<std::string> Put(int first, int n) {
    std::vector<std::string> ids;
    for (int i = first; i < first + n; ++i) {
      auto p = testing::MakeBlockPayload(LayoutOf(profile_), i, {});
      std::string id = "b" + std::to_string(i);
      BlockKey key{"t", profile_.profile_id, id};
      auto put = store_->Put(
          key,
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(p.bytes.data()), p.bytes.size()));
      EXPECT_OK(put) << put.status();
      ids.push_back(id);
    }
    return ids;
  }

  // Pins the first n blocks of the context as a Select would.
  void Pin(uint64_t id, int n) {
    auto ctx = contexts_->Find("t", id);
    ASSERT_OK(ctx);
    absl::MutexLock lock(&(*ctx)->mu);
    std::vector<BlockKey> keys;
    for (int i = 0; i < n; ++i) keys.push_back((*ctx)->KeyAt(i));
    std::vector<absl::StatusOr<DeviceHandle>> handles;
    auto lease = store_->AcquireHandles("t", keys, (*ctx)->ttl_ms(), &handles);
    ASSERT_OK(lease) << lease.status();
    (*ctx)->SetSelection(*lease, n, 1);
  }

  uint64_t PinnedBytes() { return store_->Stats().tiers[0].pinned_bytes; }

  testing::ScopedTempDir dir_;
  std::unique_ptr<FaultInjectionEnv> env_;
  std::string shm_prefix_;
  std::unique_ptr<gpu::ShmDeviceOps> device_ops_;
  std::unique_ptr<Summarizer> summarizer_;
  std::unique_ptr<BlockStore> store_;
  ModelProfile profile_;
  std::unique_ptr<ContextManager> contexts_;
};

TEST_F(ContextManagerTest, OpenBuildsTheTreeFromStoredSummaries) {
  auto ids = Put(0, 40);
  std::vector<std::vector<std::string>> segments = {{ids.begin(), ids.begin() + 30},
                                                    {ids.begin() + 30, ids.end()}};
  auto opened = contexts_->Open("t", profile_.profile_id, segments, 0);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_blocks, 40u);
  EXPECT_NE(opened->context_id, 0u);
  auto ctx = contexts_->Find("t", opened->context_id);
  ASSERT_OK(ctx);
  absl::MutexLock lock(&(*ctx)->mu);
  EXPECT_EQ((*ctx)->index().tree().num_pages(), 40);
  EXPECT_EQ((*ctx)->index().tree().num_segments(), 2);
  EXPECT_EQ((*ctx)->block_id(31), "b31");
  EXPECT_EQ((*ctx)->ttl_ms(), 1000u);
  EXPECT_GT((*ctx)->MemoryBytes(), 40u * 16 * 2);
  EXPECT_EQ(contexts_->size(), 1u);
}

TEST_F(ContextManagerTest, ABlockAppearsAtMostOnceInAContext) {
  auto ids = Put(0, 4);
  // Twice in one segment, and across segments: refused, naming both places.
  auto st = contexts_->Open("t", profile_.profile_id, {{ids[0], ids[1], ids[0]}}, 0).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument));
  st = contexts_->Open("t", profile_.profile_id, {{ids[0], ids[1]}, {ids[1]}}, 0).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument));
  auto ctx = contexts_->Open("t", profile_.profile_id, {{ids[0], ids[1]}}, 0);
  ASSERT_OK(ctx);
  // Appending one already there, or the same one twice in a batch.
  const uint64_t id = ctx->context_id;
  st = contexts_->Append("t", id, {ids[1]}).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(st.message(), HasSubstr("already at position 1"));
  st = contexts_->Append("t", id, {ids[2], ids[2]}).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(st.message(), HasSubstr("repeats block_ids[0]"));
  // Nothing of a refused batch was appended.
  auto appended = contexts_->Append("t", id, {ids[2], ids[3]});
  ASSERT_OK(appended);
  EXPECT_EQ(*appended, 4u);
}

TEST_F(ContextManagerTest, OpenNamesWhatIsWrong) {
  auto ids = Put(0, 8);
  auto st = contexts_->Open("t", profile_.profile_id, {{}, {}}, 0).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(st.message(), HasSubstr("segments"));
  st = contexts_->Open("t", 4242, {ids}, 0).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(st.message(), HasSubstr("profile_id"));
  st = contexts_->Open("t", profile_.profile_id, {{ids[0], ""}}, 0).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(st.message(), HasSubstr("segments[0].block_ids[1]"));
  st = contexts_->Open("t", profile_.profile_id, {ids}, 20000).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(st.message(), HasSubstr("lease_ttl_ms"));

  // 12 unstored blocks: the first 8 are listed, the rest counted.
  std::vector<std::string> second = {Put(100, 1)[0]};
  for (int i = 0; i < 12; ++i) second.push_back("missing" + std::to_string(i));
  st = contexts_->Open("t", profile_.profile_id, {ids, second}, 0).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(st.message(), HasSubstr("12 of 13 blocks are not stored"));
  EXPECT_THAT(st.message(), HasSubstr("segments[1].block_ids[1] = "));
  EXPECT_THAT(st.message(), HasSubstr("segments[1].block_ids[8] = "));
  EXPECT_THAT(st.message(), ::testing::Not(HasSubstr("segments[1].block_ids[9] ")));
  EXPECT_THAT(st.message(), HasSubstr("and 4 more"));
  // A block whose keys are NaN is stored, but cannot join a context.
  auto nan_payload = testing::MakeBlockPayload(LayoutOf(profile_), 99, {});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(nan_payload.bytes.data(), &nan, 4);
  ASSERT_OK(
      store_->Put(BlockKey{"t", profile_.profile_id, "nan"},
                  absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(nan_payload.bytes.data()),
                                      nan_payload.bytes.size())));
  st = contexts_->Open("t", profile_.profile_id, {{ids[0], "nan"}}, 0).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(st.message(),
              HasSubstr("segments[0].block_ids[1] = 6e616e (stored without a key summary)"));
  // Another tenant's profile is not this tenant's; under its own profile
  // of the same definition, another tenant's blocks are not stored.
  auto u_profile = store_->RegisterProfile(SmallProfile(), "u");
  ASSERT_OK(u_profile);
  EXPECT_THAT(contexts_->Open("u", profile_.profile_id, {ids}, 0),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(contexts_->Open("u", u_profile->profile.profile_id, {ids}, 0),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(contexts_->size(), 0u);
}

TEST_F(ContextManagerTest, LimitAndIdsThatAreNeverReused) {
  ContextManagerOptions options;
  options.max_contexts = 2;
  Make(options);
  auto ids = Put(0, 4);
  auto a = contexts_->Open("t", profile_.profile_id, {ids}, 0);
  auto b = contexts_->Open("t", profile_.profile_id, {ids}, 0);
  ASSERT_OK(a);
  ASSERT_OK(b);
  auto c = contexts_->Open("t", profile_.profile_id, {ids}, 0);
  EXPECT_THAT(c, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(c.status().message(), HasSubstr("limits.max_contexts"));
  ASSERT_OK(contexts_->Close("t", a->context_id));
  EXPECT_THAT(contexts_->Close("t", a->context_id), StatusIs(absl::StatusCode::kNotFound));
  c = contexts_->Open("t", profile_.profile_id, {ids}, 0);
  ASSERT_OK(c);
  EXPECT_NE(c->context_id, a->context_id);
  EXPECT_NE(c->context_id, b->context_id);
}

TEST_F(ContextManagerTest, AppendExtendsTheLastSegmentOfThatTenantsContext) {
  auto ids = Put(0, 20);
  auto opened = contexts_->Open("t", profile_.profile_id, {{ids.begin(), ids.begin() + 10}}, 0);
  ASSERT_OK(opened);
  EXPECT_THAT(contexts_->Append("u", opened->context_id, {ids[10]}),
              StatusIs(absl::StatusCode::kNotFound));
  auto st = contexts_->Append("t", opened->context_id, {ids[10], "never-stored"}).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(st.message(), HasSubstr("block_ids[1]"));
  EXPECT_THAT(contexts_->Append("t", opened->context_id, {}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  auto appended = contexts_->Append("t", opened->context_id, {ids.begin() + 10, ids.end()});
  ASSERT_OK(appended);
  EXPECT_EQ(*appended, 20u);
  auto ctx = contexts_->Find("t", opened->context_id);
  absl::MutexLock lock(&(*ctx)->mu);
  EXPECT_EQ((*ctx)->index().tree().num_pages(), 20);
  EXPECT_EQ((*ctx)->index().tree().num_segments(), 1);
  EXPECT_EQ((*ctx)->block_id(19), "b19");
}

TEST_F(ContextManagerTest, ReleaseAndCloseUnpin) {
  auto ids = Put(0, 10);
  auto a = contexts_->Open("t", profile_.profile_id, {ids}, 0);
  auto b = contexts_->Open("t", profile_.profile_id, {ids}, 0);
  ASSERT_OK(a);
  ASSERT_OK(b);
  Pin(a->context_id, 4);
  Pin(b->context_id, 6);
  EXPECT_EQ(PinnedBytes(), 6u * 512);  // a's 4 are among b's 6
  auto released = contexts_->Release("t", a->context_id);
  ASSERT_OK(released);
  EXPECT_EQ(*released, 4u);
  EXPECT_EQ(*contexts_->Release("t", a->context_id), 0u);
  EXPECT_EQ(PinnedBytes(), 6u * 512);
  ASSERT_OK(contexts_->Close("t", b->context_id));
  EXPECT_EQ(PinnedBytes(), 0u);
  EXPECT_THAT(contexts_->Release("t", b->context_id), StatusIs(absl::StatusCode::kNotFound));
  auto list = contexts_->List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].context_id, a->context_id);
  EXPECT_EQ(list[0].num_blocks, 10u);
}

TEST_F(ContextManagerTest, IdleContextsAreClosedAfterTheirTtl) {
  auto ids = Put(0, 10);
  auto idle = contexts_->Open("t", profile_.profile_id, {ids}, 1000);
  auto busy = contexts_->Open("t", profile_.profile_id, {ids}, 1000);
  ASSERT_OK(idle);
  ASSERT_OK(busy);
  Pin(idle->context_id, 5);
  EXPECT_GT(PinnedBytes(), 0u);
  env_->AdvanceMicros(600'000);
  EXPECT_EQ(contexts_->ReapIdle(), 0u);
  ASSERT_OK(contexts_->Release("t", busy->context_id));  // counts as use
  env_->AdvanceMicros(600'000);
  EXPECT_EQ(contexts_->ReapIdle(), 1u);
  EXPECT_THAT(contexts_->Find("t", idle->context_id), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_OK(contexts_->Find("t", busy->context_id));
  EXPECT_EQ(PinnedBytes(), 0u);
  auto list = contexts_->List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].idle_ms, 600u);
}

TEST_F(ContextManagerTest, PrefetcherBringsNvmeOnlyBlocksIntoHostMemory) {
  std::vector<BlockKey> keys;
  for (int i = 0; i < 5; ++i) {
    auto p = testing::MakeBlockPayload(LayoutOf(profile_), 500 + i, {});
    keys.push_back(BlockKey{"t", profile_.profile_id, "cold" + std::to_string(i)});
    ASSERT_OK(store_->Put(
        keys.back(),
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(p.bytes.data()), p.bytes.size()),
        {.durable = true}));
  }
  ASSERT_OK(store_->Drain([](uint64_t, uint64_t) {}));
  for (const BlockKey& k : keys) ASSERT_EQ(store_->Lookup(k).tier, TierId::kNvme);
  Prefetcher prefetcher(store_.get(), /*max_pending_keys=*/4);
  EXPECT_FALSE(prefetcher.Submit(keys));  // over the bound: dropped
  EXPECT_EQ(prefetcher.dropped(), 5u);
  EXPECT_TRUE(prefetcher.Submit({keys[0], keys[1], keys[2]}));
  prefetcher.WaitIdle();
  EXPECT_EQ(prefetcher.promoted(), 3u);
  EXPECT_EQ(store_->Lookup(keys[0]).tier, TierId::kHost);
  EXPECT_EQ(store_->Lookup(keys[2]).tier, TierId::kHost);
  EXPECT_EQ(store_->Lookup(keys[3]).tier, TierId::kNvme);
  EXPECT_FALSE(store_->Lookup(keys[0]).pinned);
}

}  // namespace
}  // namespace kvtier::daemon
