// DeviceOps conformance: one test body, run against every implementation:
//   ShmSync        shared-memory arena, copies inside Submit*
//   ShmAsync       shared-memory arena, copies on one worker thread, in order
//   ShmOutOfOrder  shared-memory arena, one worker per direction, so fences
//                  of the two directions complete in any order (as on CUDA)
//   Cuda           cudaMalloc arena (skips without a CUDA device or CUDA build)
// Each test asserts the contract written in gpu/device_ops.h.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "gpu/cpu/shm_device_ops.h"
#include "gpu/cuda/cuda_device_ops.h"
#include "gpu/device_ops.h"
#include "gtest/gtest.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::gpu {
namespace {

constexpr uint64_t kArenaBytes = 4 << 20;
constexpr std::chrono::milliseconds kShortWait{2};

struct Instance {
  std::unique_ptr<DeviceOps> ops;
  std::function<void(bool)> pause;  // null: copies finish inside Submit*
  // Pauses one direction (null when pause is).
  std::function<void(CopyDirection, bool)> pause_direction;
  std::string skip;          // non-empty: the implementation is absent here
  bool pinned_host = false;  // AllocHost returns pinned memory
  // The directions run apart: a paused one holds back only its own batches.
  bool independent_directions = false;
};

struct Implementation {
  std::string name;
  std::function<Instance(const std::string& tag, uint32_t max_inflight)> make;
};

// gtest prints parameters in failure messages and test listings.
void PrintTo(const Implementation& implementation, std::ostream* os) { *os << implementation.name; }

std::string ShmPath(const std::string& tag) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "-" + info->name();
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  return "/dev/shm/kvtier-conformance-" + std::to_string(getpid()) + "-" + name + "-" + tag;
}

Instance MakeShm(bool async, bool out_of_order, const std::string& tag, uint32_t max_inflight) {
  ShmDeviceOpsOptions options;
  options.async_copies = async;
  options.out_of_order = out_of_order;
  options.max_inflight_batches = max_inflight;
  std::unique_ptr<ShmDeviceOps> ops;
  Instance instance;
  GpuStatus status = ShmDeviceOps::Create(ShmPath(tag), kArenaBytes, options, &ops);
  if (!status.ok()) {
    ADD_FAILURE() << status.ToString();
    instance.skip = "shm arena could not be created";
    return instance;
  }
  if (async) {
    ShmDeviceOps* raw = ops.get();
    instance.pause = [raw](bool paused) { raw->PauseCopiesForTesting(paused); };
    instance.pause_direction = [raw](CopyDirection direction, bool paused) {
      raw->PauseDirectionForTesting(direction, paused);
    };
    instance.independent_directions = out_of_order;
  }
  instance.ops = std::move(ops);
  return instance;
}

Instance MakeCuda(const std::string& tag, uint32_t max_inflight) {
  CudaDeviceOpsOptions options;
  options.arena_bytes = kArenaBytes;
  options.max_inflight_batches = max_inflight;
  std::unique_ptr<CudaDeviceOps> ops;
  Instance instance;
  GpuStatus status = CudaDeviceOps::Create(options, &ops);
  if (status.code == GpuStatus::kUnavailable) {
    instance.skip = status.ToString();
    return instance;
  }
  if (!status.ok()) {
    ADD_FAILURE() << status.ToString();
    instance.skip = "CUDA arena could not be created";
    return instance;
  }
  CudaDeviceOps* raw = ops.get();
  instance.pause = [raw](bool paused) { raw->PauseCopiesForTesting(paused); };
  instance.pause_direction = [raw](CopyDirection direction, bool paused) {
    raw->PauseDirectionForTesting(direction, paused);
  };
  instance.independent_directions = true;
  instance.pinned_host = true;
  instance.ops = std::move(ops);
  return instance;
}

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 8));
  return v;
}

