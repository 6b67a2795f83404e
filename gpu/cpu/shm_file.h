// ShmFile: a shared-memory file created with an exact size and mapped
// read-write by its creator (the daemon). Other processes map the same file
// (read-only for the device arena, read-write for the host tier's staging
// slots) by path or by a descriptor the daemon hands them; see
// client/shm/shm_mapping.h.
//
// A sealed file (ShmFileOptions::sealed) is a memfd with no name in any
// filesystem, sealed F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL once it has
// its size: whoever holds a descriptor of it, even a read-write one, can
// neither shrink it (which would make the creator's mapping fault with
// SIGBUS) nor grow it (which would take memory outside every quota). Files
// handed to untrusted clients read-write are sealed.
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
  uint32_t file_mode = 0600;     // permission bits of the new file
  bool replace_existing = true;  // unlink a file left at path (e.g. by a
                                 // crashed daemon) instead of failing
  bool unlink_on_close = true;   // remove the file when ShmFile dies;
                                 // existing mappings stay valid
  bool preallocate = true;       // reserve the memory now (fallocate) so a
                                 // full tmpfs fails here and not as SIGBUS
                                 // on a later write
  bool sealed = false;           // a sealed memfd (see above): `path` is
                                 // only its name (for /proc and messages);
                                 // file_mode, replace_existing and
                                 // unlink_on_close do not apply
};

// The seals every sealed ShmFile carries.
inline constexpr int kShmFileSeals =
    0x0001 /*F_SEAL_SEAL*/ | 0x0002 /*F_SEAL_SHRINK*/ | 0x0004 /*F_SEAL_GROW*/;

class ShmFile {
 public:
  // Creates path (O_EXCL after an optional unlink), or a sealed memfd named
  // path, with exactly size_bytes (1..kMaxShmFileBytes) bytes of zeros and
  // maps it read-write, shared. On failure *out is untouched and no file is
  // left behind.
  static GpuStatus Create(const std::string& path, uint64_t size_bytes,
                          const ShmFileOptions& options, std::unique_ptr<ShmFile>* out);

  ShmFile(const ShmFile&) = delete;
  ShmFile& operator=(const ShmFile&) = delete;
  // Unmaps, closes and (if unlink_on_close) removes the file.
  ~ShmFile();

  std::byte* data() const { return data_; }
  uint64_t size_bytes() const { return size_bytes_; }
  const std::string& path() const { return path_; }
  bool sealed() const { return sealed_; }

  // A new descriptor of the file (close-on-exec), read-write or read-only,
  // for handing to another process; the caller owns it. -1 with errno set
  // on failure. For a sealed file it is the only way to reach the file.
  int OpenDescriptor(bool writable) const;

 private:
  ShmFile(std::string path, int fd, std::byte* data, uint64_t size_bytes, bool unlink_on_close,
          bool sealed);

  const std::string path_;
  const int fd_;
  std::byte* const data_;
  const uint64_t size_bytes_;
  const bool unlink_on_close_;
  const bool sealed_;
};

}  // namespace kvtier::gpu

#endif  // KVTIER_GPU_CPU_SHM_FILE_H_
