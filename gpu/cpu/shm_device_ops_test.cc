#include "gpu/cpu/shm_device_ops.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::gpu {
namespace {

constexpr uint64_t kArenaBytes = 1 << 20;

// A fresh path under /dev/shm (the production location) per test.
std::string ShmPath(const std::string& tag) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return "/dev/shm/kvtier-test-" + std::to_string(getpid()) + "-" + info->name() + "-" + tag;
}

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

std::unique_ptr<ShmDeviceOps> MakeOps(const std::string& path, bool async = false,
                                      uint32_t max_inflight = 1024) {
  ShmDeviceOpsOptions options;
  options.async_copies = async;
  options.max_inflight_batches = max_inflight;
  std::unique_ptr<ShmDeviceOps> ops;
  GpuStatus status = ShmDeviceOps::Create(path, kArenaBytes, options, &ops);
  EXPECT_OK(status) << status.ToString();
  return ops;
}

TEST(ShmDeviceOpsTest, DescribesArenaAndCreatesExactFile) {
  const std::string path = ShmPath("arena");
  auto ops = MakeOps(path);
  ASSERT_NE(ops, nullptr);
  EXPECT_EQ(ops->arena().backend, "shm-arena");
  EXPECT_EQ(ops->arena().size_bytes, kArenaBytes);
  EXPECT_EQ(ops->arena().shm_path, path);
  EXPECT_NE(ops->arena().arena_id, 0u);
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), kArenaBytes);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ops.reset();
  EXPECT_NE(stat(path.c_str(), &st), 0) << "arena file left behind";
}

TEST(ShmDeviceOpsTest, TwoArenasGetDifferentIds) {
  auto a = MakeOps(ShmPath("a"));
  auto b = MakeOps(ShmPath("b"));
  EXPECT_NE(a->arena().arena_id, b->arena().arena_id);
}

TEST(ShmDeviceOpsTest, BatchedCopiesRoundTrip) {
  auto ops = MakeOps(ShmPath("arena"));
  const auto a = Pattern(4096, 1);
  const auto b = Pattern(100, 2);
  const auto c = Pattern(1, 3);
  const HostToArenaCopy in[] = {
      {a.data(), 0, a.size()}, {b.data(), 8192, b.size()}, {c.data(), kArenaBytes - 1, 1}};
  ASSERT_OK(ops->CopyToArena(in));

  std::vector<uint8_t> ra(a.size()), rb(b.size()), rc(1);
  const ArenaToHostCopy out[] = {
      {0, ra.data(), ra.size()}, {8192, rb.data(), rb.size()}, {kArenaBytes - 1, rc.data(), 1}};
  ASSERT_OK(ops->CopyToHost(out));
  EXPECT_EQ(ra, a);
  EXPECT_EQ(rb, b);
  EXPECT_EQ(rc, c);

  std::vector<std::byte> bytes;
  ASSERT_OK(ops->ReadArena(8192, b.size(), &bytes));
  ASSERT_EQ(bytes.size(), b.size());
  EXPECT_EQ(std::memcmp(bytes.data(), b.data(), b.size()), 0);
}