class DeviceOpsConformanceTest : public ::testing::TestWithParam<Implementation> {
 protected:
  // Creates an instance or skips the test when the implementation is absent.
  Instance Make(const std::string& tag = "arena", uint32_t max_inflight = 1024) {
    return GetParam().make(tag, max_inflight);
  }

  // Allocates host memory through ops (pinned for CUDA). Left to the
  // DeviceOps destructor to release, which both implementations promise.
  void* HostBuffer(DeviceOps* ops, uint64_t size_bytes) {
    gpu::HostBuffer buffer;
    GpuStatus status = ops->AllocHost(size_bytes, &buffer);
    EXPECT_OK(status) << status.ToString();
    return status.ok() ? buffer.data : nullptr;
  }
};

#define MAKE_OR_SKIP(var, ...)                     \
  Instance var = Make(__VA_ARGS__);                \
  if (!var.skip.empty()) GTEST_SKIP() << var.skip; \
  ASSERT_NE(var.ops, nullptr)

TEST_P(DeviceOpsConformanceTest, DescribesArena) {
  MAKE_OR_SKIP(a, "a");
  MAKE_OR_SKIP(b, "b");
  const ArenaInfo& info = a.ops->arena();
  EXPECT_EQ(info.size_bytes, kArenaBytes);
  EXPECT_NE(info.arena_id, 0u);
  EXPECT_NE(info.arena_id, b.ops->arena().arena_id) << "two arenas share an id";
  if (info.backend == kShmArenaBackend) {
    EXPECT_FALSE(info.shm_path.empty());
  } else {
    EXPECT_EQ(info.backend.rfind("cuda:", 0), 0u) << info.backend;
    EXPECT_EQ(info.ipc_handle.size(), 64u);
    EXPECT_EQ(info.device_uuid.size(), 16u);
    EXPECT_EQ(info.backend, "cuda:" + std::to_string(info.device_ordinal));
    EXPECT_NE(info.ipc_handle, b.ops->arena().ipc_handle);
  }
}

TEST_P(DeviceOpsConformanceTest, FreshArenaReadsAsZeros) {
  MAKE_OR_SKIP(inst);
  std::vector<std::byte> bytes;
  ASSERT_OK(inst.ops->ReadArena(kArenaBytes - 4096, 4096, &bytes));
  EXPECT_EQ(bytes, std::vector<std::byte>(4096, std::byte{0}));
}

TEST_P(DeviceOpsConformanceTest, BatchedCopiesRoundTripAtArenaEdges) {
  MAKE_OR_SKIP(inst);
  const auto a = Pattern(4096, 1), b = Pattern(100, 2), c = Pattern(1, 3);
  const auto adjacent = Pattern(8192, 4);  // two halves that merge
  const HostToArenaCopy in[] = {{a.data(), 0, a.size()},
                                {b.data(), 8192, b.size()},
                                {nullptr, 9000, 0},  // empty copies are allowed
                                {adjacent.data(), 65536, 4096},
                                {adjacent.data() + 4096, 65536 + 4096, 4096},
                                {c.data(), kArenaBytes - 1, 1}};
  ASSERT_OK(inst.ops->CopyToArena(in));

  std::vector<uint8_t> ra(a.size()), rb(b.size()), rc(1), radj(adjacent.size());
  const ArenaToHostCopy out[] = {{0, ra.data(), ra.size()},
                                 {8192, rb.data(), rb.size()},
                                 {65536, radj.data(), 4096},
                                 {65536 + 4096, radj.data() + 4096, 4096},
                                 {kArenaBytes - 1, rc.data(), 1}};
  ASSERT_OK(inst.ops->CopyToHost(out));
  EXPECT_EQ(ra, a);
  EXPECT_EQ(rb, b);
  EXPECT_EQ(rc, c);
  EXPECT_EQ(radj, adjacent);
}

