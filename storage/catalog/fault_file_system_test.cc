// FaultFileSystem on real files: what DropUnsyncedData() keeps and removes,
// and how the FaultInjectionEnv's knobs reach RocksDB file operations.
#include "storage/catalog/fault_file_system.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "storage/env/test_util.h"
#include "tests/testutil/status_matchers.h"

using ::kvtier::testing::StatusIs;

namespace kvtier {
namespace {

using rocksdb::FileOptions;
using rocksdb::IOOptions;
using rocksdb::IOStatus;
using rocksdb::Slice;

std::string Contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

bool Exists(const std::string& path) { return std::filesystem::exists(path); }

class FaultFileSystemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK(fs_->NewDirectory(dir_.path(), IOOptions(), &dir_handle_, nullptr));
  }

  // Creates `name` holding `data`, synced; its name durable iff dir_sync.
  void WriteSynced(const std::string& name, const std::string& data, bool dir_sync) {
    std::unique_ptr<rocksdb::FSWritableFile> file;
    ASSERT_OK(fs_->NewWritableFile(dir_.File(name), FileOptions(), &file, nullptr));
    ASSERT_OK(file->Append(data, IOOptions(), nullptr));
    ASSERT_OK(file->Sync(IOOptions(), nullptr));
    ASSERT_OK(file->Close(IOOptions(), nullptr));
    if (dir_sync) {
      ASSERT_OK(SyncDir());
    }
  }
  IOStatus SyncDir() { return dir_handle_->Fsync(IOOptions(), nullptr); }

  testing::ScopedTempDir dir_;
  FaultInjectionEnv env_{Env::Default(), /*seed=*/7};
  std::shared_ptr<FaultFileSystem> fs_ = std::make_shared<FaultFileSystem>(&env_);
  std::unique_ptr<rocksdb::FSDirectory> dir_handle_;
};

TEST_F(FaultFileSystemTest, DropTruncatesToLastSyncAndRemovesNamesNeverDirSynced) {
  std::unique_ptr<rocksdb::FSWritableFile> log;
  ASSERT_OK(fs_->NewWritableFile(dir_.File("000004.log"), FileOptions(), &log, nullptr));
  ASSERT_OK(log->Append("synced|", IOOptions(), nullptr));
  ASSERT_OK(log->Sync(IOOptions(), nullptr));
  ASSERT_OK(SyncDir());
  ASSERT_OK(log->Append("lost", IOOptions(), nullptr));
  ASSERT_OK(log->Close(IOOptions(), nullptr));
  WriteSynced("000005.sst", "table", /*dir_sync=*/false);
  EXPECT_EQ(Contents(dir_.File("000004.log")), "synced|lost");
  EXPECT_EQ(env_.tracked_file_count(), 2u);

  ASSERT_OK(env_.DropUnsyncedData());
  EXPECT_EQ(Contents(dir_.File("000004.log")), "synced|");
  EXPECT_FALSE(Exists(dir_.File("000005.sst"))) << "its directory was never synced";
  EXPECT_EQ(env_.tracked_file_count(), 0u);
}

TEST_F(FaultFileSystemTest, RenamesFollowTheirDirectory) {
  WriteSynced("CURRENT", "MANIFEST-000001\n", /*dir_sync=*/true);
  // Replacing an existing name keeps the new contents (CURRENT's protocol).
  WriteSynced("000002.dbtmp", "MANIFEST-000002\n", /*dir_sync=*/false);
  ASSERT_OK(fs_->RenameFile(dir_.File("000002.dbtmp"), dir_.File("CURRENT"), IOOptions(), nullptr));
  // A new name needs a directory sync: one renamed file gets it, one not.
  WriteSynced("a.tmp", "kept", /*dir_sync=*/false);
  ASSERT_OK(fs_->RenameFile(dir_.File("a.tmp"), dir_.File("OPTIONS-1"), IOOptions(), nullptr));
  ASSERT_OK(SyncDir());
  WriteSynced("b.tmp", "lost", /*dir_sync=*/true);
  ASSERT_OK(fs_->RenameFile(dir_.File("b.tmp"), dir_.File("OPTIONS-2"), IOOptions(), nullptr));

  ASSERT_OK(env_.DropUnsyncedData());
  EXPECT_EQ(Contents(dir_.File("CURRENT")), "MANIFEST-000002\n");
  EXPECT_EQ(Contents(dir_.File("OPTIONS-1")), "kept");
  EXPECT_FALSE(Exists(dir_.File("OPTIONS-2")));
  EXPECT_FALSE(Exists(dir_.File("b.tmp"))) << "the old name is not restored";
}

