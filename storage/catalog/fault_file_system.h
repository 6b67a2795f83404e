// FaultFileSystem: a rocksdb::FileSystem for crash and error tests of the
// catalog. It forwards to a real RocksDB file system and takes every fault
// from a FaultInjectionEnv, so one set of knobs drives the NVMe tier's block
// files and the catalog's RocksDB files together:
//
//   SetWriteErrorOneIn(n)  each Append / PositionedAppend fails with
//                          IOStatus::IOError, nothing written.
//   SetReadErrorOneIn(n)   each Read / PositionedRead / MultiRead request /
//                          ReadAsync fails with IOStatus::IOError.
//   SetSyncErrorOneIn(n)   each file Sync / Fsync and directory Fsync fails
//                          with IOStatus::IOError, nothing synced.
//   SetNoSpace(true)       appends and the creation of files fail with
//                          IOStatus::NoSpace (RESOURCE_EXHAUSTED through
//                          RocksToStatus).
//   DropUnsyncedData()     every file this file system wrote is truncated
//                          to its size at its last successful Sync/Fsync
//                          (WAL, MANIFEST, SSTs, CURRENT, OPTIONS, ...), and
//                          a file created since the last successful Fsync of
//                          its directory is removed.
//
// Errors carry "injected" and the file name in their message. The faults
// are drawn from the FaultInjectionEnv's seeded sequence (see (f) in
// storage/env/fault_injection_env.h for what a drop does not simulate).
// Not faulted: opening files for reading, listing, renaming, deleting,
// locking, Truncate, RangeSync (not a durability point), and RocksDB's info
// LOG (NewLogger writes it outside this file system). ReuseWritableFile,
// NewRandomRWFile and LinkFile are refused with NotSupported: the catalog's
// options do not use them, and they would escape the simulation.
//
// Lifetime: the FaultInjectionEnv must outlive this file system, and this
// file system (held by the rocksdb::Env of NewFaultCatalogEnv) must outlive
// every DB opened on it. To simulate a power loss, close the DB first (a
// clean close still leaves the WAL's unsynced tail unsynced), then call
// DropUnsyncedData() while this file system is alive.
//
// Thread safety: safe for concurrent use, like any rocksdb::FileSystem;
// each file object keeps RocksDB's own rules for its files.
#ifndef KVTIER_STORAGE_CATALOG_FAULT_FILE_SYSTEM_H_
#define KVTIER_STORAGE_CATALOG_FAULT_FILE_SYSTEM_H_

#include <memory>
#include <string>

#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "storage/env/fault_injection_env.h"

namespace kvtier {

class FaultFileSystem final : public rocksdb::FileSystemWrapper,
                              private FaultInjectionEnv::FileRestorer {
 public:
  // faults is not owned. target: the file system that does the I/O.
  explicit FaultFileSystem(FaultInjectionEnv* faults, std::shared_ptr<rocksdb::FileSystem> target =
                                                          rocksdb::FileSystem::Default());
  ~FaultFileSystem() override;

  static const char* kClassName() { return "KvtierFaultFileSystem"; }
  const char* Name() const override { return kClassName(); }

  rocksdb::IOStatus NewSequentialFile(const std::string& fname, const rocksdb::FileOptions& options,
                                      std::unique_ptr<rocksdb::FSSequentialFile>* result,
                                      rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus NewRandomAccessFile(const std::string& fname,
                                        const rocksdb::FileOptions& options,
                                        std::unique_ptr<rocksdb::FSRandomAccessFile>* result,
                                        rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus NewWritableFile(const std::string& fname, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReopenWritableFile(const std::string& fname,
                                       const rocksdb::FileOptions& options,
                                       std::unique_ptr<rocksdb::FSWritableFile>* result,
                                       rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReuseWritableFile(const std::string& fname, const std::string& old_fname,
                                      const rocksdb::FileOptions& options,
                                      std::unique_ptr<rocksdb::FSWritableFile>* result,
                                      rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus NewRandomRWFile(const std::string& fname, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSRandomRWFile>* result,
                                    rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus NewDirectory(const std::string& name, const rocksdb::IOOptions& options,
                                 std::unique_ptr<rocksdb::FSDirectory>* result,
                                 rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus DeleteFile(const std::string& fname, const rocksdb::IOOptions& options,
                               rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus Truncate(const std::string& fname, size_t size,
                             const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus RenameFile(const std::string& src, const std::string& dest,
                               const rocksdb::IOOptions& options,
                               rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus LinkFile(const std::string& src, const std::string& dest,
                             const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* dbg) override;

 private:
  class Directory;
  class RandomAccessFile;
  class SequentialFile;
  class WritableFile;

  // FaultInjectionEnv::FileRestorer, called by DropUnsyncedData().
  absl::Status TruncateFile(const std::string& path, uint64_t size_bytes) override;
  absl::Status RemoveFile(const std::string& path) override;

  FaultInjectionEnv* const faults_;
};

// A rocksdb::Env (threads and clock of rocksdb::Env::Default()) whose file
// system is a FaultFileSystem over the default one, for
// CatalogOptions::rocksdb_env and BlockStoreOptions::catalog_env. The Env
// owns the file system; see FaultFileSystem for lifetimes.
std::unique_ptr<rocksdb::Env> NewFaultCatalogEnv(FaultInjectionEnv* faults);

}  // namespace kvtier

#endif  // KVTIER_STORAGE_CATALOG_FAULT_FILE_SYSTEM_H_