TEST_P(DeviceOpsConformanceTest, ManyScatteredCopiesInOneBatch) {
  MAKE_OR_SKIP(inst);
  constexpr size_t kCopies = 1000, kBytes = 1024, kStride = 4096;
  const auto src = Pattern(kCopies * kBytes, 9);
  std::vector<HostToArenaCopy> in;
  std::vector<ArenaToHostCopy> out;
  std::vector<uint8_t> dst(src.size());
  for (size_t i = 0; i < kCopies; ++i) {
    // Reverse order so neighbours in the batch are not adjacent in memory.
    const uint64_t offset = (kCopies - 1 - i) * kStride;
    in.push_back({src.data() + i * kBytes, offset, kBytes});
    out.push_back({offset, dst.data() + i * kBytes, kBytes});
  }
  ASSERT_OK(inst.ops->CopyToArena(in));
  ASSERT_OK(inst.ops->CopyToHost(out));
  EXPECT_EQ(dst, src);
}

TEST_P(DeviceOpsConformanceTest, EmptyBatchGivesCompleteFence) {
  MAKE_OR_SKIP(inst);
  Fence fence{77};
  ASSERT_OK(inst.ops->SubmitToArena({}, &fence));
  EXPECT_EQ(fence, Fence{0});
  EXPECT_TRUE(inst.ops->IsComplete(fence));
  EXPECT_OK(inst.ops->Wait(fence, std::chrono::nanoseconds(0)));
  fence = Fence{77};
  ASSERT_OK(inst.ops->SubmitToHost({}, &fence));
  EXPECT_EQ(fence, Fence{0});
}

TEST_P(DeviceOpsConformanceTest, RejectsBadBatchesAndCopiesNothing) {
  MAKE_OR_SKIP(inst);
  const auto data = Pattern(64, 5);
  const Fence sentinel{12345};
  auto expect_invalid = [&](std::vector<HostToArenaCopy> batch, const std::string& needle) {
    Fence fence = sentinel;
    GpuStatus status = inst.ops->SubmitToArena(batch, &fence);
    EXPECT_EQ(status.code, GpuStatus::kInvalidArgument) << status.ToString();
    EXPECT_NE(status.message.find(needle), std::string::npos) << status.message;
    EXPECT_EQ(fence, sentinel) << "fence changed on error";
  };
  // The first copy is valid: it must not be applied when a later one fails.
  expect_invalid({{data.data(), 0, 64}, {data.data(), kArenaBytes - 63, 64}}, "copy 1");
  expect_invalid({{data.data(), 0, 64}, {data.data(), kArenaBytes + 1, 0}}, "copy 1");
  expect_invalid({{data.data(), 0, 64}, {data.data(), std::numeric_limits<uint64_t>::max() - 1, 4}},
                 "copy 1");
  expect_invalid({{data.data(), 0, 64}, {nullptr, 128, 4}}, "copy 1");
  std::vector<HostToArenaCopy> too_many(kMaxCopiesPerBatch + 1, {data.data(), 0, 1});
  expect_invalid(too_many, "kMaxCopiesPerBatch");

  std::vector<uint8_t> sink(64);
  Fence fence = sentinel;
  const ArenaToHostCopy bad_out[] = {{0, sink.data(), 64}, {kArenaBytes, sink.data(), 1}};
  EXPECT_EQ(inst.ops->SubmitToHost(bad_out, &fence).code, GpuStatus::kInvalidArgument);
  EXPECT_EQ(fence, sentinel);
  EXPECT_EQ(sink, std::vector<uint8_t>(64, 0)) << "a rejected batch copied bytes";

  std::vector<std::byte> arena;
  ASSERT_OK(inst.ops->ReadArena(0, 64, &arena));
  EXPECT_EQ(arena, std::vector<std::byte>(64, std::byte{0})) << "a rejected batch copied bytes";
  EXPECT_EQ(inst.ops->ReadArena(kArenaBytes - 8, 16, &arena).code, GpuStatus::kInvalidArgument);
  EXPECT_TRUE(arena.empty());
}

