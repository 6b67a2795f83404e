// The POSIX Env: real directories and files, O_DIRECT block files
// preallocated with fallocate, io_uring I/O queues (UringQueue), and
// CLOCK_MONOTONIC / CLOCK_REALTIME clocks. Env::Default() returns the
// process-wide instance; tests may also create their own.
//
// Thread safety: PosixEnv and PosixBlockFile are thread-safe; a UringQueue
// belongs to one thread (see IoQueue).
#ifndef KVTIER_STORAGE_ENV_POSIX_ENV_H_
#define KVTIER_STORAGE_ENV_POSIX_ENV_H_

#include <memory>
#include <string>
#include <vector>

#include "storage/env/env.h"

namespace kvtier {

class PosixEnv final : public Env {
 public:
  PosixEnv() = default;

  absl::Status CreateDir(const std::string& path, bool recursive) override;
  absl::Status DeleteDir(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override;
  absl::Status DeleteFile(const std::string& path) override;
  absl::Status RenameFile(const std::string& from, const std::string& to) override;
  absl::StatusOr<bool> FileExists(const std::string& path) override;
  absl::StatusOr<uint64_t> GetFileSize(const std::string& path) override;
  absl::Status SyncDir(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<BlockFile>> OpenBlockFile(
      const std::string& path, const BlockFileOptions& options) override;
  // An io_uring queue (UringQueue); only accepts files from a PosixEnv.
  absl::StatusOr<std::unique_ptr<IoQueue>> NewIoQueue(const IoQueueOptions& options) override;
  uint64_t NowMicros() override;
  uint64_t WallMicros() override;
  void SleepForMicros(uint64_t micros) override;
};

// A block file opened by PosixEnv. Exposed so the io_uring queue can reach
// the descriptor; other code uses the BlockFile interface.
class PosixBlockFile final : public BlockFile {
 public:
  // Takes ownership of fd.
  PosixBlockFile(std::string path, int fd, uint64_t size_bytes, bool direct_io, bool preallocated);
  ~PosixBlockFile() override;

  const std::string& path() const override { return path_; }
  uint64_t size_bytes() const override { return size_bytes_; }
  bool direct_io() const override { return direct_io_; }
  bool preallocated() const override { return preallocated_; }
  absl::Status ReadAt(uint64_t offset, absl::Span<uint8_t> buffer) override;
  absl::Status WriteAt(uint64_t offset, absl::Span<const uint8_t> data) override;
  absl::Status Sync() override;

  int fd() const { return fd_; }

 private:
  absl::Status CheckRange(uint64_t offset, const void* data, uint64_t length) const;

  const std::string path_;
  const int fd_;
  const uint64_t size_bytes_;
  const bool direct_io_;
  const bool preallocated_;
};

}  // namespace kvtier

#endif  // KVTIER_STORAGE_ENV_POSIX_ENV_H_
