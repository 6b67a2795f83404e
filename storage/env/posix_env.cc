#include "storage/env/posix_env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "storage/common/errno_status.h"
#include "storage/env/uring_queue.h"

namespace kvtier {
namespace {

// Nothing the daemon writes is for other local users: directories 0700,
// files 0600 (the process umask can only narrow these).
constexpr mode_t kDirMode = 0700;
constexpr mode_t kFileMode = 0600;

absl::Status PathError(const std::string& op, const std::string& path) {
  return ErrnoToStatus(errno, absl::StrCat(op, " ", path));
}

uint64_t ClockMicros(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000u + static_cast<uint64_t>(ts.tv_nsec) / 1000u;
}

// Closes fd on scope exit unless released.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace

Env* Env::Default() {
  static Env* const env = new PosixEnv();
  return env;
}

absl::Status PosixEnv::CreateDir(const std::string& path, bool recursive) {
  if (path.empty()) return absl::InvalidArgumentError("CreateDir: empty path");
  if (recursive) {
    // Create every proper prefix ending before a '/'.
    for (size_t pos = path.find('/', 1); pos != std::string::npos; pos = path.find('/', pos + 1)) {
      const std::string prefix = path.substr(0, pos);
      if (mkdir(prefix.c_str(), kDirMode) != 0 && errno != EEXIST) {
        return PathError("mkdir", prefix);
      }
    }
  }
  if (mkdir(path.c_str(), kDirMode) != 0) {
    if (errno != EEXIST) return PathError("mkdir", path);
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return PathError("stat", path);
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("CreateDir: ", path, " exists and is not a directory"));
    }
  }
  return absl::OkStatus();
}