TEST(ShmDeviceOpsTest, ReadOnlyClientMappingSeesTheSameBytes) {
  const std::string path = ShmPath("arena");
  auto ops = MakeOps(path);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  void* view = mmap(nullptr, kArenaBytes, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(view, MAP_FAILED);
  const auto* client = static_cast<const uint8_t*>(view);

  const auto data = Pattern(3000, 9);
  const HostToArenaCopy in{data.data(), 12345, data.size()};
  ASSERT_OK(ops->CopyToArena({&in, 1}));
  EXPECT_EQ(std::memcmp(client + 12345, data.data(), data.size()), 0);

  // A later write is visible through the same mapping, without remapping.
  const auto again = Pattern(3000, 77);
  const HostToArenaCopy in2{again.data(), 12345, again.size()};
  ASSERT_OK(ops->CopyToArena({&in2, 1}));
  EXPECT_EQ(std::memcmp(client + 12345, again.data(), again.size()), 0);
  munmap(view, kArenaBytes);
}

TEST(ShmDeviceOpsTest, BadRangesAreInvalidAndCopyNothing) {
  auto ops = MakeOps(ShmPath("arena"));
  const auto data = Pattern(64, 5);
  Fence fence{12345};
  const HostToArenaCopy past_end[] = {{data.data(), 0, 64}, {data.data(), kArenaBytes - 63, 64}};
  GpuStatus status = ops->SubmitToArena(past_end, &fence);
  EXPECT_EQ(status.code, GpuStatus::kInvalidArgument);
  EXPECT_NE(status.message.find("copy 1"), std::string::npos) << status.message;
  EXPECT_EQ(fence.value, 12345u) << "fence written on failure";
  std::vector<std::byte> head;
  ASSERT_OK(ops->ReadArena(0, 64, &head));
  for (std::byte b : head) ASSERT_EQ(b, std::byte{0}) << "first copy ran";

  const HostToArenaCopy wraps{data.data(), 1, UINT64_MAX};
  EXPECT_EQ(ops->SubmitToArena({&wraps, 1}, &fence).code, GpuStatus::kInvalidArgument);
  const HostToArenaCopy beyond{data.data(), kArenaBytes + 1, 0};
  EXPECT_EQ(ops->SubmitToArena({&beyond, 1}, &fence).code, GpuStatus::kInvalidArgument);
  const ArenaToHostCopy null_dst{0, nullptr, 8};
  EXPECT_EQ(ops->SubmitToHost({&null_dst, 1}, &fence).code, GpuStatus::kInvalidArgument);
  std::vector<std::byte> out;
  EXPECT_EQ(ops->ReadArena(kArenaBytes, 1, &out).code, GpuStatus::kInvalidArgument);

  std::vector<HostToArenaCopy> too_many(kMaxCopiesPerBatch + 1, {data.data(), 0, 1});
  EXPECT_EQ(ops->SubmitToArena(too_many, &fence).code, GpuStatus::kInvalidArgument);
}

TEST(ShmDeviceOpsTest, SynchronousFencesAreCompleteOnReturn) {
  auto ops = MakeOps(ShmPath("arena"));
  const auto data = Pattern(16, 1);
  Fence f1, f2;
  const HostToArenaCopy in{data.data(), 0, 16};
  ASSERT_OK(ops->SubmitToArena({&in, 1}, &f1));
  ASSERT_OK(ops->SubmitToArena({&in, 1}, &f2));
  EXPECT_LT(f1.value, f2.value);
  EXPECT_TRUE(ops->IsComplete(f1));
  EXPECT_OK(ops->Wait(f2, std::chrono::nanoseconds(0)));
  EXPECT_TRUE(ops->IsComplete(Fence{0}));
  EXPECT_FALSE(ops->IsComplete(Fence{f2.value + 1}));
  EXPECT_EQ(ops->Wait(Fence{f2.value + 1}, kWaitForever).code, GpuStatus::kInvalidArgument);

  Fence empty{99};
  ASSERT_OK(ops->SubmitToArena({}, &empty));
  EXPECT_TRUE(ops->IsComplete(empty));
}

TEST(ShmDeviceOpsTest, AsyncFencesCompleteOnlyAfterTheCopy) {
  auto ops = MakeOps(ShmPath("arena"), /*async=*/true);
  const auto data = Pattern(4096, 4);
  ops->PauseCopiesForTesting(true);
  Fence fence;
  const HostToArenaCopy in{data.data(), 4096, data.size()};
  ASSERT_OK(ops->SubmitToArena({&in, 1}, &fence));
  EXPECT_FALSE(ops->IsComplete(fence));
  EXPECT_EQ(ops->Wait(fence, std::chrono::nanoseconds(0)).code, GpuStatus::kDeadlineExceeded);
  EXPECT_EQ(ops->Wait(fence, std::chrono::milliseconds(1)).code, GpuStatus::kDeadlineExceeded);
  // Read the arena file directly: a ReadArena would queue behind the copy.
  std::vector<uint8_t> before(16, 0xFF);
  const int fd = open(ops->arena().shm_path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pread(fd, before.data(), before.size(), 4096), 16);
  close(fd);
  EXPECT_EQ(before, std::vector<uint8_t>(16, 0)) << "copy ran before its turn";
  ops->PauseCopiesForTesting(false);
  ASSERT_OK(ops->Wait(fence, kWaitForever));
  EXPECT_TRUE(ops->IsComplete(fence));
  std::vector<std::byte> after;
  ASSERT_OK(ops->ReadArena(4096, data.size(), &after));
  EXPECT_EQ(std::memcmp(after.data(), data.data(), data.size()), 0);
}

TEST(ShmDeviceOpsTest, AsyncInflightLimitGivesUnavailable) {
  auto ops = MakeOps(ShmPath("arena"), /*async=*/true, /*max_inflight=*/2);
  const auto data = Pattern(8, 4);
  const HostToArenaCopy in{data.data(), 0, 8};
  ops->PauseCopiesForTesting(true);
  Fence f1, f2, f3;
  ASSERT_OK(ops->SubmitToArena({&in, 1}, &f1));
  ASSERT_OK(ops->SubmitToArena({&in, 1}, &f2));
  EXPECT_EQ(ops->SubmitToArena({&in, 1}, &f3).code, GpuStatus::kUnavailable);
  ops->PauseCopiesForTesting(false);
  EXPECT_OK(ops->Wait(f2, kWaitForever));
  EXPECT_TRUE(ops->IsComplete(f1));
  ASSERT_OK(ops->SubmitToArena({&in, 1}, &f3));
  EXPECT_OK(ops->Wait(f3, kWaitForever));  // data must outlive the copy
}

TEST(ShmDeviceOpsTest, DestructionFinishesQueuedCopies) {
  const std::string path = ShmPath("arena");
  ShmDeviceOpsOptions options;
  options.async_copies = true;
  options.file.unlink_on_close = false;
  std::unique_ptr<ShmDeviceOps> ops;
  ASSERT_OK(ShmDeviceOps::Create(path, kArenaBytes, options, &ops));
  const auto data = Pattern(256, 8);
  ops->PauseCopiesForTesting(true);
  Fence fence;
  const HostToArenaCopy in{data.data(), 512, data.size()};
  ASSERT_OK(ops->SubmitToArena({&in, 1}, &fence));
  ops.reset();
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> got(data.size());
  ASSERT_EQ(pread(fd, got.data(), got.size(), 512), static_cast<ssize_t>(got.size()));
  close(fd);
  unlink(path.c_str());
  EXPECT_EQ(got, data);
}

TEST(ShmDeviceOpsTest, ConcurrentAsyncCopiesToDisjointSlots) {
  auto ops = MakeOps(ShmPath("arena"), /*async=*/true);
  constexpr int kThreads = 4;
  constexpr int kPerThread = 64;
  constexpr uint64_t kSlot = 1024;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const uint64_t slot = static_cast<uint64_t>(t * kPerThread + i);
        const auto data = Pattern(kSlot, static_cast<uint8_t>(slot));
        Fence fence;
        const HostToArenaCopy in{data.data(), slot * kSlot, kSlot};
        if (!ops->SubmitToArena({&in, 1}, &fence).ok() || !ops->Wait(fence, kWaitForever).ok()) {
          failures++;
          continue;
        }
        std::vector<uint8_t> back(kSlot);
        const ArenaToHostCopy out{slot * kSlot, back.data(), kSlot};
        if (!ops->CopyToHost({&out, 1}).ok() || back != data) failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(ShmDeviceOpsTest, HostAllocationAndRegistration) {
  auto ops = MakeOps(ShmPath("arena"));
  HostBuffer buf;
  ASSERT_OK(ops->AllocHost(10000, &buf));
  ASSERT_NE(buf.data, nullptr);
  EXPECT_EQ(buf.size_bytes, 10000u);
  EXPECT_FALSE(buf.pinned);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf.data) % 4096, 0u);
  const auto* bytes = static_cast<const uint8_t*>(buf.data);
  for (int i = 0; i < 10000; ++i) ASSERT_EQ(bytes[i], 0);

  // Host buffers take part in copies.
  std::memset(buf.data, 0xAB, 10000);
  const HostToArenaCopy in{buf.data, 0, 10000};
  ASSERT_OK(ops->CopyToArena({&in, 1}));

  EXPECT_EQ(ops->AllocHost(0, &buf).code, GpuStatus::kInvalidArgument);
  HostBuffer bogus{reinterpret_cast<void*>(0x1000), 10, false};
  EXPECT_EQ(ops->FreeHost(bogus).code, GpuStatus::kInvalidArgument);

  std::vector<uint8_t> region(8192);
  EXPECT_OK(ops->RegisterHost(region.data(), 4096));
  EXPECT_EQ(ops->RegisterHost(region.data() + 100, 10).code, GpuStatus::kInvalidArgument);
  EXPECT_OK(ops->RegisterHost(region.data() + 4096, 4096));
  EXPECT_EQ(ops->RegisterHost(nullptr, 10).code, GpuStatus::kInvalidArgument);
  EXPECT_OK(ops->UnregisterHost(region.data()));
  EXPECT_EQ(ops->UnregisterHost(region.data()).code, GpuStatus::kInvalidArgument);
  EXPECT_OK(ops->UnregisterHost(region.data() + 4096));

  EXPECT_OK(ops->FreeHost(buf));
  EXPECT_EQ(ops->FreeHost(buf).code, GpuStatus::kInvalidArgument);
}