TEST_F(FaultFileSystemTest, FilesFromBeforeCountAsSyncedAndDeletesAreFinal) {
  { std::ofstream(dir_.File("old.log"), std::ios::binary) << "before"; }
  std::unique_ptr<rocksdb::FSWritableFile> file;
  ASSERT_OK(fs_->ReopenWritableFile(dir_.File("old.log"), FileOptions(), &file, nullptr));
  ASSERT_OK(file->Append("+after", IOOptions(), nullptr));
  ASSERT_OK(file->Close(IOOptions(), nullptr));
  WriteSynced("gone.sst", "x", /*dir_sync=*/true);
  ASSERT_OK(fs_->DeleteFile(dir_.File("gone.sst"), IOOptions(), nullptr));

  ASSERT_OK(env_.DropUnsyncedData());
  EXPECT_EQ(Contents(dir_.File("old.log")), "before");
  EXPECT_FALSE(Exists(dir_.File("gone.sst")));
}

TEST_F(FaultFileSystemTest, KnobsFailAppendsSyncsReadsAndCreation) {
  std::unique_ptr<rocksdb::FSWritableFile> file;
  ASSERT_OK(fs_->NewWritableFile(dir_.File("f.log"), FileOptions(), &file, nullptr));
  ASSERT_OK(SyncDir());
  ASSERT_OK(file->Append("one|", IOOptions(), nullptr));
  ASSERT_OK(file->Sync(IOOptions(), nullptr));

  env_.SetWriteErrorOneIn(1);
  IOStatus s = file->Append("two|", IOOptions(), nullptr);
  EXPECT_TRUE(s.IsIOError()) << s.ToString();
  EXPECT_NE(s.ToString().find("injected append error"), std::string::npos) << s.ToString();
  EXPECT_NE(s.ToString().find("f.log"), std::string::npos) << s.ToString();
  EXPECT_EQ(Contents(dir_.File("f.log")), "one|") << "a failed append writes nothing";
  env_.SetWriteErrorOneIn(0);

  env_.SetNoSpace(true);
  EXPECT_TRUE(file->Append("x", IOOptions(), nullptr).IsNoSpace());
  std::unique_ptr<rocksdb::FSWritableFile> other;
  EXPECT_TRUE(
      fs_->NewWritableFile(dir_.File("new.sst"), FileOptions(), &other, nullptr).IsNoSpace());
  EXPECT_FALSE(Exists(dir_.File("new.sst")));
  env_.SetNoSpace(false);

  // A failed sync syncs nothing: the drop takes the append back.
  ASSERT_OK(file->Append("three", IOOptions(), nullptr));
  env_.SetSyncErrorOneIn(1);
  EXPECT_TRUE(file->Sync(IOOptions(), nullptr).IsIOError());
  EXPECT_TRUE(file->Fsync(IOOptions(), nullptr).IsIOError());
  EXPECT_TRUE(SyncDir().IsIOError());
  env_.SetSyncErrorOneIn(0);
  ASSERT_OK(file->Close(IOOptions(), nullptr));

  env_.SetReadErrorOneIn(1);
  std::unique_ptr<rocksdb::FSRandomAccessFile> reader;
  ASSERT_OK(fs_->NewRandomAccessFile(dir_.File("f.log"), FileOptions(), &reader, nullptr));
  char scratch[16];
  Slice result;
  EXPECT_TRUE(reader->Read(0, 4, IOOptions(), &result, scratch, nullptr).IsIOError());
  std::unique_ptr<rocksdb::FSSequentialFile> sequential;
  ASSERT_OK(fs_->NewSequentialFile(dir_.File("f.log"), FileOptions(), &sequential, nullptr));
  EXPECT_TRUE(sequential->Read(4, IOOptions(), &result, scratch, nullptr).IsIOError());
  env_.SetReadErrorOneIn(0);
  ASSERT_OK(reader->Read(0, 4, IOOptions(), &result, scratch, nullptr));
  EXPECT_EQ(result.ToString(), "one|");
  EXPECT_EQ(env_.injected_error_count(), 6u);  // write, 3 syncs, 2 reads

  ASSERT_OK(env_.DropUnsyncedData());
  EXPECT_EQ(Contents(dir_.File("f.log")), "one|");
}

TEST_F(FaultFileSystemTest, SyncKnobFailsBlockFileSyncsToo) {
  BlockFileOptions options;
  options.size_bytes = kDirectIoAlignmentBytes;
  options.direct_io = false;
  auto file = env_.OpenBlockFile(dir_.File("nvme-000.dat"), options);
  ASSERT_OK(file) << file.status();
  env_.SetSyncErrorOneIn(1);
  absl::Status st = (*file)->Sync();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInternal)) << st;
  EXPECT_NE(st.message().find("nvme-000.dat"), absl::string_view::npos) << st;
  env_.SetSyncErrorOneIn(0);
  EXPECT_OK((*file)->Sync());
}

TEST_F(FaultFileSystemTest, CallsOutsideTheSimulationAreRefused) {
  std::unique_ptr<rocksdb::FSRandomRWFile> rw;
  EXPECT_TRUE(fs_->NewRandomRWFile(dir_.File("rw"), FileOptions(), &rw, nullptr).IsNotSupported());
  EXPECT_TRUE(fs_->LinkFile(dir_.File("a"), dir_.File("b"), IOOptions(), nullptr).IsNotSupported());
}

}  // namespace
}  // namespace kvtier
