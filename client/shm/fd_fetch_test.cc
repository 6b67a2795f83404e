// FetchSharedFd and the descriptor-based mappings against a small in-test
// server speaking the daemon's fd-socket protocol (daemon/auth/fd_server.h)
// and handing out memfds. No daemon code is linked.
#include "client/shm/fd_fetch.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "client/shm/shm_mapping.h"
#include "gtest/gtest.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

namespace kvtier::client {
namespace {

constexpr uint64_t kFileBytes = 64 << 10;

// A memfd of kFileBytes whose byte i is (seed + i * 7) & 0xff.
// A memfd of kFileBytes, sealed against resizing as the daemon's staging
// files are.
int PatternMemfd(uint8_t seed) {
  const int fd = memfd_create("kvtier-fd-fetch-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0) << std::strerror(errno);
  std::vector<uint8_t> bytes(kFileBytes);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(seed + i * 7);
  EXPECT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  return fd;
}

// Serves exactly one connection on a Unix socket in a fresh temp folder:
// reads the request line, then sends `reply` with `fd_to_send` attached
// when it is >= 0 (the server owns and closes it). Silent = read the
// request and never answer (until the client hangs up).
class FakeFdServer {
 public:
  FakeFdServer(std::string reply, int fd_to_send, bool silent = false)
      : reply_(std::move(reply)), fd_to_send_(fd_to_send), silent_(silent) {
    path_ = dir_.File("fd.sock");
    listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.data(), path_.size());
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(listen_fd_, 4), 0);
    worker_ = std::thread([this] { ServeOne(); });
  }
  ~FakeFdServer() {
    // A test that never connects: wake accept() with a connection of our own.
    if (!accepted_.load()) {
      FetchedFd ignored = FetchSharedFd(path_, SharedFileKind::kArena, "", 1000);
    }
    if (worker_.joinable()) worker_.join();
    close(listen_fd_);
    if (fd_to_send_ >= 0) close(fd_to_send_);
    unlink(path_.c_str());
  }

  const std::string& path() const { return path_; }
  // The request line as received (after the worker finished).
  std::string request() {
    worker_.join();
    worker_ = std::thread();
    return request_;
  }

 private:
  void ServeOne() {
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    accepted_ = true;
    if (conn < 0) return;
    char buf[1024];
    ssize_t n;
    while ((n = recv(conn, buf, sizeof(buf), 0)) > 0) {
      request_.append(buf, static_cast<size_t>(n));
      if (request_.find('\n') != std::string::npos) break;
    }
    if (silent_) {
      while (recv(conn, buf, sizeof(buf), 0) > 0) {
      }
      close(conn);
      return;
    }
    iovec iov{reply_.data(), reply_.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (fd_to_send_ >= 0) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &fd_to_send_, sizeof(int));
    }
    EXPECT_EQ(sendmsg(conn, &msg, MSG_NOSIGNAL), static_cast<ssize_t>(reply_.size()));
    close(conn);
  }

  std::string reply_;
  const int fd_to_send_;
  const bool silent_;
  ::kvtier::testing::ScopedTempDir dir_{"fdfetch"};
  std::string path_;
  int listen_fd_ = -1;
  std::atomic<bool> accepted_{false};
  std::string request_;
  std::thread worker_;
};

// Descriptors open in this process (server and client share it).
int OpenFdCount() {
  DIR* dir = opendir("/proc/self/fd");
  int n = 0;
  while (readdir(dir) != nullptr) ++n;
  closedir(dir);
  return n;
}

TEST(FetchSharedFdTest, ArenaDescriptorCarriesTheFile) {
  FakeFdServer server("ok " + std::to_string(kFileBytes) + "\n", PatternMemfd(11));
  FetchedFd fetched = FetchSharedFd(server.path(), SharedFileKind::kArena, "tok-A_1");
  ASSERT_OK(fetched) << fetched.ToString();
  EXPECT_EQ(fetched.size_bytes(), kFileBytes);
  ASSERT_GE(fetched.fd(), 0);
  uint8_t bytes[4];
  ASSERT_EQ(pread(fetched.fd(), bytes, sizeof(bytes), 100), 4);
  EXPECT_EQ(bytes[0], static_cast<uint8_t>(11 + 100 * 7));
  EXPECT_EQ(bytes[3], static_cast<uint8_t>(11 + 103 * 7));
  EXPECT_EQ(server.request(), "arena tok-A_1\n");
}

TEST(FetchSharedFdTest, NoTokenIsSentAsDash) {
  FakeFdServer server("ok " + std::to_string(kFileBytes) + "\n", PatternMemfd(1));
  FetchedFd fetched = FetchSharedFd(server.path(), SharedFileKind::kStaging, "");
  ASSERT_OK(fetched) << fetched.ToString();
  EXPECT_EQ(server.request(), "staging -\n");
}

