// Client-side views of the daemon's shared-memory files, for hosts where
// the device tier is a "shm-arena" (no GPU) and for the zero-copy put path.
//
//   ShmArenaView    maps the device arena read-only; a block handle
//                   (offset, size_bytes) becomes a span of its bytes.
//   ShmStagingFile  maps the host tier's staging file read-write; the
//                   client writes a block into the slot the daemon reserved
//                   for it, then tells the daemon to adopt the slot.
//
// The arena is reached by path (authentication off: shm_path) or, with
// authentication on, as a descriptor fetched from the daemon's fd socket
// (fd_socket_path; client/shm/fd_fetch.h); the staging file always through
// the fd socket. Open with a SharedFileSource picks the one the daemon's
// response names. A staging file must be sealed against resizing
// (F_SEAL_SHRINK | F_SEAL_GROW), as the daemon makes it: an unsealed one
// is refused, since whoever else holds it could shrink it under the
// mapping (SIGBUS).
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

// Where a shared file is, as OpenArena / ReserveSlots name it. Exactly one
// of path and fd_socket_path is used: path when it is set, else a
// descriptor fetched from fd_socket_path with token (empty: none).
// Client::ArenaSource / StagingSource (client/client.h) fill it from a
// response and the client's token.
struct SharedFileSource {
  std::string path;
  std::string fd_socket_path;
  std::string token;
  int fetch_timeout_ms = 5000;
};

// A whole-file shared mapping. Use the two classes below.
class ShmMapping {
 public:
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;
  ~ShmMapping();

  uint64_t size_bytes() const { return size_bytes_; }
  // The file's path, or for a mapping made from a descriptor the name it
  // was given (e.g. "/run/kvtier/fd.sock (arena)"); for messages.
  const std::string& path() const { return path_; }

  // True when [offset, offset + size_bytes) is a non-empty range inside
  // the file (overflow-safe).
  bool Contains(uint64_t offset, uint64_t size_bytes) const {
    return size_bytes > 0 && offset <= size_bytes_ && size_bytes <= size_bytes_ - offset;
  }

 protected:
  // How to map: writable selects O_RDWR + PROT_WRITE; expected_size_bytes
  // 0 accepts any non-empty file.
  struct MapWant {
    bool writable = false;
    uint64_t expected_size_bytes = 0;
  };
  // A mapping made: its bytes and what path() will report.
  struct Mapped {
    std::byte* data = nullptr;
    uint64_t size_bytes = 0;
    std::string name;
  };
  // Maps path. On failure returns false and stores a message naming the
  // path and the cause in *error.
  static bool MapFile(const std::string& path, const MapWant& want, Mapped* out,
                      std::string* error);
  // As MapFile, for an open descriptor; always closes fd. `name` stands
  // for the file in messages.
  static bool MapFd(int fd, std::string name, const MapWant& want, Mapped* out, std::string* error);
  // source.path through MapFile, else FetchSharedFd + MapFd.
  static bool MapSource(const SharedFileSource& source, const MapWant& want, Mapped* out,
                        std::string* error);
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
  static std::unique_ptr<ShmArenaView> Open(const std::string& path, uint64_t expected_size_bytes,
                                            std::string* error);
  // Maps an open descriptor of the arena (from FetchSharedFd; read-only is
  // enough). Takes ownership: fd is closed before this returns, on success
  // and on failure (the mapping keeps the file alive). `name` is path().
  static std::unique_ptr<ShmArenaView> OpenFd(int fd, std::string name,
                                              uint64_t expected_size_bytes, std::string* error);
  // By path or through the fd socket, as the source says. On failure
  // returns nullptr and *error names the file or socket and the cause (for
  // a refused fetch: the daemon's status code name and message).
  static std::unique_ptr<ShmArenaView> Open(const SharedFileSource& source,
                                            uint64_t expected_size_bytes, std::string* error);

  // The bytes of a block slot, or an empty span when the range is empty or
  // not inside the arena.
  std::span<const std::byte> Slot(uint64_t offset, uint64_t size_bytes) const;

 private:
  using ShmMapping::ShmMapping;
};

class ShmStagingFile : public ShmMapping {
 public:
  // Maps an open read-write descriptor of the staging file (from
  // FetchSharedFd); it must carry F_SEAL_SHRINK and F_SEAL_GROW. Takes
  // ownership: fd is closed before this returns. Never resizes the file.
  static std::unique_ptr<ShmStagingFile> OpenFd(int fd, std::string name,
                                                uint64_t expected_size_bytes, std::string* error);
  // By path or through the fd socket, as the source says (see
  // ShmArenaView::Open). Pass ReserveSlotsResponse.staging_size_bytes, or
  // 0 when the daemon sent none (authentication off).
  static std::unique_ptr<ShmStagingFile> Open(const SharedFileSource& source,
                                              uint64_t expected_size_bytes, std::string* error);

  // Writable bytes of a reserved slot, or an empty span when the range is
  // empty or not inside the file.
  std::span<std::byte> Slot(uint64_t offset, uint64_t size_bytes) const;

  // Copies data into the slot [offset, offset + slot_size_bytes). Returns
  // false (and writes nothing) with *error set when the slot is not inside
  // the file or data does not fit the slot exactly.
  bool Write(uint64_t offset, uint64_t slot_size_bytes, std::span<const std::byte> data,
             std::string* error) const;

 private:
  using ShmMapping::ShmMapping;
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_SHM_SHM_MAPPING_H_
