#include "client/shm/shm_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kvtier::client {

bool ShmMapping::MapFile(const std::string& path, bool writable,
                         uint64_t expected_size_bytes, std::byte** data,
                         uint64_t* size_bytes, std::string* error) {
  auto fail = [&](const char* what, int err) {
    *error = std::string(what) + " " + path + ": " + std::strerror(err);
    return false;
  };
  const int fd = open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return fail("open", errno);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return fail("fstat", err);
  }
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes == 0 || (expected_size_bytes != 0 && file_bytes != expected_size_bytes)) {
    close(fd);
    *error = "shm file " + path + " has " + std::to_string(file_bytes) + " bytes, expected " +
             (expected_size_bytes != 0 ? std::to_string(expected_size_bytes)
                                       : std::string("a non-empty file"));
    return false;
  }
  void* mapped = mmap(nullptr, static_cast<size_t>(file_bytes),
                      writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);  // the mapping keeps the file alive
  if (mapped == MAP_FAILED) return fail("mmap", err);
  *data = static_cast<std::byte*>(mapped);
  *size_bytes = file_bytes;
  return true;
}

ShmMapping::~ShmMapping() { munmap(data_, static_cast<size_t>(size_bytes_)); }

std::unique_ptr<ShmArenaView> ShmArenaView::Open(const std::string& path,
                                                 uint64_t expected_size_bytes,
                                                 std::string* error) {
  std::byte* data = nullptr;
  uint64_t size_bytes = 0;
  if (!MapFile(path, /*writable=*/false, expected_size_bytes, &data, &size_bytes, error)) {
    return nullptr;
  }
  return std::unique_ptr<ShmArenaView>(new ShmArenaView(path, data, size_bytes));
}

std::span<const std::byte> ShmArenaView::Slot(uint64_t offset, uint64_t size_bytes) const {
  if (!Contains(offset, size_bytes)) return {};
  return {data_ + offset, static_cast<size_t>(size_bytes)};
}

std::unique_ptr<ShmStagingFile> ShmStagingFile::Open(const std::string& path,
                                                     uint64_t expected_size_bytes,
                                                     std::string* error) {
  std::byte* data = nullptr;
  uint64_t size_bytes = 0;
  if (!MapFile(path, /*writable=*/true, expected_size_bytes, &data, &size_bytes, error)) {
    return nullptr;
  }
  return std::unique_ptr<ShmStagingFile>(new ShmStagingFile(path, data, size_bytes));
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
