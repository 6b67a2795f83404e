#include "gpu/cpu/shm_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace kvtier::gpu {

GpuStatus ErrnoToGpuStatus(int err, const std::string& context) {
  GpuStatus::Code code = GpuStatus::kInternal;
  switch (err) {
    case ENOMEM:
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      code = GpuStatus::kOutOfMemory;
      break;
    case EAGAIN:
    case EINTR:
    case EBUSY:
      code = GpuStatus::kUnavailable;
      break;
    case EINVAL:
    case EEXIST:
    case ENOENT:
    case ENOTDIR:
    case ENAMETOOLONG:
    case EACCES:
    case EPERM:
    case EROFS:
      code = GpuStatus::kInvalidArgument;
      break;
    default:
      break;
  }
  return GpuStatus::Error(code, context + ": " + std::strerror(err));
}

namespace {

// Gives the file its size. fallocate makes tmpfs reserve the pages now, so
// running out of memory is reported here; filesystems without fallocate
// fall back to a sparse ftruncate.
GpuStatus SizeFile(int fd, const std::string& path, uint64_t size_bytes, bool preallocate) {
  if (preallocate) {
    int err;
    do {
      err = posix_fallocate(fd, 0, static_cast<off_t>(size_bytes));
    } while (err == EINTR);
    if (err == 0) return GpuStatus::Ok();
    if (err != EOPNOTSUPP && err != EINVAL) {
      return ErrnoToGpuStatus(err, "fallocate " + path);
    }
  }
  if (ftruncate(fd, static_cast<off_t>(size_bytes)) != 0) {
    return ErrnoToGpuStatus(errno, "ftruncate " + path);
  }
  return GpuStatus::Ok();
}

}  // namespace

GpuStatus ShmFile::Create(const std::string& path, uint64_t size_bytes,
                          const ShmFileOptions& options, std::unique_ptr<ShmFile>* out) {
  if (path.empty()) {
    return GpuStatus::Error(GpuStatus::kInvalidArgument, "shm file path is empty");
  }
  if (size_bytes == 0 || size_bytes > kMaxShmFileBytes) {
    return GpuStatus::Error(GpuStatus::kInvalidArgument, "shm file size_bytes must be in 1.." +
                                                             std::to_string(kMaxShmFileBytes) +
                                                             ", got " + std::to_string(size_bytes));
  }
  int fd = -1;
  if (options.sealed) {
    fd = memfd_create(path.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return ErrnoToGpuStatus(errno, "memfd_create " + path);
  } else {
    if (options.replace_existing && unlink(path.c_str()) != 0 && errno != ENOENT) {
      return ErrnoToGpuStatus(errno, "unlink " + path);
    }
    fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC,
              static_cast<mode_t>(options.file_mode));
    if (fd < 0) return ErrnoToGpuStatus(errno, "create " + path);
  }

  // From here on a failure removes the half-made file.
  auto fail = [&](GpuStatus status) {
    close(fd);
    if (!options.sealed) unlink(path.c_str());
    return status;
  };
  // open() applies the umask; clients need the mode as configured.
  if (!options.sealed && fchmod(fd, static_cast<mode_t>(options.file_mode)) != 0) {
    return fail(ErrnoToGpuStatus(errno, "fchmod " + path));
  }
  GpuStatus sized = SizeFile(fd, path, size_bytes, options.preallocate);
  if (!sized.ok()) return fail(sized);
  if (options.sealed) {
    // From here on no descriptor of the file can change its size, so no
    // mapping of it (ours included) can fault past its end.
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
      return fail(ErrnoToGpuStatus(errno, "seal " + path));
    }
    const int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & kShmFileSeals) != kShmFileSeals) {
      return fail(
          GpuStatus::Error(GpuStatus::kInternal, "shm file " + path + " did not keep its seals"));
    }
  }
  struct stat st;
  if (fstat(fd, &st) != 0) return fail(ErrnoToGpuStatus(errno, "fstat " + path));
  if (static_cast<uint64_t>(st.st_size) != size_bytes) {
    return fail(GpuStatus::Error(GpuStatus::kInternal,
                                 "shm file " + path + " has " + std::to_string(st.st_size) +
                                     " bytes, wanted " + std::to_string(size_bytes)));
  }
  void* data =
      mmap(nullptr, static_cast<size_t>(size_bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) return fail(ErrnoToGpuStatus(errno, "mmap " + path));
  out->reset(new ShmFile(path, fd, static_cast<std::byte*>(data), size_bytes,
                         options.unlink_on_close && !options.sealed, options.sealed));
  return GpuStatus::Ok();
}

ShmFile::ShmFile(std::string path, int fd, std::byte* data, uint64_t size_bytes,
                 bool unlink_on_close, bool sealed)
    : path_(std::move(path)),
      fd_(fd),
      data_(data),
      size_bytes_(size_bytes),
      unlink_on_close_(unlink_on_close),
      sealed_(sealed) {}

int ShmFile::OpenDescriptor(bool writable) const {
  // A fresh open file description through /proc, so nothing the receiver
  // does to its descriptor's flags reaches ours, and read-only really is
  // read-only. Without /proc a writable descriptor can still be a dup.
  const std::string self = "/proc/self/fd/" + std::to_string(fd_);
  const int fd = open(self.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd >= 0 || !writable || errno != ENOENT) return fd;
  return fcntl(fd_, F_DUPFD_CLOEXEC, 0);
}

ShmFile::~ShmFile() {
  munmap(data_, static_cast<size_t>(size_bytes_));
  // Remove the path only if it still names this file: a newer daemon may
  // have replaced it.
  struct stat mine;
  struct stat named;
  if (unlink_on_close_ && fstat(fd_, &mine) == 0 && stat(path_.c_str(), &named) == 0 &&
      mine.st_dev == named.st_dev && mine.st_ino == named.st_ino) {
    unlink(path_.c_str());
  }
  close(fd_);
}

}  // namespace kvtier::gpu
