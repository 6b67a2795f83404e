#include "client/shm/shm_mapping.h"

#include <unistd.h>

#include <cstring>
#include <vector>

#include "gpu/cpu/shm_device_ops.h"
#include "gpu/cpu/shm_file.h"
#include "gtest/gtest.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::client {
namespace {

constexpr uint64_t kFileBytes = 1 << 20;

std::string ShmPath(const std::string& tag) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return "/dev/shm/kvtier-test-" + std::to_string(getpid()) + "-" + info->name() + "-" + tag;
}

std::vector<std::byte> Pattern(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>(seed + i * 13);
  return v;
}

std::unique_ptr<gpu::DeviceOps> MakeArena(const std::string& path) {
  std::unique_ptr<gpu::DeviceOps> ops;
  gpu::GpuStatus status = gpu::NewShmDeviceOps(path, kFileBytes, {}, &ops);
  EXPECT_OK(status) << status.ToString();
  return ops;
}

TEST(ShmArenaViewTest, SlotShowsWhatTheDaemonCopiedIn) {
  auto ops = MakeArena(ShmPath("arena"));
  std::string error;
  auto view = ShmArenaView::Open(ops->arena().shm_path, ops->arena().size_bytes, &error);
  ASSERT_NE(view, nullptr) << error;
  EXPECT_EQ(view->size_bytes(), kFileBytes);

  const auto block = Pattern(8192, 3);
  const gpu::HostToArenaCopy in{block.data(), 65536, block.size()};
  ASSERT_OK(ops->CopyToArena({&in, 1}));
  std::span<const std::byte> slot = view->Slot(65536, block.size());
  ASSERT_EQ(slot.size(), block.size());
  EXPECT_EQ(std::memcmp(slot.data(), block.data(), block.size()), 0);
}

TEST(ShmArenaViewTest, OutOfRangeSlotsAreEmpty) {
  auto ops = MakeArena(ShmPath("arena"));
  std::string error;
  auto view = ShmArenaView::Open(ops->arena().shm_path, 0, &error);
  ASSERT_NE(view, nullptr) << error;
  EXPECT_TRUE(view->Slot(kFileBytes - 10, 11).empty());
  EXPECT_TRUE(view->Slot(kFileBytes + 1, 1).empty());
  EXPECT_TRUE(view->Slot(1, UINT64_MAX).empty());
  EXPECT_TRUE(view->Slot(0, 0).empty());
  EXPECT_EQ(view->Slot(kFileBytes - 10, 10).size(), 10u);
}

TEST(ShmArenaViewTest, WrongSizeOrMissingFileIsRefused) {
  auto ops = MakeArena(ShmPath("arena"));
  std::string error;
  EXPECT_EQ(ShmArenaView::Open(ops->arena().shm_path, kFileBytes * 2, &error), nullptr);
  EXPECT_NE(error.find("expected"), std::string::npos) << error;
  error.clear();
  EXPECT_EQ(ShmArenaView::Open(ShmPath("missing"), 0, &error), nullptr);
  EXPECT_NE(error.find("No such file"), std::string::npos) << error;
}

TEST(ShmArenaViewTest, MappingIsReadOnly) {
  auto ops = MakeArena(ShmPath("arena"));
  std::string error;
  auto view = ShmArenaView::Open(ops->arena().shm_path, kFileBytes, &error);
  ASSERT_NE(view, nullptr) << error;
  auto* bytes = const_cast<std::byte*>(view->Slot(0, 16).data());
  EXPECT_DEATH({ bytes[0] = std::byte{1}; }, "");
}

TEST(ShmArenaViewTest, ViewOutlivesTheDaemonsFile) {
  const auto block = Pattern(4096, 9);
  std::unique_ptr<ShmArenaView> view;
  {
    auto ops = MakeArena(ShmPath("arena"));
    const gpu::HostToArenaCopy in{block.data(), 0, block.size()};
    ASSERT_OK(ops->CopyToArena({&in, 1}));
    std::string error;
    view = ShmArenaView::Open(ops->arena().shm_path, kFileBytes, &error);
    ASSERT_NE(view, nullptr) << error;
  }  // the daemon side unmaps and unlinks the file
  EXPECT_EQ(std::memcmp(view->Slot(0, block.size()).data(), block.data(), block.size()), 0);
}

// A sealed staging file as the daemon makes it, and a client mapping of it
// through a descriptor as the fd socket hands it out.
std::unique_ptr<gpu::ShmFile> SealedFile() {
  gpu::ShmFileOptions options;
  options.sealed = true;
  std::unique_ptr<gpu::ShmFile> file;
  EXPECT_OK(gpu::ShmFile::Create(ShmPath("staging"), kFileBytes, options, &file));
  return file;
}

std::unique_ptr<ShmStagingFile> MapStaging(const gpu::ShmFile& file, uint64_t expected_bytes,
                                           std::string* error) {
  return ShmStagingFile::OpenFd(file.OpenDescriptor(/*writable=*/true), "staging", expected_bytes,
                                error);
}

TEST(ShmStagingFileTest, ClientWritesLandInTheDaemonsMapping) {
  std::unique_ptr<gpu::ShmFile> file = SealedFile();
  ASSERT_NE(file, nullptr);
  std::string error;
  auto staging = MapStaging(*file, kFileBytes, &error);
  ASSERT_NE(staging, nullptr) << error;

  const auto block = Pattern(12288, 5);
  ASSERT_TRUE(staging->Write(4096, block.size(), block, &error)) << error;
  EXPECT_EQ(std::memcmp(file->data() + 4096, block.data(), block.size()), 0);

  std::span<std::byte> slot = staging->Slot(65536, 16);
  ASSERT_EQ(slot.size(), 16u);
  slot[3] = std::byte{0x5A};
  EXPECT_EQ(file->data()[65536 + 3], std::byte{0x5A});
}

TEST(ShmStagingFileTest, WritesOutsideTheSlotAreRefused) {
  std::unique_ptr<gpu::ShmFile> file = SealedFile();
  ASSERT_NE(file, nullptr);
  std::string error;
  auto staging = MapStaging(*file, 0, &error);
  ASSERT_NE(staging, nullptr) << error;
  const auto block = Pattern(4096, 5);
  EXPECT_FALSE(staging->Write(kFileBytes - 100, block.size(), block, &error));
  EXPECT_NE(error.find("not inside"), std::string::npos) << error;
  EXPECT_FALSE(staging->Write(0, block.size() - 1, block, &error));
  EXPECT_NE(error.find("slot has"), std::string::npos) << error;
  EXPECT_FALSE(staging->Write(0, UINT64_MAX, block, &error));
  EXPECT_EQ(file->data()[0], std::byte{0}) << "refused write changed bytes";
  EXPECT_TRUE(staging->Slot(kFileBytes, 1).empty());
}

// A staging file anyone holding it could shrink under the mapping is not
// one the daemon made: the client refuses it instead of risking SIGBUS.
TEST(ShmStagingFileTest, UnsealedFileIsRefused) {
  std::unique_ptr<gpu::ShmFile> file;
  ASSERT_OK(gpu::ShmFile::Create(ShmPath("plain"), kFileBytes, {}, &file));
  std::string error;
  EXPECT_EQ(MapStaging(*file, kFileBytes, &error), nullptr);
  EXPECT_NE(error.find("not sealed"), std::string::npos) << error;
  EXPECT_EQ(ShmStagingFile::Open(SharedFileSource{file->path(), "", ""}, kFileBytes, &error),
            nullptr);
  EXPECT_NE(error.find("not sealed"), std::string::npos) << error;
}

}  // namespace
}  // namespace kvtier::client
