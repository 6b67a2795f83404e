// RemoteStore against a real Redis Cluster (3 masters, 1 replica each, on
// loopback ports, started by the test): two stores ("daemons") share blocks
// through it; corrupt values are quarantined; an unreachable cluster or a
// dead master gives misses, never wrong bytes; after failover, hits again.
#include "storage/remote/remote_store.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gpu/cpu/shm_device_ops.h"
#include "gtest/gtest.h"
#include "storage/env/test_util.h"
#include "storage/remote/remote_format.h"
#include "storage/store/store_test_util.h"
#include "tests/testutil/redis_cluster.h"
#include "tests/testutil/status_matchers.h"

using ::kvtier::testing::StatusIs;

namespace kvtier::remote {
namespace {

using ::kvtier::testing::RedisClusterFixture;
using ::kvtier::testing::RedisClusterFixtureOptions;

// One daemon's store: real catalog, shm host tier and arena, NVMe files,
// behind a RemoteStore.
class Node {
 public:
  Node(const std::string& name, const std::vector<std::string>& seeds, RemoteTierOptions remote,
       uint64_t host_blocks = 64, uint64_t nvme_blocks_per_file = 64) {
    prefix_ = "/dev/shm/kvtier-rst-" + std::to_string(::getpid()) + "-" + name;
    gpu::ShmDeviceOpsOptions arena_options;
    gpu::GpuStatus created =
        gpu::ShmDeviceOps::Create(prefix_ + "-arena", 16 * kBlockBytes, arena_options, &device_);
    EXPECT_OK(created) << created.ToString();
    BlockStoreOptions o;
    o.data_dir = dir_.path();
    o.env = Env::Default();
    o.device_ops = device_.get();
    o.device_capacity_bytes = 16 * kBlockBytes;
    o.host_shm_path = prefix_ + "-host";
    o.host_capacity_bytes = host_blocks * kBlockBytes;
    o.staging_name = prefix_ + "-staging";
    o.staging_capacity_bytes = 4 * kBlockBytes;
    o.nvme_dir = dir_.path() + "/nvme";
    o.nvme_file_count = 1;
    o.nvme_file_size_bytes = nvme_blocks_per_file * kBlockBytes;
    o.nvme_direct_io = kvtier::testing::DirectIoSupported(Env::Default(), dir_.path());
    o.summarize = [](const ModelProfile&, absl::Span<const uint8_t> payload) {
      return absl::StatusOr<std::string>(std::to_string(payload[0]));
    };
    auto local = BlockStore::Open(o);
    EXPECT_OK(local) << local.status();
    remote.cluster.seeds = seeds;
    remote.log_warning = [this](const std::string& m) {
      absl::MutexLock lock(&mu_);
      warnings_.push_back(m);
    };
    auto store = RemoteStore::Create(std::move(*local), std::move(remote));
    EXPECT_OK(store) << store.status();
    store_ = std::move(*store);
  }

  RemoteStore* store() { return store_.get(); }
  std::vector<std::string> warnings() {
    absl::MutexLock lock(&mu_);
    return warnings_;
  }
  uint64_t Register(const ModelProfile& p, const std::string& tenant = "default") {
    auto r = store_->RegisterProfile(p, tenant);
    EXPECT_OK(r) << r.status();
    return r.ok() ? r->profile.profile_id : 0;
  }