TEST(ShmFileTest, RefusesBadPathsAndSizes) {
  std::unique_ptr<ShmFile> file;
  EXPECT_EQ(ShmFile::Create("/dev/shm/no-such-dir/x", 4096, {}, &file).code,
            GpuStatus::kInvalidArgument);
  EXPECT_EQ(ShmFile::Create(ShmPath("zero"), 0, {}, &file).code, GpuStatus::kInvalidArgument);
  EXPECT_EQ(ShmFile::Create(ShmPath("huge"), kMaxShmFileBytes + 1, {}, &file).code,
            GpuStatus::kInvalidArgument);
  EXPECT_EQ(ShmFile::Create("", 4096, {}, &file).code, GpuStatus::kInvalidArgument);
  EXPECT_EQ(file, nullptr);
}

TEST(ShmFileTest, ExistingFileIsReplacedOrRefused) {
  const std::string path = ShmPath("f");
  const int fd = open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "stale", 5), 5);
  close(fd);

  ShmFileOptions keep;
  keep.replace_existing = false;
  std::unique_ptr<ShmFile> file;
  EXPECT_EQ(ShmFile::Create(path, 4096, keep, &file).code, GpuStatus::kInvalidArgument);
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0) << "refusal removed the existing file";

  ASSERT_OK(ShmFile::Create(path, 4096, {}, &file));
  EXPECT_EQ(file->size_bytes(), 4096u);
  EXPECT_EQ(file->data()[0], std::byte{0}) << "old contents survived";
}

