#include "client/shm/shm_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "client/shm/fd_fetch.h"

namespace kvtier::client {

bool ShmMapping::MapFile(const std::string& path, const MapWant& want, Mapped* out,
                         std::string* error) {
  const int fd = open(path.c_str(), (want.writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) {
    *error = "open " + path + ": " + std::strerror(errno);
    return false;
  }
  return MapFd(fd, path, want, out, error);
}

bool ShmMapping::MapFd(int fd, std::string name, const MapWant& want, Mapped* out,
                       std::string* error) {
  const bool writable = want.writable;
  const uint64_t expected_size_bytes = want.expected_size_bytes;
  auto fail = [&](const char* what, int err) {
    close(fd);
    *error = std::string(what) + " " + name + ": " + std::strerror(err);
    return false;
  };
  if (fd < 0) {
    *error = "no descriptor for " + name;
    return false;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) return fail("fstat", errno);
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes == 0 || (expected_size_bytes != 0 && file_bytes != expected_size_bytes)) {
    close(fd);
    *error = "shm file " + name + " has " + std::to_string(file_bytes) + " bytes, expected " +
             (expected_size_bytes != 0 ? std::to_string(expected_size_bytes)
                                       : std::string("a non-empty file"));
    return false;
  }
  if (writable) {
    // A staging file we could be made to fault on (someone shrinking it
    // under our mapping) or that could grow outside the daemon's quota is
    // not the daemon's: refuse it.
    const int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
      close(fd);
      *error = "staging file " + name +
               " is not sealed against resizing (F_SEAL_SHRINK | F_SEAL_GROW); refusing to map it";
      return false;
    }
  }
  void* mapped = mmap(nullptr, static_cast<size_t>(file_bytes),
                      writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  if (mapped == MAP_FAILED) return fail("mmap", errno);
  close(fd);  // the mapping keeps the file alive
  out->data = static_cast<std::byte*>(mapped);
  out->size_bytes = file_bytes;
  out->name = std::move(name);
  return true;
}

bool ShmMapping::MapSource(const SharedFileSource& source, const MapWant& want, Mapped* out,
                           std::string* error) {
  const bool writable = want.writable;
  const uint64_t expected_size_bytes = want.expected_size_bytes;
  if (!source.path.empty()) return MapFile(source.path, want, out, error);
  if (source.fd_socket_path.empty()) {
    *error = "the daemon named neither a path nor an fd_socket_path for the shared file";
    return false;
  }
  const SharedFileKind kind = writable ? SharedFileKind::kStaging : SharedFileKind::kArena;
  FetchedFd fetched =
      FetchSharedFd(source.fd_socket_path, kind, source.token, source.fetch_timeout_ms);
  if (!fetched.ok()) {
    *error = fetched.ToString();
    return false;
  }
  std::string name = source.fd_socket_path + " (" + SharedFileKindName(kind) + ")";
  // The daemon's announced size must agree with the caller's and the file's.
  if (expected_size_bytes != 0 && fetched.size_bytes() != expected_size_bytes) {
    *error = name + ": the fd socket announced " + std::to_string(fetched.size_bytes()) +
             " bytes, expected " + std::to_string(expected_size_bytes);
    return false;
  }
  const uint64_t announced = fetched.size_bytes();
  return MapFd(fetched.Release(), std::move(name), {writable, announced}, out, error);
}

ShmMapping::~ShmMapping() { munmap(data_, static_cast<size_t>(size_bytes_)); }

std::unique_ptr<ShmArenaView> ShmArenaView::Open(const std::string& path,
                                                 uint64_t expected_size_bytes, std::string* error) {
  Mapped m;
  if (!MapFile(path, {/*writable=*/false, expected_size_bytes}, &m, error)) return nullptr;
  return std::unique_ptr<ShmArenaView>(new ShmArenaView(std::move(m.name), m.data, m.size_bytes));
}

std::unique_ptr<ShmArenaView> ShmArenaView::OpenFd(int fd, std::string name,
                                                   uint64_t expected_size_bytes,
                                                   std::string* error) {
  Mapped m;
  if (!MapFd(fd, std::move(name), {/*writable=*/false, expected_size_bytes}, &m, error)) {
    return nullptr;
  }
  return std::unique_ptr<ShmArenaView>(new ShmArenaView(std::move(m.name), m.data, m.size_bytes));
}

std::unique_ptr<ShmArenaView> ShmArenaView::Open(const SharedFileSource& source,
                                                 uint64_t expected_size_bytes, std::string* error) {
  Mapped m;
  if (!MapSource(source, {/*writable=*/false, expected_size_bytes}, &m, error)) return nullptr;
  return std::unique_ptr<ShmArenaView>(new ShmArenaView(std::move(m.name), m.data, m.size_bytes));
}

std::span<const std::byte> ShmArenaView::Slot(uint64_t offset, uint64_t size_bytes) const {
  if (!Contains(offset, size_bytes)) return {};
  return {data_ + offset, static_cast<size_t>(size_bytes)};
}

std::unique_ptr<ShmStagingFile> ShmStagingFile::OpenFd(int fd, std::string name,
                                                       uint64_t expected_size_bytes,
                                                       std::string* error) {
  Mapped m;
  if (!MapFd(fd, std::move(name), {/*writable=*/true, expected_size_bytes}, &m, error)) {
    return nullptr;
  }
  return std::unique_ptr<ShmStagingFile>(
      new ShmStagingFile(std::move(m.name), m.data, m.size_bytes));
}

std::unique_ptr<ShmStagingFile> ShmStagingFile::Open(const SharedFileSource& source,
                                                     uint64_t expected_size_bytes,
                                                     std::string* error) {
  Mapped m;
  if (!MapSource(source, {/*writable=*/true, expected_size_bytes}, &m, error)) return nullptr;
  return std::unique_ptr<ShmStagingFile>(
      new ShmStagingFile(std::move(m.name), m.data, m.size_bytes));
}

std::span<std::byte> ShmStagingFile::Slot(uint64_t offset, uint64_t size_bytes) const {
  if (!Contains(offset, size_bytes)) return {};
  return {data_ + offset, static_cast<size_t>(size_bytes)};
}

bool ShmStagingFile::Write(uint64_t offset, uint64_t slot_size_bytes,
                           std::span<const std::byte> data, std::string* error) const {
  if (!Contains(offset, slot_size_bytes)) {
    *error = "slot [" + std::to_string(offset) + ", +" + std::to_string(slot_size_bytes) +
             ") is not inside " + path_ + " (" + std::to_string(size_bytes_) + " bytes)";
    return false;
  }
  if (data.size() != slot_size_bytes) {
    *error = "data has " + std::to_string(data.size()) + " bytes, slot has " +
             std::to_string(slot_size_bytes);
    return false;
  }
  std::memcpy(data_ + offset, data.data(), data.size());
  return true;
}

}  // namespace kvtier::client