 private:
  kvtier::testing::ScopedTempDir dir_;
  std::string prefix_;
  std::unique_ptr<gpu::ShmDeviceOps> device_;
  std::unique_ptr<RemoteStore> store_;
  absl::Mutex mu_;
  std::vector<std::string> warnings_;
};

class RemoteStoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new kvtier::testing::ScopedTempDir();
    RedisClusterFixtureOptions o;
    o.dir = dir_->path();
    o.masters = 3;
    o.replicas_per_master = 1;
    // As a cache cluster would run: slots of a dead master fail alone, the
    // others keep answering while the replica takes over.
    o.require_full_coverage = false;
    auto cluster = RedisClusterFixture::Start(o);
    ASSERT_OK(cluster) << cluster.status();
    cluster_ = cluster->release();
  }
  // Tests share one cluster per process and reuse block ids: each starts
  // from an empty cluster.
  void SetUp() override {
    auto masters = cluster_->Masters();
    ASSERT_OK(masters) << masters.status();
    for (const std::string& m : *masters) {
      auto flushed = cluster_->Command(m, {"FLUSHALL"});
      ASSERT_OK(flushed) << flushed.status();
    }
  }
  static void TearDownTestSuite() {
    delete cluster_;
    delete dir_;
  }

  static std::unique_ptr<Node> MakeNode(const std::string& name, RemoteTierOptions remote = {},
                                        uint64_t host_blocks = 64, uint64_t nvme_blocks = 64) {
    const std::string unique =
        name + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    return std::make_unique<Node>(unique, cluster_->Seeds(), std::move(remote), host_blocks,
                                  nvme_blocks);
  }

  // Puts block n under `tenant` (profile id `pid` on that node).
  static void PutBlock(Node* node, const std::string& tenant, uint64_t pid, uint64_t n) {
    const std::vector<uint8_t> data = Payload(n);
    auto put = node->store()->Put(BlockKey{tenant, pid, Id(n)}, data);
    ASSERT_OK(put) << put.status();
  }

  static void ExpectBytes(const std::string& got, uint64_t n) {
    const std::vector<uint8_t> want = Payload(n);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0) << "block " << n;
  }

  static std::string RemoteKeyOf(const std::string& tenant, uint64_t n) {
    return RemoteKey(BlockKey{tenant, 0, Id(n)}, ProfileFingerprint(SmallProfile()));
  }

  static kvtier::testing::ScopedTempDir* dir_;
  static RedisClusterFixture* cluster_;
};

kvtier::testing::ScopedTempDir* RemoteStoreTest::dir_ = nullptr;
RedisClusterFixture* RemoteStoreTest::cluster_ = nullptr;

TEST_F(RemoteStoreTest, BlockPutOnOneStoreIsServedByAnother) {
  auto a = MakeNode("a");
  auto b = MakeNode("b");
  const uint64_t pa = a->Register(SmallProfile());
  ModelProfile other = SmallProfile();
  other.name = "registered-first-on-b";
  b->Register(other);  // so that b's id for SmallProfile() differs from a's
  const uint64_t pb = b->Register(SmallProfile());
  ASSERT_NE(pa, pb);
  for (uint64_t n = 0; n < 24; ++n) PutBlock(a.get(), "default", pa, n);
  a->store()->WaitPublished();
  EXPECT_EQ(a->store()->remote_stats().published, 24u);
  EXPECT_EQ(a->store()->remote_stats().masters.size(), 3u);

  for (uint64_t n = 0; n < 24; ++n) {
    std::string out;
    TierId from = TierId::kDevice;
    ASSERT_OK(b->store()->Get(BlockKey{"default", pb, Id(n)}, &out, &from)) << n;
    EXPECT_EQ(from, TierId::kRemote);
    ExpectBytes(out, n);
    // Now local: the second read does not go to the cluster.
    ASSERT_OK(b->store()->Get(BlockKey{"default", pb, Id(n)}, &out, &from));
    EXPECT_EQ(from, TierId::kHost);
  }
  RemoteTierStats s = b->store()->remote_stats();
  EXPECT_EQ(s.hits, 24u);
  EXPECT_EQ(s.bytes_read, 24 * kBlockBytes);
  // b got them from the cluster: it does not publish them back.
  b->store()->WaitPublished();
  EXPECT_EQ(b->store()->remote_stats().published, 0u);
}

