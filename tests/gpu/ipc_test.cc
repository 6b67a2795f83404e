// Cross-process handle test: this process exports a CUDA arena and writes a
// block; a second process (kvtier_gpu_ipc_reader) opens the arena's IPC
// handle on the device with the matching UUID and must read the block
// bit-exact. Also: UUID parsing, wrong device, stale arena id. The process
// tests skip without a device.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "client/cuda/cuda_arena_view.h"
#include "gpu/cuda/cuda_device_ops.h"
#include "gtest/gtest.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

namespace kvtier::gpu {
namespace {

using client::DeviceUuid;

std::string Hex(const std::string& bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 0xf]);
  }
  return out;
}

struct RunResult {
  int exit_code = -1;
  std::string stderr_text;
};

// Runs the reader with args, capturing stderr through a file.
RunResult RunReader(const std::vector<std::string>& args, const std::string& err_path) {
  RunResult result;
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) dup2(fd, STDERR_FILENO);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(KVTIER_IPC_READER_PATH));
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(KVTIER_IPC_READER_PATH, argv.data());
    _exit(127);
  }
  int status = 0;
  if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  }
  std::ifstream err(err_path);
  result.stderr_text.assign(std::istreambuf_iterator<char>(err), {});
  return result;
}

TEST(DeviceUuidTest, ParsesRawHexAndNvidiaSmiForms) {
  DeviceUuid raw;
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<uint8_t>(0xa0 + i);
  const std::string text = client::FormatDeviceUuid(raw);
  EXPECT_EQ(text, "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf");
  DeviceUuid parsed{};
  ASSERT_TRUE(client::ParseDeviceUuid(text, &parsed));
  EXPECT_EQ(parsed, raw);
  parsed = {};
  ASSERT_TRUE(client::ParseDeviceUuid("A0A1A2A3A4A5A6A7A8A9AAABACADAEAF", &parsed));
  EXPECT_EQ(parsed, raw);
  parsed = {};
  ASSERT_TRUE(client::ParseDeviceUuid(std::string(raw.begin(), raw.end()), &parsed));
  EXPECT_EQ(parsed, raw);
  EXPECT_FALSE(client::ParseDeviceUuid("GPU-a0a1", &parsed));
  EXPECT_FALSE(client::ParseDeviceUuid("zz" + std::string(30, '0'), &parsed));
}

TEST(CudaArenaViewTest, MalformedDescriptorsAreRefusedBeforeCuda) {
  client::CudaArenaDescriptor d;
  d.arena_id = 1;
  d.size_bytes = 1 << 20;
  d.ipc_handle = std::string(64, '\0');
  d.device_uuid = std::string(16, '\0');
  std::string error;
  client::CudaArenaDescriptor bad = d;
  bad.ipc_handle.pop_back();
  EXPECT_EQ(client::CudaArenaView::Open(bad, &error), nullptr);
  EXPECT_NE(error.find("ipc_handle has 63 bytes"), std::string::npos) << error;
  bad = d;
  bad.arena_id = 0;
  EXPECT_EQ(client::CudaArenaView::Open(bad, &error), nullptr);
  EXPECT_NE(error.find("arena_id"), std::string::npos) << error;
  bad = d;
  bad.device_uuid = "not-a-uuid";
  EXPECT_EQ(client::CudaArenaView::Open(bad, &error), nullptr);
  EXPECT_NE(error.find("device_uuid"), std::string::npos) << error;
}

class IpcTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kArenaBytes = 64 << 20;
  // One Qwen2.5-7B fp16 block of 16 tokens: 28 x 2 x 4 x 16 x 128 x 2 bytes.
  static constexpr uint64_t kBlockBytes = 917504;
  static constexpr uint64_t kOffset = 3 * kBlockBytes + 4096;

  void SetUp() override {
    KVTIER_SKIP_WITHOUT_DEVICE();
    CudaDeviceOpsOptions options;
    options.arena_bytes = kArenaBytes;
    GpuStatus status = CudaDeviceOps::Create(options, &ops_);
    ASSERT_OK(status) << status.ToString();
    block_.resize(kBlockBytes);
    for (size_t i = 0; i < block_.size(); ++i) {
      block_[i] = static_cast<char>((i * 2654435761u) >> 13);
    }
    const HostToArenaCopy copy{block_.data(), kOffset, kBlockBytes};
    ASSERT_OK(ops_->CopyToArena({&copy, 1}));
    out_path_ = tmp_.File("out");
    err_path_ = tmp_.File("err");
  }

  std::vector<std::string> Args(const std::string& uuid) const {
    const ArenaInfo& info = ops_->arena();
    return {Hex(info.ipc_handle),
            uuid,
            std::to_string(info.arena_id),
            std::to_string(info.size_bytes),
            std::to_string(kOffset),
            std::to_string(kBlockBytes),
            out_path_};
  }

  std::unique_ptr<CudaDeviceOps> ops_;
  std::vector<char> block_;
  ::kvtier::testing::ScopedTempDir tmp_{"ipc"};
  std::string out_path_, err_path_;
};

TEST_F(IpcTest, SecondProcessReadsBlockBitExact) {
  RunResult run = RunReader(Args(Hex(ops_->arena().device_uuid)), err_path_);
  ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
  std::ifstream in(out_path_, std::ios::binary);
  const std::vector<char> got((std::istreambuf_iterator<char>(in)), {});
  ASSERT_EQ(got.size(), block_.size());
  EXPECT_TRUE(got == block_) << "block differs across processes";
}

TEST_F(IpcTest, NvidiaSmiUuidFormWorksToo) {
  DeviceUuid uuid;
  std::memcpy(uuid.data(), ops_->arena().device_uuid.data(), uuid.size());
  RunResult run = RunReader(Args(client::FormatDeviceUuid(uuid)), err_path_);
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
}

TEST_F(IpcTest, UnknownDeviceUuidIsRefused) {
  RunResult run = RunReader(Args(std::string(32, '0')), err_path_);
  EXPECT_EQ(run.exit_code, 2) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("no visible CUDA device has UUID"), std::string::npos)
      << run.stderr_text;
}

TEST_F(IpcTest, StaleArenaIdIsRefused) {
  std::vector<std::string> args = Args(Hex(ops_->arena().device_uuid));
  args.push_back(std::to_string(ops_->arena().arena_id + 1));
  RunResult run = RunReader(args, err_path_);
  EXPECT_EQ(run.exit_code, 3) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("stale arena"), std::string::npos) << run.stderr_text;
}

TEST_F(IpcTest, RangeOutsideArenaIsRefused) {
  std::vector<std::string> args = Args(Hex(ops_->arena().device_uuid));
  args[4] = std::to_string(kArenaBytes - 10);  // OFFSET
  RunResult run = RunReader(args, err_path_);
  EXPECT_EQ(run.exit_code, 3) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("outside the arena"), std::string::npos) << run.stderr_text;
}

}  // namespace
}  // namespace kvtier::gpu
