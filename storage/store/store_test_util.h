// The BlockStore test fixture: a store with real parts (RocksDB catalog,
// shared-memory host tier and arena, NVMe files through io_uring) in a
// temp dir, over a FaultInjectionEnv with a manual clock. Host holds 8
// blocks, the arena 4 (of 8 mapped), NVMe 2 files x 32 blocks.
#ifndef KVTIER_STORAGE_STORE_STORE_TEST_UTIL_H_
#define KVTIER_STORAGE_STORE_STORE_TEST_UTIL_H_

#include <unistd.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gpu/cpu/shm_device_ops.h"
#include "gtest/gtest.h"
#include "storage/env/fault_injection_env.h"
#include "storage/env/test_util.h"
#include "storage/store/block_store.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier {

// 2 layers x 2 (k|v) x 2 heads x 16 tokens x 64 dim x fp16 = 16 KiB.
inline ModelProfile SmallProfile() {
  ModelProfile p;
  p.name = "test-model";
  p.revision = "r1";
  p.layers = 2;
  p.kv_heads = 2;
  p.head_dim = 64;
  p.block_size_tokens = 16;
  p.dtype = KvDtype::kFp16;
  return p;
}
constexpr uint64_t kBlockBytes = 16384;

inline std::vector<uint8_t> Payload(uint64_t seed) {
  std::vector<uint8_t> data(kBlockBytes);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < data.size(); i += 8) {
    uint64_t v = rng();
    std::memcpy(&data[i], &v, 8);
  }
  return data;
}

inline std::string Id(uint64_t n) { return "block-" + std::to_string(n); }

// A small store in `dir` over `env` and `device_ops`: 4 device, 8 host and
// 4 staging blocks of kBlockBytes (shared memory named after shm_prefix),
// and 2 NVMe files of nvme_blocks / 2 blocks each, O_DIRECT where the file
// system has it.
inline BlockStoreOptions SmallStoreOptions(const std::string& dir, const std::string& shm_prefix,
                                           Env* env, gpu::DeviceOps* device_ops,
                                           uint64_t nvme_blocks) {
  BlockStoreOptions o;
  o.data_dir = dir;
  o.env = env;
  o.device_ops = device_ops;
  o.device_capacity_bytes = 4 * kBlockBytes;
  o.host_shm_path = shm_prefix + "-host";
  o.host_capacity_bytes = 8 * kBlockBytes;
  o.staging_name = shm_prefix + "-staging";
  o.staging_capacity_bytes = 4 * kBlockBytes;
  o.nvme_dir = dir + "/nvme";
  o.nvme_file_count = 2;
  o.nvme_file_size_bytes = nvme_blocks / 2 * kBlockBytes;
  o.nvme_direct_io = testing::DirectIoSupported(Env::Default(), dir);
  o.nvme_queue_depth = 16;
  return o;
}

class BlockStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    env_ = std::make_unique<FaultInjectionEnv>(Env::Default(), 42);
    env_->SetNowMicros(1'000'000);
    shm_prefix_ = "/dev/shm/kvtier-bst-" + std::to_string(::getpid()) + "-" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name();
    gpu::ShmDeviceOpsOptions arena_options;
    gpu::GpuStatus created = gpu::ShmDeviceOps::Create(shm_prefix_ + "-arena", 8 * kBlockBytes,
                                                       arena_options, &device_ops_);
    ASSERT_OK(created) << created.ToString();
    options_ = SmallStoreOptions(dir_.path(), shm_prefix_, env_.get(), device_ops_.get(), 64);
    options_.nvme_io_threads = 1;
    options_.default_lease_ttl_ms = 1000;
    options_.max_lease_ttl_ms = 10000;
    options_.log_warning = [this](const std::string& message) {
      absl::MutexLock lock(&warnings_mu_);
      warnings_.push_back(message);
    };
    Reopen();
  }

  void Reopen() {
    store_.reset();
    auto store = BlockStore::Open(options_);
    ASSERT_OK(store) << store.status();
    store_ = std::move(*store);
    auto profile = store_->RegisterProfile(SmallProfile(), "default");
    ASSERT_OK(profile) << profile.status();
    profile_id_ = profile->profile.profile_id;
  }

  BlockKey Key(uint64_t n) { return BlockKey{"default", profile_id_, Id(n)}; }

  // The id of SmallProfile() registered by `tenant` (profiles are per
  // tenant: "default"'s profile_id_ is not another tenant's).
  uint64_t ProfileOf(const std::string& tenant) {
    auto profile = store_->RegisterProfile(SmallProfile(), tenant);
    EXPECT_OK(profile) << profile.status();
    return profile.ok() ? profile->profile.profile_id : 0;
  }

  void ExpectReadable(uint64_t n) {
    std::string out;
    TierId from;
    absl::Status st = store_->Get(Key(n), &out, &from);
    ASSERT_OK(st) << "block " << n << ": " << st;
    std::vector<uint8_t> want = Payload(n);
    ASSERT_EQ(out.size(), want.size());
    EXPECT_EQ(std::memcmp(out.data(), want.data(), want.size()), 0) << "block " << n;
  }

  void ExpectWithinCapacity() {
    BlockStoreStats stats = store_->Stats();
    for (const TierUsage& t : stats.tiers) {
      EXPECT_LE(t.used_bytes, t.capacity_bytes) << TierName(t.tier);
    }
  }

  std::vector<std::string> Warnings() {
    absl::MutexLock lock(&warnings_mu_);
    return warnings_;
  }

  testing::ScopedTempDir dir_;
  absl::Mutex warnings_mu_;
  std::vector<std::string> warnings_;
  std::unique_ptr<FaultInjectionEnv> env_;
  std::string shm_prefix_;
  std::unique_ptr<gpu::ShmDeviceOps> device_ops_;
  BlockStoreOptions options_;
  std::unique_ptr<BlockStore> store_;
  uint64_t profile_id_ = 0;
};

}  // namespace kvtier

#endif  // KVTIER_STORAGE_STORE_STORE_TEST_UTIL_H_
