#include "storage/host/prefaulter.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "storage/host/host_tier.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier {
namespace {

constexpr uint64_t kBytes = uint64_t{9} << 20;  // four and a half chunks

std::unique_ptr<HostTier> OpenTier(const std::string& tag) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  HostTierOptions options;
  options.path = "/dev/shm/kvtier-test-" + std::to_string(getpid()) + "-" + info->name() + tag;
  options.capacity_bytes = kBytes;
  auto tier = HostTier::Open(options);
  EXPECT_OK(tier);
  return tier.ok() ? std::move(*tier) : nullptr;
}

// Pages of `region` mapped in this process now (mincore).
size_t ResidentPages(std::span<std::byte> region) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> v((region.size() + page - 1) / page);
  EXPECT_EQ(::mincore(region.data(), region.size(), v.data()), 0);
  size_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

TEST(PrefaulterTest, PopulatesEveryRegionAndReportsItPerGroup) {
  auto host = OpenTier("-a");
  auto other = OpenTier("-b");
  ASSERT_NE(host, nullptr);
  ASSERT_NE(other, nullptr);
  const size_t pages = kBytes / static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  ASSERT_LT(ResidentPages(host->region()), pages);  // fresh: not all there yet
  Prefaulter prefaulter;
  prefaulter.Add(1, host->region());
  prefaulter.Add(0, other->region());
  prefaulter.Add(7, other->region());  // no such group: ignored
  prefaulter.WaitIdle();
  for (int group : {0, 1}) {
    const PrefaultStats s = prefaulter.stats(group);
    EXPECT_EQ(s.target_bytes, kBytes) << group;
    EXPECT_EQ(s.done_bytes, kBytes) << group;
    EXPECT_EQ(s.failed_bytes, 0u) << group;
    EXPECT_EQ(s.last_error, "") << group;
  }
  EXPECT_EQ(prefaulter.stats(2).target_bytes, 0u);
  EXPECT_EQ(ResidentPages(host->region()), pages);
  EXPECT_EQ(ResidentPages(other->region()), pages);
}

TEST(PrefaulterTest, NeverChangesBytesWrittenBeforeOrDuring) {
  auto host = OpenTier("");
  ASSERT_NE(host, nullptr);
  std::span<std::byte> region = host->region();
  // Half written before, the rest written by a thread while it runs.
  for (size_t i = 0; i < region.size() / 2; ++i) region[i] = std::byte(i * 7 + 1);
  Prefaulter prefaulter;
  std::thread writer([&] {
    for (size_t i = region.size() / 2; i < region.size(); i += 512) {
      region[i] = std::byte(i * 13 + 5);
    }
  });
  prefaulter.Add(1, region);
  writer.join();
  prefaulter.WaitIdle();
  EXPECT_EQ(prefaulter.stats(1).done_bytes, kBytes);
  size_t wrong = 0;
  for (size_t i = 0; i < region.size() / 2; ++i) wrong += region[i] != std::byte(i * 7 + 1);
  for (size_t i = region.size() / 2; i < region.size(); i += 512) {
    wrong += region[i] != std::byte(i * 13 + 5);
  }
  EXPECT_EQ(wrong, 0u);
}

TEST(PrefaulterTest, StopsWhenDestroyedAndKeepsWorkingAfterIdle) {
  auto host = OpenTier("");
  ASSERT_NE(host, nullptr);
  {
    Prefaulter prefaulter;
    prefaulter.WaitIdle();  // nothing queued: returns at once
    prefaulter.Add(1, host->region());
    prefaulter.WaitIdle();
    prefaulter.Add(1, host->region().subspan(0, 4096));  // a second batch after idling
    prefaulter.WaitIdle();
    EXPECT_EQ(prefaulter.stats(1).done_bytes, kBytes + 4096);
    for (int i = 0; i < 50; ++i) prefaulter.Add(1, host->region());
  }  // destroyed with most of that queued: must not hang or touch freed memory
  SUCCEED();
}

}  // namespace
}  // namespace kvtier
