#include "gpu/host_regions.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::gpu {
namespace {

// Fake host addresses: the class never dereferences them.
void* At(uintptr_t address) { return reinterpret_cast<void*>(address); }

TEST(HostRegionsTest, RefusesOverlapsAcrossKindsAndStates) {
  HostRegions regions;
  ASSERT_OK(regions.AddAllocation(At(0x10000), 0x1000));
  GpuStatus status = regions.BeginRegister(At(0x10800), 0x1000);
  EXPECT_EQ(status.code, GpuStatus::kInvalidArgument);
  EXPECT_NE(status.message.find("AllocHost"), std::string::npos) << status.message;
  ASSERT_OK(regions.BeginRegister(At(0x20000), 0x2000));
  // A reservation that is still being pinned already blocks overlaps.
  status = regions.BeginRegister(At(0x21000), 0x2000);
  EXPECT_NE(status.message.find("registered range"), std::string::npos) << status.message;
  EXPECT_EQ(regions.AddAllocation(At(0x1f000), 0x1001).code, GpuStatus::kInvalidArgument);
  // Adjacent on both sides is fine.
  EXPECT_OK(regions.BeginRegister(At(0x22000), 0x1000));
  EXPECT_OK(regions.AddAllocation(At(0x1f000), 0x1000));
  EXPECT_EQ(regions.BeginRegister(nullptr, 16).code, GpuStatus::kInvalidArgument);
  EXPECT_EQ(regions.BeginRegister(At(0x90000), 0).code, GpuStatus::kInvalidArgument);
  EXPECT_EQ(regions.BeginRegister(At(UINTPTR_MAX - 8), 64).code, GpuStatus::kInvalidArgument);
  EXPECT_EQ(regions.size(), 4u);
}

TEST(HostRegionsTest, TwoPhaseRegistrationAndUnregistration) {
  HostRegions regions;
  ASSERT_OK(regions.BeginRegister(At(0x10000), 0x1000));
  uintptr_t end = 0;
  EXPECT_EQ(regions.RegionOf(0x10000, &end), 0u) << "a range being pinned is no copy's region";
  EXPECT_EQ(regions.BeginUnregister(At(0x10000)).code, GpuStatus::kInvalidArgument)
      << "not yet registered";
  regions.CommitRegister(At(0x10000));
  EXPECT_EQ(regions.RegionOf(0x10fff, &end), 0x10000u);
  EXPECT_EQ(end, 0x11000u);

  ASSERT_OK(regions.BeginUnregister(At(0x10000)));
  EXPECT_EQ(regions.BeginUnregister(At(0x10000)).code, GpuStatus::kInvalidArgument)
      << "a second unregistration of the same range must wait for the first";
  EXPECT_EQ(regions.BeginRegister(At(0x10000), 0x10).code, GpuStatus::kInvalidArgument)
      << "the range is still pinned until unpinning finishes";
  regions.FinishUnregister(At(0x10000), /*unpinned=*/false);  // unpinning failed
  EXPECT_EQ(regions.RegionOf(0x10000, &end), 0x10000u);
  ASSERT_OK(regions.BeginUnregister(At(0x10000)));
  regions.FinishUnregister(At(0x10000), /*unpinned=*/true);
  EXPECT_EQ(regions.size(), 0u);

  ASSERT_OK(regions.BeginRegister(At(0x30000), 0x1000));
  regions.AbortRegister(At(0x30000));
  EXPECT_EQ(regions.size(), 0u);
  EXPECT_EQ(regions.BeginUnregister(At(0x30000)).code, GpuStatus::kInvalidArgument);

  ASSERT_OK(regions.AddAllocation(At(0x40000), 0x100));
  EXPECT_EQ(regions.BeginUnregister(At(0x40000)).code, GpuStatus::kInvalidArgument)
      << "an AllocHost buffer is not a registration";
  uint64_t size = 0;
  ASSERT_OK(regions.RemoveAllocation(At(0x40000), &size));
  EXPECT_EQ(size, 0x100u);
  EXPECT_EQ(regions.RemoveAllocation(At(0x40000), &size).code, GpuStatus::kInvalidArgument);
}

TEST(HostRegionsTest, RegionOfOutsideNamesTheNextRegion) {
  HostRegions regions;
  ASSERT_OK(regions.AddAllocation(At(0x10000), 0x1000));
  uintptr_t end = 0;
  EXPECT_EQ(regions.RegionOf(0x8000, &end), 0u);
  EXPECT_EQ(end, 0x10000u);
  EXPECT_EQ(regions.RegionOf(0x11000, &end), 0u);
  EXPECT_EQ(end, UINTPTR_MAX);
}

std::vector<PlannedCopy> Plan(const HostRegions& regions,
                              const std::vector<HostToArenaCopy>& copies, std::byte* arena) {
  std::vector<PlannedCopy> plan;
  for (const HostToArenaCopy& c : copies) {
    PlanCopy(regions, {arena + c.dst_offset, c.src, c.size_bytes, /*host_is_src=*/true}, &plan);
  }
  return plan;
}

TEST(PlanCopyTest, MergesOnlyInsideOneRegion) {
  HostRegions regions;
  ASSERT_OK(regions.BeginRegister(At(0x10000), 0x1000));
  regions.CommitRegister(At(0x10000));
  ASSERT_OK(regions.BeginRegister(At(0x11000), 0x1000));
  regions.CommitRegister(At(0x11000));
  std::byte* arena = static_cast<std::byte*>(At(0x7000000));

  // Contiguous on both sides, inside the first registration: one copy.
  auto plan = Plan(regions, {{At(0x10000), 0, 0x800}, {At(0x10800), 0x800, 0x800}}, arena);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].size_bytes, 0x1000u);
  EXPECT_EQ(plan[0].region, 0x10000u);

  // Contiguous on both sides but across the two registrations: two copies.
  plan = Plan(regions, {{At(0x10800), 0, 0x800}, {At(0x11000), 0x800, 0x800}}, arena);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].region, 0x10000u);
  EXPECT_EQ(plan[1].region, 0x11000u);

  // One copy spanning both registrations and pageable memory after them is
  // cut at each boundary, with the arena side following along.
  plan = Plan(regions, {{At(0x10f00), 0x100, 0x1200}}, arena);
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].src, At(0x10f00));
  EXPECT_EQ(plan[0].size_bytes, 0x100u);
  EXPECT_EQ(plan[1].src, At(0x11000));
  EXPECT_EQ(plan[1].dst, arena + 0x200);
  EXPECT_EQ(plan[1].size_bytes, 0x1000u);
  EXPECT_EQ(plan[2].src, At(0x12000));
  EXPECT_EQ(plan[2].size_bytes, 0x100u);
  EXPECT_EQ(plan[2].region, 0u);

  // Memory outside every region is never merged, and empty copies vanish.
  plan = Plan(regions, {{At(0x50000), 0, 0x100}, {At(0x50100), 0x100, 0x100}, {nullptr, 0x300, 0}},
              arena);
  ASSERT_EQ(plan.size(), 2u);
  // Not contiguous in the arena: not merged even inside one region.
  plan = Plan(regions, {{At(0x10000), 0, 0x100}, {At(0x10100), 0x400, 0x100}}, arena);
  EXPECT_EQ(plan.size(), 2u);
}

TEST(PlanCopyTest, ArenaToHostFollowsTheDestination) {
  HostRegions regions;
  ASSERT_OK(regions.AddAllocation(At(0x10000), 0x1000));
  ASSERT_OK(regions.AddAllocation(At(0x11000), 0x1000));
  const std::byte* arena = static_cast<const std::byte*>(At(0x7000000));
  std::vector<PlannedCopy> plan;
  PlanCopy(regions, {At(0x10000), arena, 0x800, /*host_is_src=*/false}, &plan);
  PlanCopy(regions, {At(0x10800), arena + 0x800, 0x1000, /*host_is_src=*/false}, &plan);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].size_bytes, 0x1000u);  // merged up to the allocation's end
  EXPECT_EQ(plan[1].dst, At(0x11000));
  EXPECT_EQ(plan[1].src, arena + 0x1000);
  EXPECT_EQ(plan[1].size_bytes, 0x800u);
}

}  // namespace
}  // namespace kvtier::gpu
