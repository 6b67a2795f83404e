// Client-side views of the daemon's shared-memory files, for hosts where
// the device tier is a "shm-arena" (no GPU) and for the zero-copy put path.
//
//   ShmArenaView    maps the device arena read-only; a block handle
//                   (offset, size_bytes) becomes a span of its bytes.
//   ShmStagingFile  maps the host tier's staging file read-write; the
//                   client writes a block into the slot the daemon reserved
//                   for it, then tells the daemon to adopt the slot.
//
// Depends only on the C++ standard library and POSIX.
//
// Lifetime: spans stay valid while the view lives, even after the daemon
// removes or replaces the file (the mapping keeps the old file alive). The
// bytes under a span are only meaningful while the daemon's lease on that
// block holds; the daemon never shrinks a file it has exported.
//
// Thread safety: all methods are const or read-only and may be called
// concurrently; writes into staging slots are the caller's to serialise.
#ifndef KVTIER_CLIENT_SHM_SHM_MAPPING_H_
#define KVTIER_CLIENT_SHM_SHM_MAPPING_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

namespace kvtier::client {

// A whole-file shared mapping. Use the two classes below.
class ShmMapping {
 public:
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;
  ~ShmMapping();

  uint64_t size_bytes() const { return size_bytes_; }
  const std::string& path() const { return path_; }

  // True when [offset, offset + size_bytes) is a non-empty range inside
  // the file (overflow-safe).
  bool Contains(uint64_t offset, uint64_t size_bytes) const {
    return size_bytes > 0 && offset <= size_bytes_ && size_bytes <= size_bytes_ - offset;
  }

 protected:
  // Maps path; writable selects O_RDWR + PROT_WRITE. expected_size_bytes
  // 0 accepts any non-empty file. On failure returns false and stores a
  // message naming the path and the cause in *error.
  static bool MapFile(const std::string& path, bool writable,
                      uint64_t expected_size_bytes, std::byte** data,
                      uint64_t* size_bytes, std::string* error);
  ShmMapping(std::string path, std::byte* data, uint64_t size_bytes)
      : path_(std::move(path)), data_(data), size_bytes_(size_bytes) {}

  const std::string path_;
  std::byte* const data_;
  const uint64_t size_bytes_;
};

class ShmArenaView : public ShmMapping {
 public:
  // Maps the arena file (ArenaInfo::shm_path) read-only. Pass the arena's
  // size_bytes as expected_size_bytes to detect a wrong or replaced file.
  static std::unique_ptr<ShmArenaView> Open(const std::string& path,
                                            uint64_t expected_size_bytes,
                                            std::string* error);

  // The bytes of a block slot, or an empty span when the range is empty or
  // not inside the arena.
  std::span<const std::byte> Slot(uint64_t offset, uint64_t size_bytes) const;

 private:
  using ShmMapping::ShmMapping;
};

class ShmStagingFile : public ShmMapping {
 public:
  // Maps the staging file read-write. The daemon creates it; this never
  // creates or resizes a file.
  static std::unique_ptr<ShmStagingFile> Open(const std::string& path,
                                              uint64_t expected_size_bytes,
                                              std::string* error);

  // Writable bytes of a reserved slot, or an empty span when the range is
  // empty or not inside the file.
  std::span<std::byte> Slot(uint64_t offset, uint64_t size_bytes) const;

  // Copies data into the slot [offset, offset + slot_size_bytes). Returns
  // false (and writes nothing) with *error set when the slot is not inside
  // the file or data does not fit the slot exactly.
  bool Write(uint64_t offset, uint64_t slot_size_bytes,
             std::span<const std::byte> data, std::string* error) const;

 private:
  using ShmMapping::ShmMapping;
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_SHM_SHM_MAPPING_H_
