#include "storage/catalog/fault_file_system.h"

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "storage/catalog/rocksdb_status.h"

namespace kvtier {

using rocksdb::IODebugContext;
using rocksdb::IOOptions;
using rocksdb::IOStatus;
using rocksdb::Slice;
using Fault = FaultInjectionEnv::Fault;
using FileOp = FaultInjectionEnv::FileOp;

namespace {

IOStatus Injected(Fault fault, const char* op, const std::string& path) {
  if (fault == Fault::kNoSpace) {
    return IOStatus::NoSpace(absl::StrCat("injected no space: ", op), path);
  }
  return IOStatus::IOError(absl::StrCat("injected ", op, " error"), path);
}

IOStatus Refused(const char* call) {
  return IOStatus::NotSupported(absl::StrCat(call, " is not simulated by FaultFileSystem"));
}

}  // namespace

// Appends may fail; a successful sync reports the size written before it.
class FaultFileSystem::WritableFile final : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  WritableFile(FaultInjectionEnv* faults, std::string path,
               std::unique_ptr<rocksdb::FSWritableFile> base, uint64_t size_bytes)
      : FSWritableFileOwnerWrapper(std::move(base)),
        faults_(faults),
        path_(std::move(path)),
        size_bytes_(size_bytes) {}

  IOStatus Append(const Slice& data, const IOOptions& options, IODebugContext* dbg) override {
    if (Fault f = faults_->ChooseFileFault(FileOp::kWrite); f != Fault::kNone) {
      return Injected(f, "append", path_);
    }
    IOStatus s = FSWritableFileOwnerWrapper::Append(data, options, dbg);
    if (s.ok()) size_bytes_ += data.size();
    return s;
  }
  IOStatus Append(const Slice& data, const IOOptions& options,
                  const rocksdb::DataVerificationInfo& info, IODebugContext* dbg) override {
    if (Fault f = faults_->ChooseFileFault(FileOp::kWrite); f != Fault::kNone) {
      return Injected(f, "append", path_);
    }
    IOStatus s = FSWritableFileOwnerWrapper::Append(data, options, info, dbg);
    if (s.ok()) size_bytes_ += data.size();
    return s;
  }
  IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& options,
                            IODebugContext* dbg) override {
    if (Fault f = faults_->ChooseFileFault(FileOp::kWrite); f != Fault::kNone) {
      return Injected(f, "positioned append", path_);
    }
    IOStatus s = FSWritableFileOwnerWrapper::PositionedAppend(data, offset, options, dbg);
    if (s.ok()) GrowTo(offset + data.size());
    return s;
  }
  IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& options,
                            const rocksdb::DataVerificationInfo& info,
                            IODebugContext* dbg) override {
    if (Fault f = faults_->ChooseFileFault(FileOp::kWrite); f != Fault::kNone) {
      return Injected(f, "positioned append", path_);
    }
    IOStatus s = FSWritableFileOwnerWrapper::PositionedAppend(data, offset, options, info, dbg);
    if (s.ok()) GrowTo(offset + data.size());
    return s;
  }
  IOStatus Truncate(uint64_t size, const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = FSWritableFileOwnerWrapper::Truncate(size, options, dbg);
    if (s.ok()) {
      size_bytes_ = size;
      faults_->TrackFileTruncated(path_, size);
    }
    return s;
  }
  IOStatus Sync(const IOOptions& options, IODebugContext* dbg) override {
    return SyncWith(options, dbg, /*fsync=*/false);
  }
  IOStatus Fsync(const IOOptions& options, IODebugContext* dbg) override {
    return SyncWith(options, dbg, /*fsync=*/true);
  }

 private:
  IOStatus SyncWith(const IOOptions& options, IODebugContext* dbg, bool fsync) {
    if (Fault f = faults_->ChooseFileFault(FileOp::kSync); f != Fault::kNone) {
      return Injected(f, "sync", path_);
    }
    // RocksDB may sync a WAL while another thread appends to it: only the
    // bytes written before the sync started are known to be durable.
    const uint64_t synced = size_bytes_.load();
    IOStatus s = fsync ? FSWritableFileOwnerWrapper::Fsync(options, dbg)
                       : FSWritableFileOwnerWrapper::Sync(options, dbg);
    if (s.ok()) faults_->TrackFileSynced(path_, synced);
    return s;
  }
  void GrowTo(uint64_t end) {
    uint64_t current = size_bytes_.load();
    while (current < end && !size_bytes_.compare_exchange_weak(current, end)) {
    }
  }

  FaultInjectionEnv* const faults_;
  const std::string path_;
  std::atomic<uint64_t> size_bytes_;  // bytes written so far
};