TEST(FetchSharedFdTest, ErrorLineKeepsTheDaemonsCodeAndMessage) {
  FakeFdServer server("error 16 unknown bearer token\n", -1);
  FetchedFd fetched = FetchSharedFd(server.path(), SharedFileKind::kArena, "wrong");
  EXPECT_FALSE(fetched.ok());
  EXPECT_EQ(fetched.code(), 16);
  EXPECT_EQ(fetched.fd(), -1);
  EXPECT_NE(fetched.message().find("unknown bearer token"), std::string::npos) << fetched.message();
  EXPECT_NE(fetched.message().find(server.path()), std::string::npos) << fetched.message();
  EXPECT_EQ(fetched.ToString().rfind("UNAUTHENTICATED: ", 0), 0u) << fetched.ToString();
}

TEST(FetchSharedFdTest, ErrorLineWithCodeZeroIsNotSuccess) {
  FakeFdServer server("error 0 confused\n", -1);
  FetchedFd fetched = FetchSharedFd(server.path(), SharedFileKind::kArena, "t");
  EXPECT_FALSE(fetched.ok());
  EXPECT_EQ(fetched.code(), 2);  // UNKNOWN
}

TEST(FetchSharedFdTest, OkWithoutDescriptorIsInternal) {
  FakeFdServer server("ok 4096\n", -1);
  FetchedFd fetched = FetchSharedFd(server.path(), SharedFileKind::kArena, "t");
  EXPECT_EQ(fetched.code(), kFdInternal);
  EXPECT_NE(fetched.message().find("0 descriptors"), std::string::npos) << fetched.message();
}

TEST(FetchSharedFdTest, MalformedSizeIsInternalAndClosesTheDescriptor) {
  FakeFdServer server("ok 12x\n", PatternMemfd(0));
  const int before = OpenFdCount();
  FetchedFd fetched = FetchSharedFd(server.path(), SharedFileKind::kArena, "t");
  EXPECT_EQ(fetched.code(), kFdInternal);
  EXPECT_NE(fetched.message().find("malformed size"), std::string::npos) << fetched.message();
  server.request();  // the server's connection is closed once its worker is done
  EXPECT_EQ(OpenFdCount(), before) << "the received descriptor leaked";
}

TEST(FetchSharedFdTest, EofWithoutReplyIsUnavailable) {
  FakeFdServer server("", -1);
  FetchedFd fetched = FetchSharedFd(server.path(), SharedFileKind::kArena, "t");
  EXPECT_EQ(fetched.code(), kFdUnavailable);
  EXPECT_NE(fetched.message().find("without a reply"), std::string::npos) << fetched.message();
}

TEST(FetchSharedFdTest, SilentServerTimesOut) {
  FakeFdServer server("", -1, /*silent=*/true);
  FetchedFd fetched = FetchSharedFd(server.path(), SharedFileKind::kArena, "t", 50);
  EXPECT_EQ(fetched.code(), kFdDeadlineExceeded);
  EXPECT_NE(fetched.message().find("no reply within 50 ms"), std::string::npos)
      << fetched.message();
}

TEST(FetchSharedFdTest, MissingSocketIsUnavailable) {
  FetchedFd fetched = FetchSharedFd("/nonexistent/kvtier-fd.sock", SharedFileKind::kArena, "t");
  EXPECT_EQ(fetched.code(), kFdUnavailable);
  EXPECT_NE(fetched.message().find("/nonexistent/kvtier-fd.sock"), std::string::npos);
  EXPECT_NE(fetched.message().find("No such file"), std::string::npos) << fetched.message();
}

TEST(FetchSharedFdTest, BadTokenOrPathIsRefusedBeforeSending) {
  for (const char* token : {"two words", "line\nbreak", "tab\t", "\x7f"}) {
    FetchedFd fetched = FetchSharedFd("/nonexistent/x.sock", SharedFileKind::kArena, token);
    EXPECT_EQ(fetched.code(), kFdInvalidArgument) << token;
    EXPECT_NE(fetched.message().find("token"), std::string::npos) << fetched.message();
  }
  EXPECT_EQ(FetchSharedFd("", SharedFileKind::kArena, "t").code(), kFdInvalidArgument);
  EXPECT_EQ(FetchSharedFd(std::string(200, 'x'), SharedFileKind::kArena, "t").code(),
            kFdInvalidArgument);
}

TEST(FetchedFdTest, MoveTransfersOwnershipAndReleaseHandsItOver) {
  FetchedFd a(PatternMemfd(0), kFileBytes);
  const int fd = a.fd();
  FetchedFd b = std::move(a);
  EXPECT_EQ(a.fd(), -1);  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_EQ(b.fd(), fd);
  EXPECT_EQ(b.Release(), fd);
  EXPECT_EQ(b.fd(), -1);
  EXPECT_EQ(close(fd), 0) << "Release must leave the descriptor open";
}