TEST_P(DeviceOpsConformanceTest, FencesIncreaseAndUnknownFencesAreRefused) {
  MAKE_OR_SKIP(inst);
  const auto data = Pattern(256, 6);
  uint64_t last = 0;
  for (int i = 0; i < 10; ++i) {
    Fence fence;
    const HostToArenaCopy copy{data.data(), static_cast<uint64_t>(i) * 256, 256};
    ASSERT_OK(inst.ops->SubmitToArena({&copy, 1}, &fence));
    EXPECT_GT(fence.value, last);
    last = fence.value;
  }
  ASSERT_OK(inst.ops->Wait(Fence{last}, kWaitForever));
  EXPECT_TRUE(inst.ops->IsComplete(Fence{last}));
  EXPECT_OK(inst.ops->Wait(Fence{last}, kWaitForever)) << "a second Wait must agree";
  const Fence never{last + 1000};
  EXPECT_FALSE(inst.ops->IsComplete(never));
  EXPECT_EQ(inst.ops->Wait(never, kShortWait).code, GpuStatus::kInvalidArgument);
}

TEST_P(DeviceOpsConformanceTest, WaitTimesOutUntilCopiesRun) {
  MAKE_OR_SKIP(inst);
  if (!inst.pause) GTEST_SKIP() << "copies complete inside Submit*";
  auto* src = static_cast<uint8_t*>(HostBuffer(inst.ops.get(), 4096));
  auto* dst = static_cast<uint8_t*>(HostBuffer(inst.ops.get(), 4096));
  ASSERT_NE(src, nullptr);
  ASSERT_NE(dst, nullptr);
  const auto pattern = Pattern(4096, 7);
  std::memcpy(src, pattern.data(), pattern.size());
  // The arena -> host copy reads a range the paused write does not touch.
  const std::vector<uint8_t> resident(4096, 0x5a);
  const HostToArenaCopy fill{resident.data(), 65536, 4096};
  ASSERT_OK(inst.ops->CopyToArena({&fill, 1}));

  inst.pause(true);
  Fence in_fence, out_fence;
  const HostToArenaCopy in{src, 8192, 4096};
  ASSERT_OK(inst.ops->SubmitToArena({&in, 1}, &in_fence));
  const ArenaToHostCopy out{65536, dst, 4096};
  ASSERT_OK(inst.ops->SubmitToHost({&out, 1}, &out_fence));
  EXPECT_FALSE(inst.ops->IsComplete(in_fence));
  EXPECT_FALSE(inst.ops->IsComplete(out_fence));
  EXPECT_EQ(inst.ops->Wait(in_fence, std::chrono::nanoseconds(0)).code,
            GpuStatus::kDeadlineExceeded);
  EXPECT_EQ(inst.ops->Wait(out_fence, kShortWait).code, GpuStatus::kDeadlineExceeded);
  EXPECT_EQ(dst[0], 0) << "an arena -> host copy ran while paused";
  inst.pause(false);

  ASSERT_OK(inst.ops->Wait(in_fence, kWaitForever));
  EXPECT_TRUE(inst.ops->IsComplete(in_fence));
  ASSERT_OK(inst.ops->Wait(out_fence, std::chrono::seconds(10)));
  EXPECT_TRUE(inst.ops->IsComplete(out_fence));
  EXPECT_EQ(std::vector<uint8_t>(dst, dst + 4096), resident);
  std::vector<std::byte> arena;
  ASSERT_OK(inst.ops->ReadArena(8192, 4096, &arena));
  EXPECT_EQ(std::memcmp(arena.data(), pattern.data(), 4096), 0);
}