class FaultFileSystem::RandomAccessFile final : public rocksdb::FSRandomAccessFileOwnerWrapper {
 public:
  RandomAccessFile(FaultInjectionEnv* faults, std::string path,
                   std::unique_ptr<rocksdb::FSRandomAccessFile> base)
      : FSRandomAccessFileOwnerWrapper(std::move(base)), faults_(faults), path_(std::move(path)) {}

  IOStatus Read(uint64_t offset, size_t n, const IOOptions& options, Slice* result, char* scratch,
                IODebugContext* dbg) const override {
    if (Fault f = faults_->ChooseFileFault(FileOp::kRead); f != Fault::kNone) {
      *result = Slice();
      return Injected(f, "read", path_);
    }
    return FSRandomAccessFileOwnerWrapper::Read(offset, n, options, result, scratch, dbg);
  }
  IOStatus MultiRead(rocksdb::FSReadRequest* reqs, size_t num_reqs, const IOOptions& options,
                     IODebugContext* dbg) override {
    IOStatus s = FSRandomAccessFileOwnerWrapper::MultiRead(reqs, num_reqs, options, dbg);
    if (!s.ok()) return s;
    for (size_t i = 0; i < num_reqs; ++i) {
      if (Fault f = faults_->ChooseFileFault(FileOp::kRead); f != Fault::kNone) {
        reqs[i].result = Slice();
        reqs[i].status = Injected(f, "read", path_);
      }
    }
    return s;
  }
  IOStatus ReadAsync(rocksdb::FSReadRequest& req, const IOOptions& options,
                     std::function<void(const rocksdb::FSReadRequest&, void*)> cb, void* cb_arg,
                     void** io_handle, rocksdb::IOHandleDeleter* del_fn,
                     IODebugContext* dbg) override {
    if (Fault f = faults_->ChooseFileFault(FileOp::kRead); f != Fault::kNone) {
      return Injected(f, "read", path_);
    }
    return FSRandomAccessFileOwnerWrapper::ReadAsync(req, options, std::move(cb), cb_arg, io_handle,
                                                     del_fn, dbg);
  }

 private:
  FaultInjectionEnv* const faults_;
  const std::string path_;
};

class FaultFileSystem::SequentialFile final : public rocksdb::FSSequentialFileOwnerWrapper {
 public:
  SequentialFile(FaultInjectionEnv* faults, std::string path,
                 std::unique_ptr<rocksdb::FSSequentialFile> base)
      : FSSequentialFileOwnerWrapper(std::move(base)), faults_(faults), path_(std::move(path)) {}

  IOStatus Read(size_t n, const IOOptions& options, Slice* result, char* scratch,
                IODebugContext* dbg) override {
    if (Fault f = faults_->ChooseFileFault(FileOp::kRead); f != Fault::kNone) {
      *result = Slice();
      return Injected(f, "read", path_);
    }
    return FSSequentialFileOwnerWrapper::Read(n, options, result, scratch, dbg);
  }
  IOStatus PositionedRead(uint64_t offset, size_t n, const IOOptions& options, Slice* result,
                          char* scratch, IODebugContext* dbg) override {
    if (Fault f = faults_->ChooseFileFault(FileOp::kRead); f != Fault::kNone) {
      *result = Slice();
      return Injected(f, "read", path_);
    }
    return FSSequentialFileOwnerWrapper::PositionedRead(offset, n, options, result, scratch, dbg);
  }

 private:
  FaultInjectionEnv* const faults_;
  const std::string path_;
};

// A successful directory sync makes the names of the files in it durable.
class FaultFileSystem::Directory final : public rocksdb::FSDirectoryWrapper {
 public:
  Directory(FaultInjectionEnv* faults, std::string path, std::unique_ptr<rocksdb::FSDirectory> base)
      : FSDirectoryWrapper(std::move(base)), faults_(faults), path_(std::move(path)) {}