absl::Status PosixEnv::DeleteDir(const std::string& path) {
  if (rmdir(path.c_str()) != 0) return PathError("rmdir", path);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> PosixEnv::ListDir(const std::string& path) {
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return PathError("opendir", path);
  std::vector<std::string> names;
  errno = 0;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  const int err = errno;
  closedir(dir);
  if (err != 0) return ErrnoToStatus(err, absl::StrCat("readdir ", path));
  std::sort(names.begin(), names.end());
  return names;
}

absl::Status PosixEnv::DeleteFile(const std::string& path) {
  if (unlink(path.c_str()) != 0) return PathError("unlink", path);
  return absl::OkStatus();
}

absl::Status PosixEnv::RenameFile(const std::string& from, const std::string& to) {
  if (rename(from.c_str(), to.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("rename ", from, " to ", to));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> PosixEnv::FileExists(const std::string& path) {
  if (access(path.c_str(), F_OK) == 0) return true;
  if (errno == ENOENT || errno == ENOTDIR) return false;
  return PathError("access", path);
}

absl::StatusOr<uint64_t> PosixEnv::GetFileSize(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return PathError("stat", path);
  return static_cast<uint64_t>(st.st_size);
}

absl::Status PosixEnv::SyncDir(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return PathError("open directory", path);
  FdCloser closer(fd);
  if (fsync(fd) != 0) return PathError("fsync directory", path);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BlockFile>> PosixEnv::OpenBlockFile(
    const std::string& path, const BlockFileOptions& options) {
  if (options.size_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BlockFileOptions.size_bytes must be > 0 for ", path));
  }
  if (options.direct_io && options.size_bytes % kDirectIoAlignmentBytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BlockFileOptions.size_bytes ", options.size_bytes, " for ", path,
                     " must be a multiple of ", kDirectIoAlignmentBytes, " with direct_io"));
  }
  int flags = O_RDWR | O_CLOEXEC;
  if (options.direct_io) flags |= O_DIRECT;
  bool created = false;
  int fd = open(path.c_str(), flags);
  if (fd < 0 && errno == ENOENT && options.create_if_missing) {
    fd = open(path.c_str(), flags | O_CREAT | O_EXCL, kFileMode);
    created = fd >= 0;
  }
  if (fd < 0) {
    if (errno == EINVAL && options.direct_io) {
      return absl::FailedPreconditionError(
          absl::StrCat("open ", path,
                       " with O_DIRECT: the file system does not support "
                       "direct I/O; open with direct_io = false for buffered I/O"));
    }
    return PathError("open block file", path);
  }
  FdCloser closer(fd);
  // On failure after creating the file, leave nothing behind.
  auto fail = [&](absl::Status status) {
    if (created) unlink(path.c_str());
    return status;
  };

  struct stat st;
  if (fstat(fd, &st) != 0) return fail(PathError("fstat", path));
  const uint64_t current_bytes = static_cast<uint64_t>(st.st_size);
  bool preallocated = true;
  if (current_bytes == 0) {
    if (fallocate(fd, 0, 0, static_cast<off_t>(options.size_bytes)) != 0) {
      const int err = errno;
      if (err != EOPNOTSUPP) {
        return fail(ErrnoToStatus(
            err, absl::StrCat("fallocate ", options.size_bytes, " bytes for ", path)));
      }
      // The file system cannot reserve blocks: extend sparsely; writes may
      // then hit ENOSPC later, which surfaces as RESOURCE_EXHAUSTED.
      preallocated = false;
      if (ftruncate(fd, static_cast<off_t>(options.size_bytes)) != 0) {
        return fail(PathError("ftruncate", path));
      }
    }
    if (fdatasync(fd) != 0) return fail(PathError("fdatasync", path));
  } else if (current_bytes != options.size_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("block file ", path, " has ", current_bytes,
                     " bytes, expected size_bytes=", options.size_bytes));
  }
  return std::unique_ptr<BlockFile>(new PosixBlockFile(path, closer.release(), options.size_bytes,
                                                       options.direct_io, preallocated));
}

absl::StatusOr<std::unique_ptr<IoQueue>> PosixEnv::NewIoQueue(const IoQueueOptions& options) {
  absl::StatusOr<std::unique_ptr<UringQueue>> queue = UringQueue::Create(options);
  if (!queue.ok()) return queue.status();
  return std::unique_ptr<IoQueue>(std::move(queue).value());
}

uint64_t PosixEnv::NowMicros() { return ClockMicros(CLOCK_MONOTONIC); }

uint64_t PosixEnv::WallMicros() { return ClockMicros(CLOCK_REALTIME); }

void PosixEnv::SleepForMicros(uint64_t micros) {
  std::this_thread::sleep_for(std::chrono::microseconds(micros));
}

PosixBlockFile::PosixBlockFile(std::string path, int fd, uint64_t size_bytes, bool direct_io,
                               bool preallocated)
    : path_(std::move(path)),
      fd_(fd),
      size_bytes_(size_bytes),
      direct_io_(direct_io),
      preallocated_(preallocated) {}

PosixBlockFile::~PosixBlockFile() { close(fd_); }

absl::Status PosixBlockFile::CheckRange(uint64_t offset, const void* data, uint64_t length) const {
  if (offset > size_bytes_ || length > size_bytes_ - offset) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": offset=", offset, " length=", length,
                                              " beyond the end (", size_bytes_, " bytes)"));
  }
  if (direct_io_ &&
      (offset % kDirectIoAlignmentBytes != 0 || length % kDirectIoAlignmentBytes != 0 ||
       reinterpret_cast<uintptr_t>(data) % kDirectIoAlignmentBytes != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": O_DIRECT offset=", offset, " length=", length,
                     " and buffer address must be multiples of ", kDirectIoAlignmentBytes));
  }
  return absl::OkStatus();
}

absl::Status PosixBlockFile::ReadAt(uint64_t offset, absl::Span<uint8_t> buffer) {
  absl::Status range = CheckRange(offset, buffer.data(), buffer.size());
  if (!range.ok()) return range;
  uint64_t done = 0;
  while (done < buffer.size()) {
    const ssize_t n =
        pread(fd_, buffer.data() + done, buffer.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("pread ", path_, " offset=", offset + done));
    }
    if (n == 0) {
      return absl::OutOfRangeError(
          absl::StrCat("pread ", path_, ": end of file at ", offset + done));
    }
    done += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status PosixBlockFile::WriteAt(uint64_t offset, absl::Span<const uint8_t> data) {
  absl::Status range = CheckRange(offset, data.data(), data.size());
  if (!range.ok()) return range;
  uint64_t done = 0;
  while (done < data.size()) {
    const ssize_t n =
        pwrite(fd_, data.data() + done, data.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("pwrite ", path_, " offset=", offset + done));
    }
    if (n == 0) {
      return ErrnoToStatus(
          EIO, absl::StrCat("pwrite ", path_, " offset=", offset + done, " wrote nothing"));
    }
    done += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status PosixBlockFile::Sync() {
  if (fdatasync(fd_) != 0) return ErrnoToStatus(errno, "fdatasync " + path_);
  return absl::OkStatus();
}

}  // namespace kvtier