TEST_F(RemoteStoreTest, TenantsDoNotShare) {
  auto a = MakeNode("a");
  auto b = MakeNode("b");
  // Profiles are per tenant on each node (ids differ; the cluster keys
  // blocks by tenant and profile shape).
  const uint64_t pa = a->Register(SmallProfile(), "alice");
  const uint64_t pb_alice = b->Register(SmallProfile(), "alice");
  const uint64_t pb_bob = b->Register(SmallProfile(), "bob");
  PutBlock(a.get(), "alice", pa, 1);
  a->store()->WaitPublished();
  std::string out;
  TierId from;
  EXPECT_THAT(b->store()->Get(BlockKey{"bob", pb_bob, Id(1)}, &out, &from),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_OK(b->store()->Get(BlockKey{"alice", pb_alice, Id(1)}, &out, &from));
}

TEST_F(RemoteStoreTest, BlocksEvictedLocallyComeBackFromTheCluster) {
  // 8 host blocks, 16 NVMe blocks: 40 puts evict at least 16 blocks.
  auto a = MakeNode("a", {}, 8, 16);
  const uint64_t pa = a->Register(SmallProfile());
  for (uint64_t n = 100; n < 140; ++n) PutBlock(a.get(), "default", pa, n);
  a->store()->WaitPublished();
  ASSERT_GE(a->store()->Stats().evicted_blocks, 16u);
  ASSERT_FALSE(a->store()->Lookup(BlockKey{"default", pa, Id(100)}).present);
  std::string out;
  TierId from;
  ASSERT_OK(a->store()->Get(BlockKey{"default", pa, Id(100)}, &out, &from));
  EXPECT_EQ(from, TierId::kRemote);
  ExpectBytes(out, 100);
}

TEST_F(RemoteStoreTest, SelectPathAnswersUnavailableAndPrefetchBringsItIn) {
  auto a = MakeNode("a");
  auto b = MakeNode("b");
  const uint64_t pa = a->Register(SmallProfile()), pb = b->Register(SmallProfile());
  PutBlock(a.get(), "default", pa, 7);
  a->store()->WaitPublished();
  const std::vector<BlockKey> keys = {BlockKey{"default", pb, Id(7)},
                                      BlockKey{"default", pb, Id(8)}};  // 8: nowhere
  std::vector<absl::StatusOr<DeviceHandle>> handles;
  auto lease = b->store()->AcquireHandles("default", keys, 0, &handles, {.memory_only = true});
  ASSERT_OK(lease);
  EXPECT_THAT(handles[0].status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(b->store()->remote_stats().hits, 0u) << "memory_only must not contact the cluster";
  EXPECT_EQ(b->store()->Prefetch(keys), 1u);
  // 8 was looked up and missed: now NOT_FOUND, not "looking".
  handles.clear();
  lease = b->store()->AcquireHandles("default", keys, 0, &handles, {.memory_only = true});
  ASSERT_OK(lease);
  ASSERT_OK(handles[0]) << handles[0].status();
  EXPECT_THAT(handles[1].status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_OK(b->store()->Release("default", *lease));
}

TEST_F(RemoteStoreTest, SummariesOfSharedBlocksAreComputedOnArrival) {
  auto a = MakeNode("a");
  auto b = MakeNode("b");
  const uint64_t pa = a->Register(SmallProfile()), pb = b->Register(SmallProfile());
  PutBlock(a.get(), "default", pa, 11);
  a->store()->WaitPublished();
  std::vector<BlockKey> missing;
  auto summaries = b->store()->GetSummaries(
      {BlockKey{"default", pb, Id(11)}, BlockKey{"default", pb, Id(12)}}, &missing);
  ASSERT_EQ(summaries.size(), 2u);
  EXPECT_EQ(summaries[0], std::to_string(Payload(11)[0]));
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_EQ(missing[0].block_id, Id(12));
}

TEST_F(RemoteStoreTest, CorruptValueIsQuarantinedNeverServed) {
  auto a = MakeNode("a");
  auto b = MakeNode("b");
  const uint64_t pa = a->Register(SmallProfile()), pb = b->Register(SmallProfile());
  PutBlock(a.get(), "default", pa, 21);
  PutBlock(a.get(), "default", pa, 22);
  a->store()->WaitPublished();
  // Flip payload bytes of 21 and header bytes of 22 in Redis itself.
  for (auto [n, offset] : {std::pair<uint64_t, int>{21, 1000}, {22, 5}}) {
    const std::string key = RemoteKeyOf("default", n);
    auto master = cluster_->MasterOf(RedisCluster::KeySlot(key));
    ASSERT_OK(master) << master.status();
    ASSERT_OK(cluster_->Command(*master, {"SETRANGE", key, std::to_string(offset), "XYZ"}));
  }
  for (uint64_t n : {21, 22}) {
    std::string out;
    TierId from;
    absl::Status st = b->store()->Get(BlockKey{"default", pb, Id(n)}, &out, &from);
    EXPECT_THAT(st, StatusIs(absl::StatusCode::kNotFound)) << n;
    EXPECT_TRUE(absl::StartsWith(st.message(), "DATA_LOSS")) << st;
    EXPECT_FALSE(b->store()->Lookup(BlockKey{"default", pb, Id(n)}).present);
    // Deleted from the cluster, so nobody else reads it either.
    const std::string key = RemoteKeyOf("default", n);
    auto master = cluster_->MasterOf(RedisCluster::KeySlot(key));
    ASSERT_OK(master);
    auto exists = cluster_->Command(*master, {"EXISTS", key});
    ASSERT_OK(exists);
    EXPECT_EQ(*exists, "0");
  }
  int listed = 0;
  b->store()->ForEachQuarantined(
      0, [&](const QuarantinedBlock& q) { listed += q.tier == TierId::kRemote; });
  EXPECT_EQ(listed, 2);
  EXPECT_EQ(b->store()->remote_stats().corrupt, 2u);
  EXPECT_EQ(b->warnings().size(), 2u);
  // The writer still has the good bytes and can publish them again.
  std::string out;
  TierId from;
  ASSERT_OK(a->store()->Get(BlockKey{"default", pa, Id(21)}, &out, &from));
  ExpectBytes(out, 21);
}

TEST_F(RemoteStoreTest, ViewManyFetchesTheMissingBlocksTogether) {
  auto a = MakeNode("a");
  auto b = MakeNode("b");
  const uint64_t pa = a->Register(SmallProfile()), pb = b->Register(SmallProfile());
  for (uint64_t n = 30; n < 50; ++n) PutBlock(a.get(), "default", pa, n);
  a->store()->WaitPublished();
  PutBlock(b.get(), "default", pb, 30);  // B holds one itself
  // Block 31's remote copy is corrupt; block 99 exists nowhere.
  const std::string bad = RemoteKeyOf("default", 31);
  auto master = cluster_->MasterOf(RedisCluster::KeySlot(bad));
  ASSERT_OK(master);
  ASSERT_OK(cluster_->Command(*master, {"SETRANGE", bad, "900", "XYZ"}));

  std::vector<BlockKey> keys;
  for (uint64_t n = 30; n < 50; ++n) keys.push_back(BlockKey{"default", pb, Id(n)});
  keys.push_back(BlockKey{"default", pb, Id(99)});
  std::vector<TierId> from;
  auto views = b->store()->ViewMany(keys, &from);
  ASSERT_EQ(views.size(), keys.size());
  ASSERT_EQ(from.size(), keys.size());
  ASSERT_OK(views[0]) << views[0].status();
  EXPECT_NE(from[0], TierId::kRemote);  // its own copy
  EXPECT_THAT(views[1].status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_TRUE(absl::StartsWith(views[1].status().message(), "DATA_LOSS")) << views[1].status();
  for (uint64_t n = 32; n < 50; ++n) {
    const size_t i = n - 30;
    ASSERT_OK(views[i]) << n << ": " << views[i].status();
    EXPECT_EQ(from[i], TierId::kRemote) << n;
    const absl::Span<const uint8_t> bytes = (*views[i])->bytes();
    ExpectBytes(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()), n);
  }
  EXPECT_THAT(views.back().status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_FALSE(absl::StartsWith(views.back().status().message(), "DATA_LOSS"));
  const RemoteTierStats stats = b->store()->remote_stats();
  EXPECT_EQ(stats.hits, 18u);
  EXPECT_EQ(stats.corrupt, 1u);
  EXPECT_EQ(stats.misses, 1u);
  views.clear();
  // Read again within the miss cache: still DATA_LOSS, never the bytes.
  TierId tier;
  auto again = b->store()->View(keys[1], &tier);
  EXPECT_TRUE(absl::StartsWith(again.status().message(), "DATA_LOSS")) << again.status();
  EXPECT_EQ(b->store()->remote_stats().corrupt, 1u);
}

TEST_F(RemoteStoreTest, DeleteRemovesTheSharedCopy) {
  auto a = MakeNode("a");
  auto b = MakeNode("b");
  const uint64_t pa = a->Register(SmallProfile()), pb = b->Register(SmallProfile());
  PutBlock(a.get(), "default", pa, 31);
  a->store()->WaitPublished();
  EXPECT_OK(a->store()->Delete(BlockKey{"default", pa, Id(31)}));
  std::string out;
  TierId from;
  EXPECT_THAT(b->store()->Get(BlockKey{"default", pb, Id(31)}, &out, &from),
              StatusIs(absl::StatusCode::kNotFound));
  // Deleting a block only the cluster had is OK; nowhere at all, NOT_FOUND.
  PutBlock(a.get(), "default", pa, 32);
  a->store()->WaitPublished();
  EXPECT_OK(b->store()->Delete(BlockKey{"default", pb, Id(32)}));
  EXPECT_THAT(b->store()->Delete(BlockKey{"default", pb, Id(32)}),
              StatusIs(absl::StatusCode::kNotFound));
}

bool InCluster(RedisClusterFixture* cluster, const std::string& key) {
  auto master = cluster->MasterOf(RedisCluster::KeySlot(key));
  if (!master.ok()) return false;
  auto exists = cluster->Command(*master, {"EXISTS", key});
  return exists.ok() && *exists == "1";
}

// Holds the first publisher that reaches its SET until released.
struct PublishGate {
  absl::Notification reached, release;
  std::atomic<int> calls{0};
  std::function<void(const BlockKey&)> Hook() {
    return [this](const BlockKey&) {
      if (calls++ != 0) return;
      reached.Notify();
      release.WaitForNotification();
    };
  }
};

TEST_F(RemoteStoreTest, DeleteRacingAPublishInFlightLeavesNoRemoteCopy) {
  PublishGate gate;
  absl::Notification delete_done;
  RemoteTierOptions options;
  options.before_publish_set = [&](const BlockKey& key) {
    gate.reached.Notify();
    // A Delete that does not wait for this publish finishes meanwhile (and
    // the SET below would then re-create the copy it deleted); one that
    // waits cannot finish, and this gives up waiting for it.
    delete_done.WaitForNotificationWithTimeout(absl::Seconds(1));
  };
  auto a = MakeNode("a", options);
  const uint64_t pa = a->Register(SmallProfile());
  PutBlock(a.get(), "default", pa, 60);
  gate.reached.WaitForNotification();  // the publisher has the bytes
  std::thread deleter([&] {
    EXPECT_OK(a->store()->Delete(BlockKey{"default", pa, Id(60)}));
    delete_done.Notify();
  });
  deleter.join();
  a->store()->WaitPublished();
  EXPECT_FALSE(InCluster(cluster_, RemoteKeyOf("default", 60)));
  EXPECT_FALSE(a->store()->Lookup(BlockKey{"default", pa, Id(60)}).present);
}

TEST_F(RemoteStoreTest, DeleteDropsQueuedPublishesOfTheBlock) {
  PublishGate gate;
  RemoteTierOptions options;
  options.publish_threads = 1;
  options.before_publish_set = gate.Hook();
  auto a = MakeNode("a", options);
  const uint64_t pa = a->Register(SmallProfile());
  PutBlock(a.get(), "default", pa, 61);  // its publish holds the only publisher
  gate.reached.WaitForNotification();
  PutBlock(a.get(), "default", pa, 62);  // queued behind it
  EXPECT_EQ(a->store()->remote_stats().publish_queued, 1u);
  EXPECT_OK(a->store()->Delete(BlockKey{"default", pa, Id(62)}));
  EXPECT_EQ(a->store()->remote_stats().publish_cancelled, 1u);
  gate.release.Notify();
  a->store()->WaitPublished();
  EXPECT_TRUE(InCluster(cluster_, RemoteKeyOf("default", 61)));
  EXPECT_FALSE(InCluster(cluster_, RemoteKeyOf("default", 62)));
  EXPECT_EQ(a->store()->remote_stats().published, 1u);
}

TEST_F(RemoteStoreTest, WriteBackPublishesBlocksAsTheyLeaveMemory) {
  RemoteTierOptions options;
  options.policy = PublishPolicy::kWriteBack;
  auto a = MakeNode("a", options, /*host_blocks=*/4);
  auto b = MakeNode("b");
  const uint64_t pa = a->Register(SmallProfile()), pb = b->Register(SmallProfile());
  for (uint64_t n = 70; n < 82; ++n) PutBlock(a.get(), "default", pa, n);
  a->store()->WaitPublished();
  int published = 0, in_memory = 0;
  for (uint64_t n = 70; n < 82; ++n) {
    const BlockLocation where = a->store()->Lookup(BlockKey{"default", pa, Id(n)});
    ASSERT_TRUE(where.present) << n;
    const bool remote = InCluster(cluster_, RemoteKeyOf("default", n));
    // What is still in memory was never sent; what left it was.
    if (where.tier == TierId::kNvme) {
      EXPECT_TRUE(remote) << n;
    } else {
      EXPECT_FALSE(remote) << n;
      ++in_memory;
    }
    published += remote;
  }
  EXPECT_GE(published, 8);  // 4 host slots: at least 8 of 12 went to NVMe
  EXPECT_GT(in_memory, 0);
  EXPECT_EQ(a->store()->remote_stats().published, static_cast<uint64_t>(published));
  // Another daemon reads a written-back block.
  std::string out;
  TierId from;
  ASSERT_OK(b->store()->Get(BlockKey{"default", pb, Id(70)}, &out, &from));
  EXPECT_EQ(from, TierId::kRemote);
  ExpectBytes(out, 70);
}

TEST_F(RemoteStoreTest, WriteBackBufferIsBounded) {
  PublishGate gate;
  RemoteTierOptions options;
  options.policy = PublishPolicy::kWriteBack;
  options.publish_threads = 1;
  options.writeback_buffer_bytes = 2 * kBlockBytes;  // two blocks queued or being sent
  options.before_publish_set = gate.Hook();
  auto a = MakeNode("a", options, /*host_blocks=*/1);
  const uint64_t pa = a->Register(SmallProfile());
  PutBlock(a.get(), "default", pa, 90);
  PutBlock(a.get(), "default", pa, 91);  // 90 leaves memory: its publish holds the publisher
  gate.reached.WaitForNotification();
  PutBlock(a.get(), "default", pa, 92);  // 91 leaves memory: buffered
  PutBlock(a.get(), "default", pa, 93);  // 92 leaves memory: no room, dropped
  RemoteTierStats stats = a->store()->remote_stats();
  EXPECT_EQ(stats.writeback_buffered_bytes, 2 * kBlockBytes);
  EXPECT_EQ(stats.publish_dropped, 1u);
  gate.release.Notify();
  a->store()->WaitPublished();
  stats = a->store()->remote_stats();
  EXPECT_EQ(stats.published, 2u);
  EXPECT_EQ(stats.writeback_buffered_bytes, 0u);
  EXPECT_TRUE(InCluster(cluster_, RemoteKeyOf("default", 91)));
  EXPECT_FALSE(InCluster(cluster_, RemoteKeyOf("default", 92)));
}

TEST_F(RemoteStoreTest, UnreachableClusterIsAMissAndLocalWorkGoesOn) {
  RemoteTierOptions o;
  o.cluster.seeds = {"127.0.0.1:1"};  // nothing listens there
  kvtier::testing::ScopedTempDir dir;
  Node node("unreachable-" + std::to_string(::getpid()), {"127.0.0.1:1"}, o);
  const uint64_t p = node.Register(SmallProfile());
  PutBlock(&node, "default", p, 41);
  node.store()->WaitPublished();
  EXPECT_EQ(node.store()->remote_stats().publish_failed, 1u);
  std::string out;
  TierId from;
  ASSERT_OK(node.store()->Get(BlockKey{"default", p, Id(41)}, &out, &from));
  ExpectBytes(out, 41);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(node.store()->Get(BlockKey{"default", p, Id(42)}, &out, &from),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(node.store()->remote_stats().unavailable, 1u);
}

// Last: it kills a master of the shared cluster (gtest runs tests of a
// suite in order of definition unless shuffled).
TEST_F(RemoteStoreTest, MasterFailureGivesMissesThenHitsAfterFailover) {
  auto a = MakeNode("a");
  RemoteTierOptions no_miss_cache;
  no_miss_cache.miss_cache_ms = 0;
  auto b = MakeNode("b", no_miss_cache);
  const uint64_t pa = a->Register(SmallProfile()), pb = b->Register(SmallProfile());
  for (uint64_t n = 200; n < 230; ++n) PutBlock(a.get(), "default", pa, n);
  a->store()->WaitPublished();
  ASSERT_EQ(a->store()->remote_stats().published, 30u);
  // Pick a master and make sure its replica has the writes.
  const uint16_t slot = RedisCluster::KeySlot(RemoteKeyOf("default", 200));
  auto victim = cluster_->MasterOf(slot);
  ASSERT_OK(victim) << victim.status();
  ASSERT_OK(cluster_->WaitForReplication(std::chrono::seconds(10)));
  ASSERT_OK(cluster_->Kill(*victim));

  // While the master is down: misses for its keys, hits for the others,
  // never wrong bytes, never a hang.
  int misses = 0, hits = 0;
  for (uint64_t n = 200; n < 230; ++n) {
    std::string out;
    TierId from;
    const auto start = std::chrono::steady_clock::now();
    absl::Status st = b->store()->Get(BlockKey{"default", pb, Id(n)}, &out, &from);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3)) << n;
    if (st.ok()) {
      ++hits;
      ExpectBytes(out, n);
    } else {
      EXPECT_THAT(st, StatusIs(absl::StatusCode::kNotFound)) << st;
      ++misses;
    }
  }
  EXPECT_GE(misses, 1) << "block 200 lives on the killed master";
  ASSERT_OK(cluster_->WaitForFailover(slot, *victim, std::chrono::seconds(20)));
  // The client learns the new master on its next refresh; a key may miss
  // once more until then, but within a few seconds every key is served.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (uint64_t n = 200; n < 230; ++n) {
    std::string out;
    TierId from;
    absl::Status st = b->store()->Get(BlockKey{"default", pb, Id(n)}, &out, &from);
    while (!st.ok() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // poll, bounded by deadline
      st = b->store()->Get(BlockKey{"default", pb, Id(n)}, &out, &from);
    }
    ASSERT_OK(st) << n << ": " << st;
    ExpectBytes(out, n);
  }
  EXPECT_EQ(b->store()->remote_stats().hits, 30u);
}

}  // namespace
}  // namespace kvtier::remote
