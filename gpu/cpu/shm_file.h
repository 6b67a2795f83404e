// ShmFile: a shared-memory file created with an exact size and mapped
// read-write by its creator (the daemon). Other processes map the same file
// (read-only for the device arena, read-write for the host tier's staging
// slots) by path; see client/shm/shm_mapping.h.
//
// Used by the CPU device arena (gpu/cpu/shm_device_ops.h) and the host tier
// (storage/host/host_tier.h).
//
// Thread safety: the accessors are const and safe from any thread; the
// bytes themselves are the owner's to synchronise.
#ifndef KVTIER_GPU_CPU_SHM_FILE_H_
#define KVTIER_GPU_CPU_SHM_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "gpu/device_ops.h"

namespace kvtier::gpu {

// Largest file ShmFile creates.
inline constexpr uint64_t kMaxShmFileBytes = uint64_t{1} << 40;  // 1 TiB

// Maps errno (> 0) to a GpuStatus code: ENOMEM/ENOSPC/EDQUOT/EFBIG ->
// kOutOfMemory; EAGAIN/EINTR/EBUSY -> kUnavailable; EINVAL/EEXIST/ENOENT/
// ENOTDIR/ENAMETOOLONG/EACCES/EPERM/EROFS -> kInvalidArgument (the path or
// size given cannot be used); others -> kInternal. The message is
// "<context>: <strerror>". The only errno conversion in gpu/.
GpuStatus ErrnoToGpuStatus(int err, const std::string& context);

struct ShmFileOptions {
  uint32_t file_mode = 0600;      // permission bits of the new file
  bool replace_existing = true;   // unlink a file left at path (e.g. by a
                                  // crashed daemon) instead of failing
  bool unlink_on_close = true;    // remove the file when ShmFile dies;
                                  // existing mappings stay valid
  bool preallocate = true;        // reserve the memory now (fallocate) so a
                                  // full tmpfs fails here and not as SIGBUS
                                  // on a later write
};

class ShmFile {
 public:
  // Creates path (O_EXCL after an optional unlink) with exactly size_bytes
  // (1..kMaxShmFileBytes) bytes of zeros and maps it read-write, shared.
  // On failure *out is untouched and no file is left behind.
  static GpuStatus Create(const std::string& path, uint64_t size_bytes,
                          const ShmFileOptions& options,
                          std::unique_ptr<ShmFile>* out);

  ShmFile(const ShmFile&) = delete;
  ShmFile& operator=(const ShmFile&) = delete;
  // Unmaps, closes and (if unlink_on_close) removes the file.
  ~ShmFile();

  std::byte* data() const { return data_; }
  uint64_t size_bytes() const { return size_bytes_; }
  const std::string& path() const { return path_; }

 private:
  ShmFile(std::string path, int fd, std::byte* data, uint64_t size_bytes,
          bool unlink_on_close);

  const std::string path_;
  const int fd_;
  std::byte* const data_;
  const uint64_t size_bytes_;
  const bool unlink_on_close_;
};

}  // namespace kvtier::gpu

#endif  // KVTIER_GPU_CPU_SHM_FILE_H_