TEST_P(DeviceOpsConformanceTest, InflightLimitRefusesThenRecovers) {
  MAKE_OR_SKIP(inst, "arena", /*max_inflight=*/2);
  if (!inst.pause) GTEST_SKIP() << "copies complete inside Submit*";
  auto* src = static_cast<uint8_t*>(HostBuffer(inst.ops.get(), 4096));
  ASSERT_NE(src, nullptr);
  const HostToArenaCopy copy{src, 0, 4096};
  inst.pause(true);
  Fence f1, f2, f3{99};
  ASSERT_OK(inst.ops->SubmitToArena({&copy, 1}, &f1));
  ASSERT_OK(inst.ops->SubmitToArena({&copy, 1}, &f2));
  GpuStatus status = inst.ops->SubmitToArena({&copy, 1}, &f3);
  EXPECT_EQ(status.code, GpuStatus::kUnavailable) << status.ToString();
  EXPECT_EQ(f3, Fence{99});
  inst.pause(false);
  ASSERT_OK(inst.ops->Wait(f1, kWaitForever));
  ASSERT_OK(inst.ops->Wait(f2, kWaitForever));
  EXPECT_OK(inst.ops->SubmitToArena({&copy, 1}, &f3));
  EXPECT_OK(inst.ops->Wait(f3, kWaitForever));
}

TEST_P(DeviceOpsConformanceTest, AllocHostIsZeroedAlignedAndOwned) {
  MAKE_OR_SKIP(inst);
  gpu::HostBuffer buffer;
  EXPECT_EQ(inst.ops->AllocHost(0, &buffer).code, GpuStatus::kInvalidArgument);
  EXPECT_EQ(inst.ops->AllocHost(kMaxHostAllocBytes + 1, &buffer).code, GpuStatus::kInvalidArgument);
  EXPECT_EQ(buffer.data, nullptr) << "*out set on failure";

  ASSERT_OK(inst.ops->AllocHost(10000, &buffer));
  ASSERT_NE(buffer.data, nullptr);
  EXPECT_EQ(buffer.size_bytes, 10000u);
  EXPECT_EQ(buffer.pinned, inst.pinned_host);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data) % sysconf(_SC_PAGESIZE), 0u);
  const auto* bytes = static_cast<const uint8_t*>(buffer.data);
  EXPECT_EQ(std::vector<uint8_t>(bytes, bytes + 10000), std::vector<uint8_t>(10000, 0));

  // Usable as a copy source and destination.
  std::memset(buffer.data, 0xab, 10000);
  const HostToArenaCopy in{buffer.data, 4096, 10000};
  ASSERT_OK(inst.ops->CopyToArena({&in, 1}));
  std::memset(buffer.data, 0, 10000);
  const ArenaToHostCopy out{4096, buffer.data, 10000};
  ASSERT_OK(inst.ops->CopyToHost({&out, 1}));
  EXPECT_EQ(bytes[0], 0xab);
  EXPECT_EQ(bytes[9999], 0xab);

  ASSERT_OK(inst.ops->FreeHost(buffer));
  EXPECT_EQ(inst.ops->FreeHost(buffer).code, GpuStatus::kInvalidArgument);
  int local = 0;
  EXPECT_EQ(inst.ops->FreeHost(gpu::HostBuffer{&local, 4, false}).code,
            GpuStatus::kInvalidArgument);
}

