#include "storage/env/posix_env.h"

#include <cstring>
#include <ctime>
#include <filesystem>
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

class PosixEnvTest : public ::testing::Test {
 protected:
  // Block files use O_DIRECT where the file system supports it.
  BlockFileOptions FileOptions(uint64_t size_bytes) const {
    BlockFileOptions options;
    options.size_bytes = size_bytes;
    options.direct_io = direct_io_;
    return options;
  }

  Env* env_ = Env::Default();
  ScopedTempDir dir_;
  const bool direct_io_ = DirectIoSupported(env_, dir_.path());
};

TEST_F(PosixEnvTest, DefaultIsASingleton) { EXPECT_EQ(Env::Default(), Env::Default()); }

TEST_F(PosixEnvTest, DirectoryAndFileOperations) {
  const std::string nested = dir_.File("a/b/c");
  ASSERT_OK(env_->CreateDir(nested, /*recursive=*/true));
  ASSERT_OK(env_->CreateDir(nested, /*recursive=*/false)) << "existing directory is OK";
  EXPECT_FALSE(env_->CreateDir(dir_.File("x/y"), /*recursive=*/false).ok());

  auto file = env_->OpenBlockFile(nested + "/f1", FileOptions(8192));
  ASSERT_OK(file) << file.status();
  file->reset();
  EXPECT_EQ(*env_->FileExists(nested + "/f1"), true);
  EXPECT_EQ(*env_->FileExists(nested + "/nope"), false);
  EXPECT_EQ(*env_->GetFileSize(nested + "/f1"), 8192u);
  EXPECT_THAT(env_->GetFileSize(nested + "/nope").status(), StatusIs(absl::StatusCode::kNotFound));

  ASSERT_OK(env_->RenameFile(nested + "/f1", nested + "/f2"));
  auto names = env_->ListDir(nested);
  ASSERT_OK(names);
  EXPECT_EQ(*names, std::vector<std::string>{"f2"});
  ASSERT_OK(env_->SyncDir(nested));
  ASSERT_OK(env_->DeleteFile(nested + "/f2"));
  EXPECT_THAT(env_->DeleteFile(nested + "/f2"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_TRUE(env_->ListDir(nested)->empty());
  EXPECT_OK(env_->DeleteDir(nested));
  EXPECT_THAT(env_->ListDir(nested).status(), StatusIs(absl::StatusCode::kNotFound));

  auto regular = env_->OpenBlockFile(dir_.File("plain"), FileOptions(4096));
  ASSERT_OK(regular);
  EXPECT_THAT(env_->CreateDir(dir_.File("plain"), false),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(PosixEnvTest, BlockFileIsPreallocatedAndSizeIsChecked) {
  const std::string path = dir_.File("block.dat");
  BlockFileOptions missing = FileOptions(1 << 20);
  missing.create_if_missing = false;
  EXPECT_THAT(env_->OpenBlockFile(path, missing).status(), StatusIs(absl::StatusCode::kNotFound));

  auto file = env_->OpenBlockFile(path, FileOptions(1 << 20));
  ASSERT_OK(file) << file.status();
  EXPECT_EQ((*file)->size_bytes(), 1u << 20);
  EXPECT_EQ((*file)->direct_io(), direct_io_);
  EXPECT_TRUE((*file)->preallocated());
  file->reset();

  EXPECT_THAT(env_->OpenBlockFile(path, FileOptions(2 << 20)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(env_->OpenBlockFile(path, FileOptions(0)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_OK(env_->OpenBlockFile(path, FileOptions(1 << 20)));
}

TEST_F(PosixEnvTest, SynchronousReadWriteAtChecksRangeAndAlignment) {
  auto file = env_->OpenBlockFile(dir_.File("sync.dat"), FileOptions(16384));
  ASSERT_OK(file);
  auto buffer = AlignedBuffer::Allocate(8192);
  ASSERT_OK(buffer);
  std::memset(buffer->data(), 0xab, 8192);
  ASSERT_OK((*file)->WriteAt(4096, buffer->span()));
  ASSERT_OK((*file)->Sync());
  auto back = AlignedBuffer::Allocate(8192);
  ASSERT_OK((*file)->ReadAt(4096, back->span()));
  EXPECT_EQ(std::memcmp(buffer->data(), back->data(), 8192), 0);

  EXPECT_THAT((*file)->ReadAt(12288, back->span()), StatusIs(absl::StatusCode::kOutOfRange));
  if (direct_io_) {
    EXPECT_THAT((*file)->WriteAt(100, buffer->span()),
                StatusIs(absl::StatusCode::kInvalidArgument));
  }
}

class UringQueueTest : public PosixEnvTest {
 protected:
  void SetUp() override {
    auto queue = env_->NewIoQueue(IoQueueOptions{.depth = 8});
    ASSERT_OK(queue) << queue.status();
    queue_ = std::move(queue).value();
    auto file = env_->OpenBlockFile(dir_.File("q.dat"), FileOptions(1 << 20));
    ASSERT_OK(file) << file.status();
    file_ = std::move(file).value();
  }

  IoRequest Request(IoOp op, uint64_t offset, absl::Span<uint8_t> buffer) {
    IoRequest request;
    request.op = op;
    request.file = file_.get();
    request.offset = offset;
    request.buffer = buffer.data();
    request.length = buffer.size();
    return request;
  }

  std::unique_ptr<IoQueue> queue_;
  std::unique_ptr<BlockFile> file_;
};

TEST_F(UringQueueTest, BatchedWriteSyncReadRoundTripWithMoreRequestsThanDepth) {
  constexpr int kBlocks = 20;  // More than depth 8: the helper refills.
  auto pool = AlignedBufferPool::Create(2 * kBlocks * 8192);
  ASSERT_OK(pool);
  ASSERT_OK(queue_->RegisterBuffers({(*pool)->region()}));
  EXPECT_TRUE(queue_->has_registered_buffers());

  std::vector<IoRequest> writes;
  std::vector<absl::Span<uint8_t>> sources;
  for (int i = 0; i < kBlocks; ++i) {
    absl::Span<uint8_t> source = *(*pool)->TryAcquire(8192);
    for (size_t j = 0; j < source.size(); ++j) source[j] = uint8_t(i * 7 + j);
    sources.push_back(source);
    writes.push_back(Request(IoOp::kWrite, uint64_t(i) * 8192, source));
  }
  ASSERT_OK(RunIoRequests(*queue_, absl::MakeSpan(writes)));
  IoRequest sync;
  sync.op = IoOp::kSync;
  sync.file = file_.get();
  ASSERT_OK(RunIoRequests(*queue_, absl::MakeSpan(&sync, 1)));

  std::vector<IoRequest> reads;
  for (int i = 0; i < kBlocks; ++i) {
    reads.push_back(Request(IoOp::kRead, uint64_t(i) * 8192, *(*pool)->TryAcquire(8192)));
  }
  ASSERT_OK(RunIoRequests(*queue_, absl::MakeSpan(reads)));
  for (int i = 0; i < kBlocks; ++i) {
    ASSERT_EQ(std::memcmp(reads[i].buffer, sources[i].data(), 8192), 0) << i;
  }
  const IoQueueStats stats = queue_->stats();
  EXPECT_EQ(stats.completed, 2u * kBlocks + 1);
  EXPECT_EQ(stats.fixed_buffer_ops, 2u * kBlocks);
  EXPECT_EQ(queue_->in_flight(), 0u);
}

TEST_F(UringQueueTest, UnregisteredBuffersWork) {
  auto buffer = AlignedBuffer::Allocate(4096);
  std::memset(buffer->data(), 0x5a, 4096);
  IoRequest write = Request(IoOp::kWrite, 0, buffer->span());
  ASSERT_OK(RunIoRequests(*queue_, absl::MakeSpan(&write, 1)));
  auto back = AlignedBuffer::Allocate(4096);
  IoRequest read = Request(IoOp::kRead, 0, back->span());
  ASSERT_OK(RunIoRequests(*queue_, absl::MakeSpan(&read, 1)));
  EXPECT_EQ(back->data()[4095], 0x5a);
  EXPECT_EQ(queue_->stats().fixed_buffer_ops, 0u);
}

TEST_F(UringQueueTest, InvalidRequestsComeBackWithErrors) {
  auto buffer = AlignedBuffer::Allocate(8192);
  std::vector<IoRequest> requests;
  requests.push_back(Request(IoOp::kRead, (1 << 20) - 4096, buffer->span()));
  requests.push_back(Request(IoOp::kRead, 0, {}));
  if (direct_io_) {
    requests.push_back(Request(IoOp::kRead, 100, buffer->span()));
  }
  EXPECT_FALSE(RunIoRequests(*queue_, absl::MakeSpan(requests)).ok());
  EXPECT_THAT(requests[0].status, StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(requests[1].status, StatusIs(absl::StatusCode::kInvalidArgument));
  if (direct_io_) {
    EXPECT_THAT(requests[2].status, StatusIs(absl::StatusCode::kInvalidArgument));
  }
  EXPECT_EQ(queue_->in_flight(), 0u);
}

TEST_F(UringQueueTest, ShortReadIsResubmittedThenEndOfFileReported) {
  // Shrink the file behind the queue's back: a read of [32K, 64K) now gets
  // 16K, the queue resubmits the rest, which hits the end of the file.
  std::filesystem::resize_file(file_->path(), 48 * 1024);
  auto buffer = AlignedBuffer::Allocate(32 * 1024);
  IoRequest read = Request(IoOp::kRead, 32 * 1024, buffer->span());
  absl::Status status = RunIoRequests(*queue_, absl::MakeSpan(&read, 1));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kOutOfRange)) << status;
  EXPECT_NE(status.message().find("after 16384 bytes"), absl::string_view::npos) << status;
  EXPECT_EQ(queue_->stats().requeued_short, 1u);
}

TEST_F(UringQueueTest, WakeFromAnotherThreadEndsAWaitingPoll) {
  std::vector<IoRequest*> completed;
  std::thread waker([this] { queue_->Wake(); });
  // Nothing is in flight: only the Wake can end this wait.
  ASSERT_OK(queue_->Poll(/*wait=*/true, &completed));
  waker.join();
  EXPECT_TRUE(completed.empty());
}

TEST_F(PosixEnvTest, ClocksAdvance) {
  const uint64_t a = env_->NowMicros();
  const uint64_t b = env_->NowMicros();
  EXPECT_LE(a, b);
  const uint64_t wall_seconds = env_->WallMicros() / 1000000;
  EXPECT_NEAR(static_cast<double>(wall_seconds), static_cast<double>(std::time(nullptr)), 2.0);
}

}  // namespace
}  // namespace kvtier