  IOStatus Fsync(const IOOptions& options, IODebugContext* dbg) override {
    if (Fault f = faults_->ChooseFileFault(FileOp::kSync); f != Fault::kNone) {
      return Injected(f, "directory sync", path_);
    }
    IOStatus s = FSDirectoryWrapper::Fsync(options, dbg);
    if (s.ok()) faults_->TrackDirSynced(path_);
    return s;
  }
  IOStatus FsyncWithDirOptions(const IOOptions& options, IODebugContext* dbg,
                               const rocksdb::DirFsyncOptions& dir_options) override {
    if (Fault f = faults_->ChooseFileFault(FileOp::kSync); f != Fault::kNone) {
      return Injected(f, "directory sync", path_);
    }
    IOStatus s = FSDirectoryWrapper::FsyncWithDirOptions(options, dbg, dir_options);
    if (s.ok()) faults_->TrackDirSynced(path_);
    return s;
  }

 private:
  FaultInjectionEnv* const faults_;
  const std::string path_;
};

// ---- FaultFileSystem ---------------------------------------------------------

FaultFileSystem::FaultFileSystem(FaultInjectionEnv* faults,
                                 std::shared_ptr<rocksdb::FileSystem> target)
    : FileSystemWrapper(std::move(target)), faults_(faults) {}

FaultFileSystem::~FaultFileSystem() { faults_->UntrackFiles(this); }

IOStatus FaultFileSystem::NewSequentialFile(const std::string& fname,
                                            const rocksdb::FileOptions& options,
                                            std::unique_ptr<rocksdb::FSSequentialFile>* result,
                                            IODebugContext* dbg) {
  std::unique_ptr<rocksdb::FSSequentialFile> base;
  IOStatus s = target()->NewSequentialFile(fname, options, &base, dbg);
  if (s.ok()) result->reset(new SequentialFile(faults_, fname, std::move(base)));
  return s;
}

IOStatus FaultFileSystem::NewRandomAccessFile(const std::string& fname,
                                              const rocksdb::FileOptions& options,
                                              std::unique_ptr<rocksdb::FSRandomAccessFile>* result,
                                              IODebugContext* dbg) {
  std::unique_ptr<rocksdb::FSRandomAccessFile> base;
  IOStatus s = target()->NewRandomAccessFile(fname, options, &base, dbg);
  if (s.ok()) result->reset(new RandomAccessFile(faults_, fname, std::move(base)));
  return s;
}

IOStatus FaultFileSystem::NewWritableFile(const std::string& fname,
                                          const rocksdb::FileOptions& options,
                                          std::unique_ptr<rocksdb::FSWritableFile>* result,
                                          IODebugContext* dbg) {
  if (Fault f = faults_->ChooseFileFault(FileOp::kCreate); f != Fault::kNone) {
    return Injected(f, "create", fname);
  }
  const bool existed = target()->FileExists(fname, IOOptions(), dbg).ok();
  std::unique_ptr<rocksdb::FSWritableFile> base;
  IOStatus s = target()->NewWritableFile(fname, options, &base, dbg);
  if (!s.ok()) return s;
  faults_->TrackFileCreated(this, fname, existed);
  result->reset(new WritableFile(faults_, fname, std::move(base), 0));
  return s;
}

IOStatus FaultFileSystem::ReopenWritableFile(const std::string& fname,
                                             const rocksdb::FileOptions& options,
                                             std::unique_ptr<rocksdb::FSWritableFile>* result,
                                             IODebugContext* dbg) {
  uint64_t size_bytes = 0;
  const bool existed = target()->GetFileSize(fname, IOOptions(), &size_bytes, dbg).ok();
  if (!existed) {
    if (Fault f = faults_->ChooseFileFault(FileOp::kCreate); f != Fault::kNone) {
      return Injected(f, "create", fname);
    }
  }
  std::unique_ptr<rocksdb::FSWritableFile> base;
  IOStatus s = target()->ReopenWritableFile(fname, options, &base, dbg);
  if (!s.ok()) return s;
  if (existed) {
    faults_->TrackFileOpened(this, fname, size_bytes);
  } else {
    faults_->TrackFileCreated(this, fname, /*existed=*/false);
  }
  result->reset(new WritableFile(faults_, fname, std::move(base), size_bytes));
  return s;
}