TEST(ShmFileTest, CloseDoesNotRemoveAReplacement) {
  const std::string path = ShmPath("f");
  std::unique_ptr<ShmFile> old_file, new_file;
  ASSERT_OK(ShmFile::Create(path, 4096, {}, &old_file));
  ASSERT_OK(ShmFile::Create(path, 8192, {}, &new_file));
  old_file.reset();
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 8192);
  new_file.reset();
  EXPECT_NE(stat(path.c_str(), &st), 0);
}

// Regression for a SIGBUS crash: a client holding a read-write descriptor
// of a staging file shrank it under the daemon's mapping. A sealed file
// keeps its size whatever a descriptor holder does, so the creator's
// mapping never faults, and it cannot be grown past its quota either.
TEST(ShmFileTest, SealedFileCannotBeResizedThroughAnyDescriptor) {
  ShmFileOptions options;
  options.sealed = true;
  const std::string name = ShmPath("sealed");
  std::unique_ptr<ShmFile> file;
  ASSERT_OK(ShmFile::Create(name, 1 << 16, options, &file));
  EXPECT_TRUE(file->sealed());
  struct stat st;
  EXPECT_NE(stat(name.c_str(), &st), 0) << "a sealed file must have no path";

  const int rw = file->OpenDescriptor(/*writable=*/true);
  ASSERT_GE(rw, 0) << std::strerror(errno);
  EXPECT_EQ(fcntl(rw, F_GET_SEALS) & kShmFileSeals, kShmFileSeals);
  EXPECT_NE(ftruncate(rw, 0), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate(rw, 1 << 30), 0);
  EXPECT_NE(posix_fallocate(rw, 0, off_t{1} << 32), 0);
  EXPECT_NE(fcntl(rw, F_ADD_SEALS, F_SEAL_WRITE), 0) << "F_SEAL_SEAL must stop new seals";
  ASSERT_EQ(fstat(rw, &st), 0);
  EXPECT_EQ(st.st_size, 1 << 16);

  // The holder can still write, and the creator reads it, to the last byte.
  void* view = mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
  ASSERT_NE(view, MAP_FAILED);
  static_cast<char*>(view)[(1 << 16) - 1] = 42;
  EXPECT_EQ(file->data()[(1 << 16) - 1], std::byte{42});
  munmap(view, 1 << 16);
  close(rw);

  const int ro = file->OpenDescriptor(/*writable=*/false);
  ASSERT_GE(ro, 0);
  EXPECT_EQ(fcntl(ro, F_GETFL) & O_ACCMODE, O_RDONLY);
  EXPECT_EQ(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, ro, 0), MAP_FAILED);
  close(ro);
}

}  // namespace
}  // namespace kvtier::gpu
