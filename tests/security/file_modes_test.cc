// Finding 7: what kvtierd writes to disk is not readable by other local
// users. The daemon runs as a process (its own umask, as systemd or
// deploy/run.sh start it) in a data folder it creates itself; every folder
// it made is 0700, every file 0600 (sockets excepted: their mode is
// server.socket_mode), and another user cannot read a tier file that holds
// a block. A data folder that others can enter draws a warning.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "client/client.h"
#include "gmock/gmock.h"
#include "tests/integration/subprocess.h"
#include "tests/security/other_user.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

namespace kvtier::security {
namespace {

using ::testing::HasSubstr;

class FileModesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = tmp_.path();
    ::chmod(root_.c_str(), 0755);  // others may reach what is below
    data_ = root_ + "/data";       // the daemon creates it
    socket_ = root_ + "/run/kvtierd.sock";
  }
  void TearDown() override {
    if (daemon_) {
      daemon_->Signal(SIGTERM);
      daemon_->Wait(std::chrono::seconds(30));
    }
  }

  void Start() {
    notify_ = std::make_unique<testing::NotifySocket>(root_ + "/notify.sock");
    daemon_ = std::make_unique<testing::ChildProcess>(
        std::vector<std::string>{
            KVTIERD_PATH, "--data-dir", data_, "--socket", socket_, "--set",
            "tiers.host.capacity_bytes=16MiB", "--set", "tiers.device.capacity_bytes=4MiB", "--set",
            "tiers.host.staging_bytes=1MiB", "--set", "tiers.nvme.file_count=2", "--set",
            "tiers.nvme.file_size_bytes=4MiB", "--set", "tiers.nvme.write_through=true"},
        std::vector<std::string>{"NOTIFY_SOCKET=" + notify_->path()}, root_ + "/log");
    ASSERT_TRUE(notify_->WaitFor("READY=1", std::chrono::seconds(20)))
        << testing::ReadFile(root_ + "/log");
  }

  // Puts one durable block whose bytes are a recognisable pattern.
  void PutDurableBlock() {
    auto client = Client::Connect(socket_);
    ASSERT_OK(client);
    v1::ModelProfile p;
    p.set_name("modes");
    p.set_num_layers(1);
    p.set_num_kv_heads(1);
    p.set_head_dim(64);
    p.set_block_size_tokens(32);
    p.set_dtype(v1::DTYPE_FP16);
    auto reg = (*client)->RegisterProfile(p);
    ASSERT_OK(reg);
    v1::PutBlocksRequest put;
    put.set_profile_id(reg->profile_id());
    put.set_durable(true);
    auto* b = put.add_blocks();
    b->set_block_id("secret");
    b->set_data(std::string(8192, 'S'));
    auto r = (*client)->PutBlocks({put});
    ASSERT_OK(r);
    ASSERT_EQ(r->results(0).status().code(), 0);
  }

  ::kvtier::testing::ScopedTempDir tmp_{"modes"};
  std::string root_, data_, socket_;
  std::unique_ptr<testing::NotifySocket> notify_;
  std::unique_ptr<testing::ChildProcess> daemon_;
};

TEST_F(FileModesTest, EverythingTheDaemonWritesIsPrivate) {
  Start();
  PutDurableBlock();
  int dirs = 0, files = 0;
  std::vector<std::string> tier_files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(data_)) {
    struct stat st {};
    ASSERT_EQ(::lstat(e.path().c_str(), &st), 0) << e.path();
    if (S_ISSOCK(st.st_mode)) continue;
    if (S_ISDIR(st.st_mode)) {
      ++dirs;
      EXPECT_EQ(st.st_mode & 0777, 0700u) << e.path();
    } else {
      ++files;
      EXPECT_EQ(st.st_mode & 0077, 0u) << e.path() << " mode " << std::oct << (st.st_mode & 0777);
      if (e.path().extension() == ".dat") tier_files.push_back(e.path());
    }
  }
  struct stat top {};
  ASSERT_EQ(::stat(data_.c_str(), &top), 0);
  EXPECT_EQ(top.st_mode & 0777, 0700u) << "the data folder kvtierd created";
  EXPECT_GE(dirs, 2) << "catalog and compaction stores";
  EXPECT_GE(files, 5);
  ASSERT_FALSE(tier_files.empty()) << "no NVMe tier file under " << data_;
  struct stat run {};
  ASSERT_EQ(::stat((root_ + "/run").c_str(), &run), 0);
  EXPECT_EQ(run.st_mode & 0777, 0750u) << "the socket folder: the group may reach the socket";

  // Another local user cannot read a tier file, even knowing its name.
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to test as another user (setuid)";
  for (const std::string& f : tier_files) ExpectNobodyCannotOpen(f);
}

TEST_F(FileModesTest, AnOpenDataFolderDrawsAWarning) {
  std::filesystem::create_directories(data_);
  ::chmod(data_.c_str(), 0755);
  Start();
  EXPECT_THAT(testing::ReadFile(root_ + "/log"),
              HasSubstr("is accessible to its group or other users (mode 755)"));
}

}  // namespace
}  // namespace kvtier::security
