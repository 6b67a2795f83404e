#include "storage/env/fault_injection_env.h"

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "storage/env/aligned_buffer.h"
#include "storage/env/test_util.h"
#include "tests/testutil/status_matchers.h"

using ::kvtier::testing::StatusIs;

namespace kvtier {
namespace {

using ::kvtier::testing::DirectIoSupported;
using ::kvtier::testing::ScopedTempDir;

constexpr uint64_t kFileBytes = 256 * 1024;

class FaultInjectionEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BlockFileOptions options;
    options.size_bytes = kFileBytes;
    options.direct_io = DirectIoSupported(Env::Default(), dir_.path());
    auto file = env_.OpenBlockFile(dir_.File("f.dat"), options);
    ASSERT_OK(file) << file.status();
    file_ = std::move(file).value();
    auto queue = env_.NewIoQueue(IoQueueOptions{.depth = 4});
    ASSERT_OK(queue) << queue.status();
    queue_ = std::move(queue).value();
    auto buffer = AlignedBuffer::Allocate(kFileBytes);
    ASSERT_OK(buffer);
    buffer_ = std::move(buffer).value();
  }

  absl::Status Run(IoOp op, uint64_t offset, uint64_t length) {
    IoRequest request;
    request.op = op;
    request.file = file_.get();
    request.offset = offset;
    request.buffer = buffer_.data() + offset;
    request.length = op == IoOp::kSync ? 0 : length;
    return RunIoRequests(*queue_, absl::MakeSpan(&request, 1));
  }

  // Reads the whole file into buffer_ with ordinary (unfaulted) I/O.
  void ReadAll() { ASSERT_OK(file_->ReadAt(0, buffer_.span())); }

  ScopedTempDir dir_;
  FaultInjectionEnv env_{Env::Default(), /*seed=*/42};
  std::unique_ptr<BlockFile> file_;
  std::unique_ptr<IoQueue> queue_;
  AlignedBuffer buffer_;
};

TEST_F(FaultInjectionEnvTest, DropUnsyncedDataRestoresLastSyncedContents) {
  std::memset(buffer_.data(), 0x11, 8192);
  ASSERT_OK(Run(IoOp::kWrite, 0, 8192));
  ASSERT_OK(Run(IoOp::kSync, 0, 0));
  EXPECT_EQ(env_.unsynced_write_count(), 0u);

  // Overwrite the synced block, and write a new one, without syncing.
  std::memset(buffer_.data(), 0x22, 4096);
  std::memset(buffer_.data() + 65536, 0x33, 4096);
  ASSERT_OK(Run(IoOp::kWrite, 0, 4096));
  ASSERT_OK(Run(IoOp::kWrite, 65536, 4096));
  // The same range written twice unwinds to the oldest contents.
  std::memset(buffer_.data() + 65536, 0x44, 4096);
  ASSERT_OK(Run(IoOp::kWrite, 65536, 4096));
  EXPECT_EQ(env_.unsynced_write_count(), 3u);

  ReadAll();
  EXPECT_EQ(buffer_.data()[0], 0x22);
  EXPECT_EQ(buffer_.data()[65536], 0x44);

  ASSERT_OK(env_.DropUnsyncedData());
  ReadAll();
  EXPECT_EQ(buffer_.data()[0], 0x11) << "synced contents come back";
  EXPECT_EQ(buffer_.data()[4096], 0x11);
  EXPECT_EQ(buffer_.data()[65536], 0x00) << "never-synced write is gone";
  EXPECT_EQ(env_.unsynced_write_count(), 0u);
}

TEST_F(FaultInjectionEnvTest, SynchronousWritesAreTrackedToo) {
  std::vector<uint8_t> ones(4096, 1);
  auto aligned = AlignedBuffer::Allocate(4096);
  std::memcpy(aligned->data(), ones.data(), 4096);
  ASSERT_OK(file_->WriteAt(8192, aligned->span()));
  ASSERT_OK(file_->Sync());
  std::memset(aligned->data(), 2, 4096);
  ASSERT_OK(file_->WriteAt(8192, aligned->span()));
  ASSERT_OK(env_.DropUnsyncedData());
  ReadAll();
  EXPECT_EQ(buffer_.data()[8192], 1);
}

TEST_F(FaultInjectionEnvTest, OneInNErrorsFailWithoutTransferringBytes) {
  std::memset(buffer_.data(), 0x7e, kFileBytes);
  ASSERT_OK(Run(IoOp::kWrite, 0, kFileBytes));

  env_.SetReadErrorOneIn(3);
  constexpr int kReads = 60;
  int failures = 0;
  for (int i = 0; i < kReads; ++i) {
    std::memset(buffer_.data(), 0, 4096);
    absl::Status status = Run(IoOp::kRead, 0, 4096);
    if (status.ok()) {
      ASSERT_EQ(buffer_.data()[4095], 0x7e);
    } else {
      ++failures;
      EXPECT_THAT(status, StatusIs(absl::StatusCode::kInternal)) << status;
      EXPECT_NE(status.message().find("f.dat"), absl::string_view::npos);
      EXPECT_EQ(buffer_.data()[0], 0) << "a failed read moved no bytes";
    }
  }
  EXPECT_GT(failures, 0);
  EXPECT_LT(failures, kReads);
  EXPECT_EQ(env_.injected_error_count(), static_cast<uint64_t>(failures));
  EXPECT_EQ(env_.injected_error_count(FaultInjectionEnv::FileOp::kRead),
            static_cast<uint64_t>(failures));
  EXPECT_EQ(env_.injected_error_count(FaultInjectionEnv::FileOp::kWrite), 0u);

  env_.SetReadErrorOneIn(0);
  env_.SetWriteErrorOneIn(1);
  EXPECT_THAT(Run(IoOp::kWrite, 0, 4096), StatusIs(absl::StatusCode::kInternal));
  EXPECT_OK(Run(IoOp::kRead, 0, 4096));
}