TEST(SharedFileSourceTest, ArenaMapsReadOnlyFromTheSocket) {
  FakeFdServer server("ok " + std::to_string(kFileBytes) + "\n", PatternMemfd(5));
  std::string error;
  auto view = ShmArenaView::Open(SharedFileSource{"", server.path(), "tok"}, kFileBytes, &error);
  ASSERT_NE(view, nullptr) << error;
  EXPECT_EQ(view->size_bytes(), kFileBytes);
  EXPECT_EQ(view->path(), server.path() + " (arena)");
  auto slot = view->Slot(4096, 2);
  ASSERT_EQ(slot.size(), 2u);
  EXPECT_EQ(slot[0], static_cast<std::byte>(static_cast<uint8_t>(5 + 4096 * 7)));
  EXPECT_EQ(server.request(), "arena tok\n");
}

TEST(SharedFileSourceTest, StagingWritesReachTheFile) {
  const int memfd = PatternMemfd(0);
  const int probe = dup(memfd);  // the test's own view of the same file
  FakeFdServer server("ok " + std::to_string(kFileBytes) + "\n", memfd);
  std::string error;
  auto staging =
      ShmStagingFile::Open(SharedFileSource{"", server.path(), "tok"}, kFileBytes, &error);
  ASSERT_NE(staging, nullptr) << error;
  const std::vector<std::byte> block(512, std::byte{0xA5});
  ASSERT_TRUE(staging->Write(8192, block.size(), block, &error)) << error;
  uint8_t back = 0;
  ASSERT_EQ(pread(probe, &back, 1, 8192 + 511), 1);
  EXPECT_EQ(back, 0xA5);
  close(probe);
  EXPECT_EQ(server.request(), "staging tok\n");
}

TEST(SharedFileSourceTest, AnnouncedSizeMustMatchTheExpectedOne) {
  FakeFdServer server("ok " + std::to_string(kFileBytes) + "\n", PatternMemfd(0));
  std::string error;
  EXPECT_EQ(ShmArenaView::Open(SharedFileSource{"", server.path(), "t"}, kFileBytes * 2, &error),
            nullptr);
  EXPECT_NE(error.find("announced"), std::string::npos) << error;
}

TEST(SharedFileSourceTest, AnnouncedSizeMustMatchTheFile) {
  FakeFdServer server("ok 999\n", PatternMemfd(0));
  std::string error;
  EXPECT_EQ(ShmArenaView::Open(SharedFileSource{"", server.path(), "t"}, 0, &error), nullptr);
  EXPECT_NE(error.find("expected 999"), std::string::npos) << error;
}

TEST(SharedFileSourceTest, RefusedFetchNamesTheCode) {
  FakeFdServer server("error 7 tenant has no staging area\n", -1);
  std::string error;
  EXPECT_EQ(ShmStagingFile::Open(SharedFileSource{"", server.path(), "t"}, 0, &error), nullptr);
  EXPECT_EQ(error.rfind("PERMISSION_DENIED: ", 0), 0u) << error;
  EXPECT_NE(error.find("no staging area"), std::string::npos) << error;
}

TEST(SharedFileSourceTest, NeitherPathNorSocketIsRefused) {
  std::string error;
  EXPECT_EQ(ShmArenaView::Open(SharedFileSource{}, 0, &error), nullptr);
  EXPECT_NE(error.find("fd_socket_path"), std::string::npos) << error;
}

TEST(ShmOpenFdTest, ClosesTheDescriptorOnFailure) {
  const int fd = PatternMemfd(0);
  std::string error;
  EXPECT_EQ(ShmArenaView::OpenFd(fd, "memfd", kFileBytes + 1, &error), nullptr);
  EXPECT_NE(error.find("memfd"), std::string::npos) << error;
  EXPECT_EQ(fcntl(fd, F_GETFD), -1) << "OpenFd must close the descriptor it was given";
}

TEST(ShmOpenFdTest, ReadOnlyDescriptorCannotBeMappedForStaging) {
  const int memfd = PatternMemfd(0);
  const std::string proc = "/proc/self/fd/" + std::to_string(memfd);
  const int read_only = open(proc.c_str(), O_RDONLY | O_CLOEXEC);
  close(memfd);
  ASSERT_GE(read_only, 0);
  std::string error;
  EXPECT_EQ(ShmStagingFile::OpenFd(read_only, "ro-memfd", 0, &error), nullptr);
  EXPECT_NE(error.find("mmap ro-memfd"), std::string::npos) << error;
}

}  // namespace
}  // namespace kvtier::client