IOStatus FaultFileSystem::ReuseWritableFile(const std::string&, const std::string&,
                                            const rocksdb::FileOptions&,
                                            std::unique_ptr<rocksdb::FSWritableFile>*,
                                            IODebugContext*) {
  return Refused("ReuseWritableFile");
}

IOStatus FaultFileSystem::NewRandomRWFile(const std::string&, const rocksdb::FileOptions&,
                                          std::unique_ptr<rocksdb::FSRandomRWFile>*,
                                          IODebugContext*) {
  return Refused("NewRandomRWFile");
}

IOStatus FaultFileSystem::LinkFile(const std::string&, const std::string&, const IOOptions&,
                                   IODebugContext*) {
  return Refused("LinkFile");
}

IOStatus FaultFileSystem::NewDirectory(const std::string& name, const IOOptions& options,
                                       std::unique_ptr<rocksdb::FSDirectory>* result,
                                       IODebugContext* dbg) {
  std::unique_ptr<rocksdb::FSDirectory> base;
  IOStatus s = target()->NewDirectory(name, options, &base, dbg);
  if (s.ok()) result->reset(new Directory(faults_, name, std::move(base)));
  return s;
}

IOStatus FaultFileSystem::DeleteFile(const std::string& fname, const IOOptions& options,
                                     IODebugContext* dbg) {
  IOStatus s = target()->DeleteFile(fname, options, dbg);
  if (s.ok() || s.IsNotFound() || s.IsPathNotFound()) faults_->TrackFileDeleted(fname);
  return s;
}

IOStatus FaultFileSystem::Truncate(const std::string& fname, size_t size, const IOOptions& options,
                                   IODebugContext* dbg) {
  IOStatus s = target()->Truncate(fname, size, options, dbg);
  if (s.ok()) faults_->TrackFileTruncated(fname, size);
  return s;
}

IOStatus FaultFileSystem::RenameFile(const std::string& src, const std::string& dest,
                                     const IOOptions& options, IODebugContext* dbg) {
  const bool dest_existed = target()->FileExists(dest, options, dbg).ok();
  IOStatus s = target()->RenameFile(src, dest, options, dbg);
  if (s.ok()) faults_->TrackFileRenamed(src, dest, dest_existed);
  return s;
}

absl::Status FaultFileSystem::TruncateFile(const std::string& path, uint64_t size_bytes) {
  uint64_t current = 0;
  IOStatus s = target()->GetFileSize(path, IOOptions(), &current, nullptr);
  if (s.IsNotFound() || s.IsPathNotFound() || (s.ok() && current <= size_bytes)) {
    return absl::OkStatus();
  }
  // Through a writable file: the default file systems need not implement
  // FileSystem::Truncate.
  std::unique_ptr<rocksdb::FSWritableFile> file;
  if (s.ok()) s = target()->ReopenWritableFile(path, rocksdb::FileOptions(), &file, nullptr);
  if (s.ok()) s = file->Truncate(size_bytes, IOOptions(), nullptr);
  if (s.ok()) s = file->Fsync(IOOptions(), nullptr);
  if (file != nullptr) {
    IOStatus closed = file->Close(IOOptions(), nullptr);
    if (s.ok()) s = closed;
  }
  return RocksToStatus(s, absl::StrCat("drop unsynced data of ", path));
}

absl::Status FaultFileSystem::RemoveFile(const std::string& path) {
  IOStatus s = target()->DeleteFile(path, IOOptions(), nullptr);
  if (s.IsNotFound() || s.IsPathNotFound()) return absl::OkStatus();
  return RocksToStatus(s, absl::StrCat("remove unsynced file ", path));
}

std::unique_ptr<rocksdb::Env> NewFaultCatalogEnv(FaultInjectionEnv* faults) {
  return rocksdb::NewCompositeEnv(std::make_shared<FaultFileSystem>(faults));
}

}  // namespace kvtier
