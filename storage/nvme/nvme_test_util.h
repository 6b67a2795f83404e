// Test-only helpers shared by the NVMe tier tests.
#ifndef KVTIER_STORAGE_NVME_NVME_TEST_UTIL_H_
#define KVTIER_STORAGE_NVME_NVME_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "storage/env/test_util.h"
#include "storage/nvme/nvme_tier.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::testing {

// Deterministic pseudo-random bytes.
inline std::vector<uint8_t> RandomBytes(uint64_t size_bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> bytes(size_bytes);
  for (uint64_t i = 0; i < size_bytes; i += 8) {
    const uint64_t word = rng();
    for (uint64_t j = 0; j < 8 && i + j < size_bytes; ++j) {
      bytes[i + j] = static_cast<uint8_t>(word >> (8 * j));
    }
  }
  return bytes;
}

// Small tier options in `dir`, with O_DIRECT where the file system has it.
inline NvmeTierOptions SmallTierOptions(const std::string& dir, Env* env) {
  NvmeTierOptions options;
  options.directory = dir + "/nvme";
  options.num_files = 2;
  options.file_size_bytes = 8 << 20;
  options.queue_depth = 8;
  options.io_threads = 2;
  options.max_block_bytes = 2 << 20;
  options.staging_bytes = 8 << 20;
  options.env = env;
  options.use_odirect = DirectIoSupported(Env::Default(), dir);
  return options;
}

// A test with one NvmeTier on SmallTierOptions in a scratch directory,
// over env() (Env::Default(); a fixture may return its own). SetUp opens
// it; Reopen() closes and opens it again with options_.
class NvmeTierFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    options_ = SmallTierOptions(dir_.path(), env());
    Reopen();
  }
  virtual Env* env() { return nullptr; }

  void Reopen() {
    tier_.reset();
    auto tier = NvmeTier::Open(options_);
    ASSERT_OK(tier) << tier.status();
    tier_ = std::move(tier).value();
  }

  ScopedTempDir dir_{"nvme"};
  NvmeTierOptions options_;
  std::unique_ptr<NvmeTier> tier_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_STORAGE_NVME_NVME_TEST_UTIL_H_
