#include "client/kvtierctl/tenants_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#include "absl/strings/str_cat.h"

namespace kvtier::ctl {
namespace {

// The one place errno becomes a status in kvtierctl's file handling.
absl::Status FileError(int err, absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " ", path));
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path, const std::string& text) {
  std::string target = path;
  mode_t mode = 0600;
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
  struct stat st;
  if (stat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) {
      return absl::FailedPreconditionError(path + " exists and is not a regular file");
    }
    // Replace what a symlink points at, not the link.
    char resolved[PATH_MAX];
    if (realpath(path.c_str(), resolved) == nullptr) return FileError(errno, "realpath", path);
    target = resolved;
    mode = (st.st_mode & 0770) | 0600;
    uid = st.st_uid;
    gid = st.st_gid;
  } else if (errno != ENOENT) {
    return FileError(errno, "stat", path);
  }
  const std::string tmp = absl::StrCat(target, ".tmp-", getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return FileError(errno, "create", tmp);
  auto fail = [&](absl::Status status) {
    close(fd);
    unlink(tmp.c_str());
    return status;
  };
  if (fchmod(fd, mode) != 0) return fail(FileError(errno, "chmod", tmp));
  if (uid != static_cast<uid_t>(-1) && (uid != geteuid() || gid != getegid()) &&
      fchown(fd, uid, gid) != 0) {
    return fail(FileError(errno, "keep the owner and group of " + path + " on", tmp));
  }
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(FileError(errno, "write", tmp));
    off += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) return fail(FileError(errno, "fsync", tmp));
  if (close(fd) != 0) {
    unlink(tmp.c_str());
    return FileError(errno, "close", tmp);
  }
  if (rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return FileError(err, "rename onto", target);
  }
  const size_t slash = target.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : target.substr(0, slash + 1);
  // The rename is durable once the folder is.
  const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return FileError(errno, "open the folder", dir);
  const int rc = fsync(dfd);
  const int err = errno;
  close(dfd);
  if (rc != 0) return FileError(err, "fsync", dir);
  return absl::OkStatus();
}

absl::StatusOr<int> LockTenantsFolder(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return FileError(errno, "open the folder", dir);
  while (flock(fd, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    close(fd);
    return FileError(err, "lock the folder", dir);
  }
  return fd;
}

void CloseLock(int fd) {
  if (fd >= 0) close(fd);  // releases the flock
}

}  // namespace kvtier::ctl
