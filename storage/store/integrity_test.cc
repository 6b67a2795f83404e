// Integrity of every copy: damaged bytes in the host tier's shared memory,
// the device arena's file or an NVMe file are detected on read, on
// promotion and demotion, and by Verify; the block is quarantined, never
// served, logged, counted and listed, whoever found it. The sweep flips,
// zeroes and truncates at random (KVTIER_SWEEP_ROUNDS scales it up).
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/store/block_store.h"
#include "storage/store/store_test_util.h"
#include "tests/testutil/status_matchers.h"

using ::kvtier::testing::StatusIs;

namespace kvtier {
namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Offsets in `path` where the payload of block n starts (its first 64
// bytes are random, so a match is its copy).
std::vector<uint64_t> FindCopies(const std::string& path, uint64_t n) {
  const std::string file = ReadFile(path);
  const std::vector<uint8_t> payload = Payload(n);
  const std::string head(reinterpret_cast<const char*>(payload.data()), 64);
  std::vector<uint64_t> out;
  for (size_t at = file.find(head); at != std::string::npos; at = file.find(head, at + 1)) {
    out.push_back(at);
  }
  return out;
}

// Overwrites `len` bytes at offset with `fill` (or flips one byte when
// len == 1 and fill < 0).
void Damage(const std::string& path, uint64_t offset, uint64_t len, int fill) {
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  std::string bytes(len, '\0');
  ASSERT_EQ(::pread(fd, bytes.data(), len, static_cast<off_t>(offset)), static_cast<ssize_t>(len));
  if (fill < 0) {
    bytes[0] = static_cast<char>(bytes[0] ^ 0x20);
  } else {
    bytes.assign(len, static_cast<char>(fill));
  }
  ASSERT_EQ(::pwrite(fd, bytes.data(), len, static_cast<off_t>(offset)), static_cast<ssize_t>(len));
  ::close(fd);
}

class IntegrityTest : public BlockStoreTest {
 protected:
  std::string HostPath() const { return options_.host_shm_path; }
  std::string ArenaPath() const { return shm_prefix_ + "-arena"; }
  std::string NvmePath(int f) const {
    return options_.nvme_dir + "/nvme-00" + std::to_string(f) + ".dat";
  }

  void ExpectQuarantinedRead(uint64_t n) {
    std::string out;
    TierId from;
    absl::Status st = store_->Get(Key(n), &out, &from);
    EXPECT_THAT(st, StatusIs(absl::StatusCode::kNotFound)) << n << ": " << st;
    EXPECT_THAT(st.message(), HasSubstr("DATA_LOSS"));
    EXPECT_TRUE(out.empty());
  }

  std::vector<QuarantinedBlock> Quarantined() {
    std::vector<QuarantinedBlock> out;
    store_->ForEachQuarantined(0, [&](const QuarantinedBlock& q) { out.push_back(q); });
    return out;
  }

  uint64_t VerifyCorrupt() {
    uint64_t corrupt = 0;
    absl::Status st = store_->Verify(
        0, [&](uint64_t, uint64_t, const BlockKey* bad) { corrupt += bad != nullptr; });
    EXPECT_OK(st) << st;
    return corrupt;
  }
};

TEST_F(IntegrityTest, DamagedHostCopyIsNeverServedAndIsReported) {
  ASSERT_OK(store_->Put(Key(1), Payload(1)));
  std::vector<uint64_t> at = FindCopies(HostPath(), 1);
  ASSERT_EQ(at.size(), 1u);
  Damage(HostPath(), at[0] + 5000, 1, -1);
  ExpectQuarantinedRead(1);
  EXPECT_FALSE(store_->Lookup(Key(1)).present);
  BlockStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.quarantined_blocks, 1u);
  EXPECT_EQ(stats.checksum_failures[static_cast<int>(TierId::kHost)], 1u);
  std::vector<QuarantinedBlock> q = Quarantined();
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(q[0].key.block_id, Id(1));
  EXPECT_EQ(q[0].tier, TierId::kHost);
  EXPECT_THAT(q[0].location, HasSubstr("host slot"));
  EXPECT_GT(q[0].found_micros, 0);
  // The warning names tenant, profile, id (hex), tier and location.
  std::vector<std::string> warnings = Warnings();
  ASSERT_FALSE(warnings.empty());
  EXPECT_THAT(warnings.back(), HasSubstr(absl::BytesToHexString(Id(1))));
  EXPECT_THAT(warnings.back(), HasSubstr("host copy"));
  EXPECT_THAT(warnings.back(), HasSubstr("tenant \"default\""));
  EXPECT_THAT(warnings.back(), HasSubstr("host slot @"));
  // The correct bytes restore it.
  ASSERT_OK(store_->Put(Key(1), Payload(1)));
  ExpectReadable(1);
  EXPECT_EQ(store_->Stats().quarantined_blocks, 0u);
}

TEST_F(IntegrityTest, DamagedHostCopyIsNotDemotedToNvme) {
  ASSERT_OK(store_->Put(Key(0), Payload(0)));
  std::vector<uint64_t> at = FindCopies(HostPath(), 0);
  ASSERT_EQ(at.size(), 1u);
  Damage(HostPath(), at[0] + 100, 1, -1);
  // Filling the host tier demotes block 0 (least recently used) to NVMe:
  // the demotion checks what it writes.
  for (int i = 1; i < 12; ++i) ASSERT_OK(store_->Put(Key(i), Payload(i))) << i;
  EXPECT_EQ(store_->Stats().quarantined_blocks, 1u);
  for (int f = 0; f < 2; ++f) EXPECT_TRUE(FindCopies(NvmePath(f), 0).empty());
  ExpectQuarantinedRead(0);
  for (int i = 1; i < 12; ++i) ExpectReadable(i);
}

TEST_F(IntegrityTest, DamagedHostCopyIsNotPromotedToTheArena) {
  ASSERT_OK(store_->Put(Key(2), Payload(2)));
  std::vector<uint64_t> at = FindCopies(HostPath(), 2);
  ASSERT_EQ(at.size(), 1u);
  Damage(HostPath(), at[0] + 9000, 4096 - 9000 % 4096, 0);
  std::vector<absl::StatusOr<DeviceHandle>> handles;
  auto lease = store_->AcquireHandles("default", {Key(2)}, 1000, &handles);
  ASSERT_OK(lease);
  EXPECT_EQ(*lease, 0u) << "nothing pinned";
  ASSERT_EQ(handles.size(), 1u);
  EXPECT_THAT(handles[0].status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(handles[0].status().message(), HasSubstr("DATA_LOSS"));
  EXPECT_TRUE(FindCopies(ArenaPath(), 2).empty());
}

TEST_F(IntegrityTest, DamagedArenaCopyIsNeverServed) {
  ASSERT_OK(store_->Put(Key(3), Payload(3)));
  std::vector<absl::StatusOr<DeviceHandle>> handles;
  auto lease = store_->AcquireHandles("default", {Key(3)}, 1000, &handles);
  ASSERT_TRUE(lease.ok() && *lease != 0);
  ASSERT_OK(store_->Release("default", *lease));
  // Drop the host copy so the arena copy is the one read: fill the host.
  for (int i = 10; i < 20; ++i) ASSERT_OK(store_->Put(Key(i), Payload(i)));
  std::vector<uint64_t> at = FindCopies(ArenaPath(), 3);
  ASSERT_EQ(at.size(), 1u);
  Damage(ArenaPath(), at[0] + 12345, 1, -1);
  if (FindCopies(HostPath(), 3).empty()) {
    ExpectQuarantinedRead(3);
  } else {
    EXPECT_EQ(VerifyCorrupt(), 1u) << "Verify checks the arena copy too";
  }
  std::vector<QuarantinedBlock> q = Quarantined();
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(q[0].tier, TierId::kDevice);
}

TEST_F(IntegrityTest, VerifyChecksEveryCopyAndListsEarlierQuarantines) {
  ASSERT_OK(store_->Put(Key(1), Payload(1), {.durable = true}));  // host + NVMe
  ASSERT_OK(store_->Put(Key(2), Payload(2)));                     // host only
  ASSERT_OK(store_->Put(Key(3), Payload(3), {.durable = true}));
  // Block 3's NVMe copy is damaged and found by a read after a restart.
  Reopen();
  ASSERT_OK(store_->Put(Key(2), Payload(2)));
  bool damaged = false;
  for (int f = 0; f < 2; ++f) {
    for (uint64_t at : FindCopies(NvmePath(f), 3)) {
      Damage(NvmePath(f), at + 777, 1, -1);
      damaged = true;
    }
  }
  ASSERT_TRUE(damaged);
  ExpectQuarantinedRead(3);
  // Block 2's host copy is damaged and found by Verify.
  std::vector<uint64_t> at = FindCopies(HostPath(), 2);
  ASSERT_EQ(at.size(), 1u);
  Damage(HostPath(), at[0] + 1, 1, -1);
  EXPECT_EQ(VerifyCorrupt(), 1u);
  std::vector<QuarantinedBlock> q = Quarantined();
  ASSERT_EQ(q.size(), 2u) << "both, whoever found them";
  EXPECT_EQ(VerifyCorrupt(), 0u) << "nothing new";
  EXPECT_EQ(Quarantined().size(), 2u);
  EXPECT_EQ(store_->Stats().quarantined_blocks, 2u);
  ExpectReadable(1);
  // After a restart the persisted verdicts are still listed.
  Reopen();
  q = Quarantined();
  EXPECT_EQ(q.size(), 1u) << "block 3's verdict was persisted; block 2 was never durable";
  // A quarantined block can be deleted.
  ASSERT_OK(store_->Delete(Key(3)));
  EXPECT_EQ(store_->Stats().quarantined_blocks, 0u);
}

// Random damage in every tier with a file or shm backing. Each round stores
// blocks spread over host, arena and NVMe, damages some copies (a flipped
// byte, a zeroed 4 KiB sector, or a zeroed tail as a torn/truncated
// extent), then reads everything and runs Verify: every damaged block is
// quarantined and reported and never served; every other block reads back
// exactly.
TEST_F(IntegrityTest, RandomDamageSweep) {
  const char* env_rounds = std::getenv("KVTIER_SWEEP_ROUNDS");
  const int rounds = env_rounds != nullptr ? std::atoi(env_rounds) : 10;
  std::mt19937_64 rng(20261202);
  uint64_t damaged_total = 0, detected_total = 0;
  uint64_t kinds[3] = {0, 0, 0};
  for (int round = 0; round < rounds; ++round) {
    const uint64_t base = 1000 * (round + 1);
    auto key = [&](uint64_t i) { return Key(base + i); };
    const int n = 24;
    for (int i = 0; i < n; ++i) {
      ASSERT_OK(store_->Put(key(i), Payload(base + i), {.durable = i % 3 != 0}));
    }
    std::vector<absl::StatusOr<DeviceHandle>> handles;
    auto lease = store_->AcquireHandles("default", {key(n - 1), key(n - 2)}, 1000, &handles);
    ASSERT_OK(lease);
    if (*lease != 0) ASSERT_OK(store_->Release("default", *lease));
    // Damage every copy of a random third of the blocks.
    std::vector<bool> damaged(n, false);
    for (int i = 0; i < n; ++i) {
      if (rng() % 3 != 0) continue;
      bool any = false;
      for (const std::string& path : {HostPath(), ArenaPath(), NvmePath(0), NvmePath(1)}) {
        for (uint64_t at : FindCopies(path, base + i)) {
          const int kind = static_cast<int>(rng() % 3);
          const uint64_t sector = rng() % (kBlockBytes / 4096);
          if (kind == 0) {
            Damage(path, at + rng() % kBlockBytes, 1, -1);
          } else if (kind == 1) {
            Damage(path, at + sector * 4096, 4096, 0);
          } else {
            Damage(path, at + kBlockBytes / 2, kBlockBytes / 2, 0);
          }
          ++kinds[kind];
          any = true;
        }
      }
      damaged[i] = any;
      damaged_total += any;
    }
    for (int i = 0; i < n; ++i) {
      std::string out;
      TierId from;
      absl::Status st = store_->Get(key(i), &out, &from);
      if (damaged[i]) {
        EXPECT_THAT(st, StatusIs(absl::StatusCode::kNotFound))
            << "round " << round << " block " << i;
        EXPECT_TRUE(out.empty());
      } else {
        ASSERT_OK(st) << st;
        std::vector<uint8_t> want = Payload(base + i);
        EXPECT_EQ(std::memcmp(out.data(), want.data(), want.size()), 0);
      }
    }
    VerifyCorrupt();
    uint64_t listed = 0;
    for (const QuarantinedBlock& q : Quarantined()) {
      for (int i = 0; i < n; ++i) listed += q.key == key(i) && damaged[i];
    }
    detected_total += listed;
    // Clean up so the next round starts with room (no eviction).
    for (int i = 0; i < n; ++i) ASSERT_OK(store_->Delete(key(i))) << i;
    EXPECT_EQ(store_->Stats().quarantined_blocks, 0u);
  }
  EXPECT_EQ(detected_total, damaged_total);
  EXPECT_GT(damaged_total, static_cast<uint64_t>(rounds) * 3);
  std::printf(
      "sweep: %d rounds, %llu damaged blocks (%llu flips, %llu zeroed sectors, %llu "
      "torn tails), %llu detected and listed\n",
      rounds, static_cast<unsigned long long>(damaged_total),
      static_cast<unsigned long long>(kinds[0]), static_cast<unsigned long long>(kinds[1]),
      static_cast<unsigned long long>(kinds[2]), static_cast<unsigned long long>(detected_total));
}

}  // namespace
}  // namespace kvtier
