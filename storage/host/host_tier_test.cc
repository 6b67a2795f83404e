#include "storage/host/host_tier.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "gpu/cpu/shm_device_ops.h"
#include "gtest/gtest.h"
#include "storage/host/gpu_status.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier {
namespace {

using testing::StatusIs;

constexpr uint64_t kCapacity = 64 * 4096;

std::string ShmPath(const std::string& tag) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return "/dev/shm/kvtier-test-" + std::to_string(getpid()) + "-" + info->name() + "-" + tag;
}

std::unique_ptr<HostTier> OpenTier(const std::string& path, uint64_t capacity = kCapacity,
                                   gpu::DeviceOps* ops = nullptr) {
  HostTierOptions options;
  options.path = path;
  options.capacity_bytes = capacity;
  options.device_ops = ops;
  auto tier = HostTier::Open(options);
  EXPECT_OK(tier);
  return tier.ok() ? std::move(*tier) : nullptr;
}

TEST(HostTierTest, SlotBytesAreSharedWithAnotherMappingOfTheFile) {
  auto tier = OpenTier(ShmPath("host"));
  ASSERT_NE(tier, nullptr);
  auto slot = tier->Allocate(10000);
  ASSERT_OK(slot);
  EXPECT_EQ(slot->offset % 4096, 0u);
  EXPECT_EQ(slot->size_bytes, 10000u);
  EXPECT_NE(slot->generation, 0u);

  // A client maps the file and writes the block into its slot (zero-copy put).
  const int fd = open(tier->path().c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  void* client = mmap(nullptr, kCapacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(client, MAP_FAILED);
  std::memset(static_cast<char*>(client) + slot->offset, 0x42, slot->size_bytes);

  auto data = tier->Data(*slot);
  ASSERT_OK(data);
  ASSERT_EQ(data->size(), 10000u);
  for (std::byte b : *data) ASSERT_EQ(b, std::byte{0x42});
  munmap(client, kCapacity);
}

TEST(HostTierTest, CapacityIsAHardLimit) {
  auto tier = OpenTier(ShmPath("host"));
  std::vector<HostSlot> slots;
  for (int i = 0; i < 16; ++i) {
    auto slot = tier->Allocate(4 * 4096 - 1);  // rounds up to 4 pages
    ASSERT_OK(slot) << i << ": " << slot.status();
    slots.push_back(*slot);
  }
  HostTierStats stats = tier->stats();
  EXPECT_EQ(stats.capacity_bytes, kCapacity);
  EXPECT_EQ(stats.used_bytes, kCapacity);
  EXPECT_EQ(stats.live_slots, 16u);
  EXPECT_EQ(stats.largest_free_bytes, 0u);

  auto full = tier->Allocate(1);
  EXPECT_THAT(full, StatusIs(absl::StatusCode::kResourceExhausted)) << full.status();
  EXPECT_THAT(tier->Allocate(kCapacity + 1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(tier->Allocate(0), StatusIs(absl::StatusCode::kInvalidArgument));

  ASSERT_OK(tier->Free(slots[3]));
  auto again = tier->Allocate(4 * 4096);
  ASSERT_OK(again);
  EXPECT_EQ(again->offset, slots[3].offset);
  EXPECT_NE(again->generation, slots[3].generation);
}

TEST(HostTierTest, StaleSlotsAreDetected) {
  auto tier = OpenTier(ShmPath("host"));
  auto first = tier->Allocate(4096);
  ASSERT_OK(first);
  ASSERT_TRUE(tier->IsLive(*first));
  ASSERT_OK(tier->Free(*first));
  EXPECT_FALSE(tier->IsLive(*first));
  EXPECT_THAT(tier->Free(*first), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(tier->Data(*first), StatusIs(absl::StatusCode::kFailedPrecondition));

  auto second = tier->Allocate(4096);  // same place, new generation
  ASSERT_OK(second);
  ASSERT_EQ(second->offset, first->offset);
  EXPECT_FALSE(tier->IsLive(*first));
  EXPECT_THAT(tier->Data(*first), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_OK(tier->Data(*second));

  HostSlot wrong_size = *second;
  wrong_size.size_bytes = 100;
  EXPECT_FALSE(tier->IsLive(wrong_size));
  EXPECT_THAT(tier->Free(wrong_size), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(tier->IsLive(*second)) << "refused Free changed state";
}

TEST(HostTierTest, BadOptionsNameTheField) {
  HostTierOptions options;
  options.path = ShmPath("host");
  options.capacity_bytes = 4096 * 3 + 1;
  auto tier = HostTier::Open(options);
  EXPECT_THAT(tier, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(tier.status().message().find("capacity_bytes"), absl::string_view::npos);

  options.capacity_bytes = 4096;
  options.alignment_bytes = 3000;
  tier = HostTier::Open(options);
  EXPECT_THAT(tier, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(tier.status().message().find("alignment_bytes"), absl::string_view::npos);

  options.alignment_bytes = 4096;
  options.path = "/dev/shm/kvtier-no-such-dir/host";
  EXPECT_THAT(HostTier::Open(options), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(HostTierTest, PinsItsRegionAndFeedsDeviceCopies) {
  std::unique_ptr<gpu::DeviceOps> ops;
  ASSERT_OK(gpu::NewShmDeviceOps(ShmPath("arena"), 1 << 20, {}, &ops));
  auto tier = OpenTier(ShmPath("host"), kCapacity, ops.get());
  ASSERT_NE(tier, nullptr);
  // The region is registered: registering it again overlaps.
  std::span<std::byte> region = tier->region();
  EXPECT_EQ(ops->RegisterHost(region.data(), 4096).code, gpu::GpuStatus::kInvalidArgument);

  auto slot = tier->Allocate(8192);
  ASSERT_OK(slot);
  auto data = tier->Data(*slot);
  ASSERT_OK(data);
  for (size_t i = 0; i < data->size(); ++i) (*data)[i] = static_cast<std::byte>(i % 251);
  const gpu::HostToArenaCopy up{data->data(), 4096, data->size()};
  ASSERT_OK(ops->CopyToArena({&up, 1}));
  std::vector<std::byte> back;
  ASSERT_OK(ops->ReadArena(4096, 8192, &back));
  EXPECT_EQ(std::memcmp(back.data(), data->data(), 8192), 0);

  void* base = region.data();
  tier.reset();
  EXPECT_EQ(ops->UnregisterHost(base).code, gpu::GpuStatus::kInvalidArgument)
      << "tier did not unpin its region";
}

TEST(HostTierTest, ConcurrentAllocateWriteFree) {
  auto tier = OpenTier(ShmPath("host"), 256 * 4096);
  constexpr int kThreads = 4;
  constexpr int kRounds = 500;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        const uint64_t size = 1 + static_cast<uint64_t>((t * 7919 + i * 104729) % (8 * 4096));
        auto slot = tier->Allocate(size);
        if (!slot.ok()) {
          failures++;
          continue;
        }
        auto data = tier->Data(*slot);
        const auto mark = static_cast<std::byte>(t + 1);
        std::memset(data->data(), static_cast<int>(mark), data->size());
        for (std::byte b : *data) {
          if (b != mark) {
            failures++;
            break;
          }
        }
        if (!tier->Free(*slot).ok()) failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(tier->stats().used_bytes, 0u);
  EXPECT_EQ(tier->stats().live_slots, 0u);
  EXPECT_EQ(tier->stats().largest_free_bytes, 256u * 4096);
}

TEST(GpuStatusTest, MapsEveryCode) {
  using gpu::GpuStatus;
  EXPECT_OK(GpuToStatus(GpuStatus::Ok()));
  const std::pair<GpuStatus::Code, absl::StatusCode> cases[] = {
      {GpuStatus::kInvalidArgument, absl::StatusCode::kInvalidArgument},
      {GpuStatus::kOutOfMemory, absl::StatusCode::kResourceExhausted},
      {GpuStatus::kUnavailable, absl::StatusCode::kUnavailable},
      {GpuStatus::kDeadlineExceeded, absl::StatusCode::kDeadlineExceeded},
      {GpuStatus::kInternal, absl::StatusCode::kInternal},
  };
  for (const auto& [from, to] : cases) {
    absl::Status s = GpuToStatus(GpuStatus::Error(from, "why"));
    EXPECT_EQ(s.code(), to);
    EXPECT_EQ(s.message(), "why");
  }
}

}  // namespace
}  // namespace kvtier