TEST_F(FaultInjectionEnvTest, NoSpaceFailsWritesAndCreation) {
  env_.SetNoSpace(true);
  EXPECT_THAT(Run(IoOp::kWrite, 0, 4096), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_OK(Run(IoOp::kRead, 0, 4096));
  EXPECT_EQ(env_.no_space_fault_count(), 1u);
  EXPECT_EQ(env_.injected_error_count(), 0u) << "ENOSPC is not a one-in-N error";

  BlockFileOptions options;
  options.size_bytes = kFileBytes;
  options.direct_io = file_->direct_io();
  EXPECT_THAT(env_.OpenBlockFile(dir_.File("new.dat"), options).status(),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_FALSE(*env_.FileExists(dir_.File("new.dat")));
  EXPECT_OK(env_.OpenBlockFile(dir_.File("f.dat"), options))
      << "an existing preallocated file needs no space";
  EXPECT_THAT(env_.CreateDir(dir_.File("sub"), false),
              StatusIs(absl::StatusCode::kResourceExhausted));

  env_.SetNoSpace(false);
  EXPECT_OK(Run(IoOp::kWrite, 0, 4096));
}

TEST_F(FaultInjectionEnvTest, SlowIoSleepsRealTimeAndLeavesErrorsAlone) {
  using Clock = std::chrono::steady_clock;
  constexpr uint64_t kDelayMicros = 20'000;
  env_.SetNowMicros(1000);  // Slow I/O must not touch the manual clock.
  env_.SetSlowIoOneIn(1, kDelayMicros);
  const Clock::time_point start = Clock::now();
  ASSERT_OK(Run(IoOp::kRead, 0, 4096));
  ASSERT_OK(Run(IoOp::kWrite, 0, 4096));
  ASSERT_OK(Run(IoOp::kSync, 0, 0));
  EXPECT_EQ(env_.ChooseFileFault(FaultInjectionEnv::FileOp::kRead),
            FaultInjectionEnv::Fault::kNone);
  const auto elapsed = Clock::now() - start;
  EXPECT_GE(elapsed, std::chrono::microseconds(4 * kDelayMicros));
  EXPECT_EQ(env_.slow_io_count(), 4u);
  EXPECT_EQ(env_.NowMicros(), 1000u);

  env_.SetSlowIoOneIn(0, kDelayMicros);
  ASSERT_OK(Run(IoOp::kRead, 0, 4096));
  EXPECT_EQ(env_.slow_io_count(), 4u) << "0 disables";

  // One in 3, beside one-in-3 read errors: the same operations fail as in
  // an Env of the same seed without slow I/O.
  FaultInjectionEnv plain(Env::Default(), /*seed=*/7);
  FaultInjectionEnv slow(Env::Default(), /*seed=*/7);
  plain.SetReadErrorOneIn(3);
  slow.SetReadErrorOneIn(3);
  slow.SetSlowIoOneIn(3, 100);
  constexpr int kOps = 60;
  for (int i = 0; i < kOps; ++i) {
    ASSERT_EQ(plain.ChooseFileFault(FaultInjectionEnv::FileOp::kRead),
              slow.ChooseFileFault(FaultInjectionEnv::FileOp::kRead))
        << "operation " << i;
  }
  EXPECT_GT(slow.slow_io_count(), 0u);
  EXPECT_LT(slow.slow_io_count(), static_cast<uint64_t>(kOps));
  EXPECT_EQ(plain.injected_error_count(), slow.injected_error_count());
  EXPECT_GT(slow.injected_error_count(), 0u);
}

TEST_F(FaultInjectionEnvTest, HeldIoWaitsUntilReleased) {
  env_.HoldNextIo(FaultInjectionEnv::FileOp::kWrite);
  ASSERT_OK(Run(IoOp::kRead, 0, 4096)) << "another kind is not held";
  auto data = AlignedBuffer::Allocate(4096);
  ASSERT_OK(data);
  std::memset(data->data(), 0x5a, 4096);
  absl::Status written = absl::UnknownError("not run");
  std::thread writer([&] { written = file_->WriteAt(0, data->span()); });
  env_.WaitForHeldIo();
  // The write waits before it starts: the file still holds zeros. Its
  // fault is chosen once it goes on, so the knob set now applies to it.
  ReadAll();
  EXPECT_EQ(buffer_.data()[0], 0);
  env_.SetWriteErrorOneIn(1);
  env_.ReleaseHeldIo();
  writer.join();
  EXPECT_THAT(written, StatusIs(absl::StatusCode::kInternal)) << written;
  env_.SetWriteErrorOneIn(0);
  EXPECT_OK(file_->WriteAt(0, data->span())) << "one hold only";
  ReadAll();
  EXPECT_EQ(buffer_.data()[0], 0x5a);
}

TEST(FaultInjectionClockTest, ManualClockMovesOnlyWhenTold) {
  FaultInjectionEnv env(Env::Default());
  env.SetNowMicros(1000);
  EXPECT_EQ(env.NowMicros(), 1000u);
  const uint64_t wall = env.WallMicros();
  env.AdvanceMicros(500);
  EXPECT_EQ(env.NowMicros(), 1500u);
  EXPECT_EQ(env.WallMicros(), wall + 500);
  env.SleepForMicros(3'000'000'000ull);  // Returns at once.
  EXPECT_EQ(env.NowMicros(), 3'000'001'500ull);
}

}  // namespace
}  // namespace kvtier