TEST_P(DeviceOpsConformanceTest, RegisterHostRefusesOverlapsAndPinsForCopies) {
  MAKE_OR_SKIP(inst);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* region =
      mmap(nullptr, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(region, MAP_FAILED);
  auto* bytes = static_cast<uint8_t*>(region);

  EXPECT_EQ(inst.ops->RegisterHost(nullptr, page).code, GpuStatus::kInvalidArgument);
  EXPECT_EQ(inst.ops->RegisterHost(bytes, 0).code, GpuStatus::kInvalidArgument);
  ASSERT_OK(inst.ops->RegisterHost(bytes, 2 * page));
  EXPECT_EQ(inst.ops->RegisterHost(bytes + page, 2 * page).code, GpuStatus::kInvalidArgument);
  EXPECT_EQ(inst.ops->RegisterHost(bytes, page).code, GpuStatus::kInvalidArgument);
  ASSERT_OK(inst.ops->RegisterHost(bytes + 2 * page, 2 * page)) << "adjacent is fine";

  const auto pattern = Pattern(3 * page, 8);
  std::memcpy(bytes, pattern.data(), pattern.size());
  const HostToArenaCopy in{bytes, 0, 3 * page};  // spans both registrations
  ASSERT_OK(inst.ops->CopyToArena({&in, 1}));
  std::vector<std::byte> arena;
  ASSERT_OK(inst.ops->ReadArena(0, 3 * page, &arena));
  EXPECT_EQ(std::memcmp(arena.data(), pattern.data(), pattern.size()), 0);

  EXPECT_OK(inst.ops->UnregisterHost(bytes));
  EXPECT_EQ(inst.ops->UnregisterHost(bytes).code, GpuStatus::kInvalidArgument);
  EXPECT_EQ(inst.ops->UnregisterHost(bytes + page).code, GpuStatus::kInvalidArgument);
  EXPECT_OK(inst.ops->UnregisterHost(bytes + 2 * page));
  munmap(region, 4 * page);
}

TEST_P(DeviceOpsConformanceTest, ConcurrentSubmittersKeepTheirBytes) {
  MAKE_OR_SKIP(inst);
  constexpr int kThreads = 8, kRounds = 20;
  constexpr uint64_t kSlice = 64 * 1024;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint8_t> back(kSlice);
      for (int round = 0; round < kRounds; ++round) {
        const auto data = Pattern(kSlice, static_cast<uint8_t>(t * 31 + round));
        const HostToArenaCopy in{data.data(), t * kSlice, kSlice};
        Fence fence;
        if (!inst.ops->SubmitToArena({&in, 1}, &fence).ok() ||
            !inst.ops->Wait(fence, kWaitForever).ok()) {
          ++failures;
          continue;
        }
        const ArenaToHostCopy out{t * kSlice, back.data(), kSlice};
        if (!inst.ops->CopyToHost({&out, 1}).ok() || back != data) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_P(DeviceOpsConformanceTest, FenceOfOneDirectionCompletesBeforeAnEarlierOneOfTheOther) {
  MAKE_OR_SKIP(inst);
  if (!inst.independent_directions) GTEST_SKIP() << "both directions share one queue here";
  auto* src = static_cast<uint8_t*>(HostBuffer(inst.ops.get(), 4096));
  auto* dst = static_cast<uint8_t*>(HostBuffer(inst.ops.get(), 4096));
  ASSERT_NE(src, nullptr);
  ASSERT_NE(dst, nullptr);
  std::memset(src, 0x11, 4096);
  inst.pause_direction(CopyDirection::kToArena, true);
  Fence in_fence, out_fence;
  const HostToArenaCopy in{src, 0, 4096};
  ASSERT_OK(inst.ops->SubmitToArena({&in, 1}, &in_fence));
  const ArenaToHostCopy out{65536, dst, 4096};
  ASSERT_OK(inst.ops->SubmitToHost({&out, 1}, &out_fence));
  ASSERT_GT(out_fence.value, in_fence.value);
  // The later fence completes while the earlier one is held back.
  ASSERT_OK(inst.ops->Wait(out_fence, kWaitForever));
  EXPECT_TRUE(inst.ops->IsComplete(out_fence));
  EXPECT_FALSE(inst.ops->IsComplete(in_fence));
  inst.pause_direction(CopyDirection::kToArena, false);
  ASSERT_OK(inst.ops->Wait(in_fence, kWaitForever));
  std::vector<std::byte> arena;
  ASSERT_OK(inst.ops->ReadArena(0, 4096, &arena));
  EXPECT_EQ(arena, std::vector<std::byte>(4096, std::byte{0x11}));
}

// Demote slot X, then promote another block into X: only the demotion's
// fence orders the two (device_ops.h, Ordering).
TEST_P(DeviceOpsConformanceTest, DemotionAndPromotionOfOneSlotAreOrderedByFencesOnly) {
  MAKE_OR_SKIP(inst);
  constexpr uint64_t kSlot = 8192, kBytes = 4096;
  auto* demoted = static_cast<uint8_t*>(HostBuffer(inst.ops.get(), kBytes));
  auto* incoming = static_cast<uint8_t*>(HostBuffer(inst.ops.get(), kBytes));
  ASSERT_NE(demoted, nullptr);
  ASSERT_NE(incoming, nullptr);
  const auto resident = Pattern(kBytes, 21), next = Pattern(kBytes, 22);
  std::memcpy(incoming, next.data(), kBytes);
  const HostToArenaCopy fill{resident.data(), kSlot, kBytes};
  const ArenaToHostCopy demote{kSlot, demoted, kBytes};
  const HostToArenaCopy promote{incoming, kSlot, kBytes};

  // Waiting for the demotion before promoting: each side gets its bytes.
  ASSERT_OK(inst.ops->CopyToArena({&fill, 1}));
  Fence demote_fence, promote_fence;
  ASSERT_OK(inst.ops->SubmitToHost({&demote, 1}, &demote_fence));
  ASSERT_OK(inst.ops->Wait(demote_fence, kWaitForever));
  ASSERT_OK(inst.ops->SubmitToArena({&promote, 1}, &promote_fence));
  ASSERT_OK(inst.ops->Wait(promote_fence, kWaitForever));
  EXPECT_EQ(std::vector<uint8_t>(demoted, demoted + kBytes), resident);
  std::vector<std::byte> arena;
  ASSERT_OK(inst.ops->ReadArena(kSlot, kBytes, &arena));
  EXPECT_EQ(std::memcmp(arena.data(), next.data(), kBytes), 0);

  if (!inst.independent_directions) return;
  // Submission order alone does not order the directions: with the
  // demotion held back, the promotion lands first and the demotion then
  // reads the promoted bytes. A caller must wait for the demotion's fence.
  ASSERT_OK(inst.ops->CopyToArena({&fill, 1}));
  std::memset(demoted, 0, kBytes);
  inst.pause_direction(CopyDirection::kToHost, true);
  ASSERT_OK(inst.ops->SubmitToHost({&demote, 1}, &demote_fence));
  ASSERT_OK(inst.ops->SubmitToArena({&promote, 1}, &promote_fence));
  ASSERT_OK(inst.ops->Wait(promote_fence, kWaitForever));
  EXPECT_FALSE(inst.ops->IsComplete(demote_fence));
  inst.pause_direction(CopyDirection::kToHost, false);
  ASSERT_OK(inst.ops->Wait(demote_fence, kWaitForever));
  EXPECT_EQ(std::vector<uint8_t>(demoted, demoted + kBytes), next)
      << "the demotion ran after the later promotion";
}

// Copies that are contiguous on both sides but whose host side crosses from
// one registration into the next must not become one device copy.
TEST_P(DeviceOpsConformanceTest, AdjacentCopiesAcrossTwoRegistrationsRoundTrip) {
  MAKE_OR_SKIP(inst);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* region =
      mmap(nullptr, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(region, MAP_FAILED);
  auto* bytes = static_cast<uint8_t*>(region);
  ASSERT_OK(inst.ops->RegisterHost(bytes, 2 * page));
  ASSERT_OK(inst.ops->RegisterHost(bytes + 2 * page, 2 * page));
  const auto pattern = Pattern(4 * page, 31);
  std::memcpy(bytes, pattern.data(), pattern.size());
  // Pages 1 and 2 (one in each registration) to arena pages 0 and 1, then
  // one copy over all four pages (both registrations).
  const HostToArenaCopy in[] = {
      {bytes + page, 0, page}, {bytes + 2 * page, page, page}, {bytes, 4 * page, 4 * page}};
  ASSERT_OK(inst.ops->CopyToArena(in));
  std::vector<std::byte> arena;
  ASSERT_OK(inst.ops->ReadArena(0, 2 * page, &arena));
  EXPECT_EQ(std::memcmp(arena.data(), pattern.data() + page, 2 * page), 0);
  ASSERT_OK(inst.ops->ReadArena(4 * page, 4 * page, &arena));
  EXPECT_EQ(std::memcmp(arena.data(), pattern.data(), 4 * page), 0);

  std::memset(bytes, 0, 4 * page);
  const ArenaToHostCopy out[] = {{0, bytes + page, page}, {page, bytes + 2 * page, page}};
  ASSERT_OK(inst.ops->CopyToHost(out));
  EXPECT_EQ(std::memcmp(bytes + page, pattern.data() + page, 2 * page), 0);
  EXPECT_OK(inst.ops->UnregisterHost(bytes));
  EXPECT_OK(inst.ops->UnregisterHost(bytes + 2 * page));
  munmap(region, 4 * page);
}

TEST_P(DeviceOpsConformanceTest, RegisterHostRefusesBuffersFromAllocHost) {
  MAKE_OR_SKIP(inst);
  gpu::HostBuffer buffer;
  ASSERT_OK(inst.ops->AllocHost(8192, &buffer));
  GpuStatus status = inst.ops->RegisterHost(buffer.data, 4096);
  EXPECT_EQ(status.code, GpuStatus::kInvalidArgument) << status.ToString();
  EXPECT_NE(status.message.find("AllocHost"), std::string::npos) << status.message;
  ASSERT_OK(inst.ops->FreeHost(buffer));
}

TEST_P(DeviceOpsConformanceTest, ConcurrentOverlappingRegistrationsLetExactlyOneIn) {
  MAKE_OR_SKIP(inst);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  constexpr int kThreads = 8;
  void* region = mmap(nullptr, (kThreads + 1) * page, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(region, MAP_FAILED);
  auto* bytes = static_cast<uint8_t*>(region);
  std::atomic<int> ready{0}, won{0}, refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();
      // Every range holds page kThreads / 2, so any two overlap.
      const size_t first = static_cast<size_t>(t <= kThreads / 2 ? t : kThreads / 2);
      GpuStatus status = inst.ops->RegisterHost(bytes + first * page, (kThreads / 2 + 1) * page);
      if (status.ok()) {
        won.fetch_add(1);
      } else if (status.code == GpuStatus::kInvalidArgument) {
        refused.fetch_add(1);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(won.load(), 1);
  EXPECT_EQ(refused.load(), kThreads - 1);
  int unregistered = 0;
  for (int t = 0; t <= kThreads / 2; ++t) {
    unregistered += inst.ops->UnregisterHost(bytes + t * page).ok() ? 1 : 0;
  }
  EXPECT_EQ(unregistered, 1);
  munmap(region, (kThreads + 1) * page);
}

std::vector<Implementation> Implementations() {
  return {
      {"ShmSync", [](const std::string& tag, uint32_t n) { return MakeShm(false, false, tag, n); }},
      {"ShmAsync", [](const std::string& tag, uint32_t n) { return MakeShm(true, false, tag, n); }},
      {"ShmOutOfOrder",
       [](const std::string& tag, uint32_t n) { return MakeShm(true, true, tag, n); }},
      {"Cuda", [](const std::string& tag, uint32_t n) { return MakeCuda(tag, n); }},
  };
}

INSTANTIATE_TEST_SUITE_P(All, DeviceOpsConformanceTest, ::testing::ValuesIn(Implementations()),
                         [](const ::testing::TestParamInfo<Implementation>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace kvtier::gpu
