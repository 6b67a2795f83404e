// OwnedFd: a file descriptor with one owner, closed when the owner dies.
// Move-only; Release() hands the descriptor over without closing it.
//
// Thread safety: a plain value; use one from one thread at a time.
#ifndef KVTIER_STORAGE_COMMON_OWNED_FD_H_
#define KVTIER_STORAGE_COMMON_OWNED_FD_H_

#include <unistd.h>

#include <utility>

namespace kvtier {

class OwnedFd {
 public:
  OwnedFd() = default;
  explicit OwnedFd(int fd) : fd_(fd) {}
  OwnedFd(OwnedFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  OwnedFd& operator=(OwnedFd&& other) noexcept {
    if (this != &other) Reset(std::exchange(other.fd_, -1));
    return *this;
  }
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  ~OwnedFd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership: the caller closes the returned descriptor.
  int Release() { return std::exchange(fd_, -1); }
  void Reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace kvtier

#endif  // KVTIER_STORAGE_COMMON_OWNED_FD_H_
