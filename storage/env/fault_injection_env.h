// FaultInjectionEnv: an EnvWrapper for crash and error tests. It forwards
// everything to a real Env and only adds faults; it never fakes a success.
//
//  (a) Unsynced data. Every write to a block file (through an IoQueue of
//      this Env or BlockFile::WriteAt) first saves the bytes it overwrites.
//      A successful fdatasync of the file (IoOp::kSync or BlockFile::Sync)
//      forgets the saved bytes of writes that completed before it.
//      DropUnsyncedData() writes the saved bytes back, newest first, so each
//      file holds what it held at its last sync: a power loss.
//  (b) I/O errors. With SetReadErrorOneIn(n) / SetWriteErrorOneIn(n), each
//      read / write request enqueued on a queue of this Env (and each
//      BlockFile::WriteAt) fails with EIO with probability 1/n (seeded,
//      reproducible). A failed request is not executed: no bytes move.
//  (c) No space. With SetNoSpace(true), write requests, WriteAt and the
//      creation or preallocation of block files fail with ENOSPC
//      (RESOURCE_EXHAUSTED); CreateDir too.
//  (d) Manual clock. After SetNowMicros or AdvanceMicros, NowMicros returns
//      the manual time, WallMicros the wall time at that moment plus the
//      manual advance, and SleepForMicros advances the manual clock instead
//      of sleeping.
//  (e) Sync errors. With SetSyncErrorOneIn(n), each block-file fdatasync
//      (IoOp::kSync, BlockFile::Sync) fails with EIO with probability 1/n
//      (Env::SyncDir is not faulted). A failed sync syncs nothing: a later
//      drop still undoes the writes before it.
//  (f) Files of other file systems. A file system that is not an Env (the
//      catalog's RocksDB files, storage/catalog/fault_file_system.h) asks
//      ChooseFileFault before each operation, so the knobs above drive it
//      too, and reports what it did to its files through the Track*
//      methods. DropUnsyncedData() then restores those files through the
//      FileRestorer that reported them: a file created since the last
//      successful sync of its directory is removed; any other is truncated
//      to its size at its last successful sync. Not simulated:
//        - renames and deletions are durable at once, except that a file
//          renamed to a new name needs a directory sync like a new file
//          (without one it is removed, not put back under its old name);
//        - truncations are durable at once;
//        - unsynced bytes are lost whole: no torn or reordered writes, and
//          synced bytes never change;
//        - directories themselves never disappear.
//  (g) Slow I/O. With SetSlowIoOneIn(n, delay_micros), each operation that
//      (b), (c) or (e) may fault (block-file queue requests, WriteAt, Sync)
//      and each operation of another file system that asks
//      ChooseFileFault (f) first sleeps delay_micros of real time with
//      probability 1/n, on the thread doing the I/O (for queue requests
//      the thread that enqueues them), outside this Env's lock. The sleep
//      is real even under the manual clock (d), which it does not move.
//      The choice comes from a generator of its own (derived from the
//      seed), so turning slow I/O on or off never changes which operations
//      get errors.
//  (h) Held I/O, for tests that need an operation to stay in flight at a
//      known point: after HoldNextIo(op), the next operation of kind op
//      that (g) would consider waits, on the thread doing it and before
//      its fault is chosen, until ReleaseHeldIo(); WaitForHeldIo() returns
//      once it waits. A block-file queue request is held on the queue's
//      owner thread, so the requests behind it wait too.
//
// Thread safety: all methods are thread-safe. Files and queues created
// through this Env must be destroyed before it. Queues keep the IoQueue
// ownership rule (one owner thread).
#ifndef KVTIER_STORAGE_ENV_FAULT_INJECTION_ENV_H_
#define KVTIER_STORAGE_ENV_FAULT_INJECTION_ENV_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "storage/env/env.h"

namespace kvtier {

class FaultInjectionEnv final : public EnvWrapper {
 public:
  // target must outlive this Env. seed drives the one-in-N choices.
  explicit FaultInjectionEnv(Env* target, uint64_t seed = 1);

  absl::Status CreateDir(const std::string& path, bool recursive) override;
  absl::StatusOr<std::unique_ptr<BlockFile>> OpenBlockFile(
      const std::string& path, const BlockFileOptions& options) override;
  absl::StatusOr<std::unique_ptr<IoQueue>> NewIoQueue(const IoQueueOptions& options) override;
  uint64_t NowMicros() override;
  uint64_t WallMicros() override;
  void SleepForMicros(uint64_t micros) override;

  // (a) Restores every block file to its contents at its last successful
  // sync, then every tracked file (f). Call it when no I/O is in flight
  // (e.g. after closing the tier and the catalog that used the files). The
  // restored block-file bytes are synced. On error the remaining files are
  // left as they are and forgotten.
  absl::Status DropUnsyncedData();
  // Writes whose old contents are still remembered (not yet synced).
  uint64_t unsynced_write_count() const;

  // (b) 0 disables. Counts only requests enqueued afterwards.
  void SetReadErrorOneIn(uint32_t n);
  void SetWriteErrorOneIn(uint32_t n);
  uint64_t injected_error_count() const;

  // (c)
  void SetNoSpace(bool no_space);

  // (d)
  void SetNowMicros(uint64_t now_micros);
  void AdvanceMicros(uint64_t micros);

  // (e) 0 disables. Counts only syncs started afterwards.
  void SetSyncErrorOneIn(uint32_t n);

  // (g) n = 0 or delay_micros = 0 disables. Counts only operations started
  // afterwards; slow_io_count() is how many were delayed so far.
  void SetSlowIoOneIn(uint32_t n, uint64_t delay_micros);
  uint64_t slow_io_count() const;

  // (f) Files of other file systems.
  enum class FileOp : uint8_t {
    kRead,    // read knob
    kWrite,   // no space, then the write knob (appends, positioned writes)
    kSync,    // sync knob (file and directory syncs)
    kCreate,  // no space (creating a file)
  };
  enum class Fault : uint8_t { kNone, kIoError, kNoSpace };
  // The fault for one operation, drawn from the same seeded sequence as the
  // block files' faults. One-in-N errors count in injected_error_count().
  // May first sleep (g).
  Fault ChooseFileFault(FileOp op);
  // One-in-N errors injected so far into operations of kind op, block files
  // and other file systems together (kCreate: always 0); they add up to
  // injected_error_count(). no_space_fault_count(): writes and creations
  // failed by (c) through ChooseFileFault or a block-file request.
  uint64_t injected_error_count(FileOp op) const;
  uint64_t no_space_fault_count() const;

  // (h) One hold at a time: HoldNextIo replaces an armed one that no
  // operation reached yet.
  void HoldNextIo(FileOp op);
  void WaitForHeldIo();
  void ReleaseHeldIo();

  // Undoes unsynced changes to tracked files at a drop. Implemented by the
  // file system that reported them, which must call UntrackFiles(this)
  // before it is destroyed. Both calls treat a missing file as done.
  class FileRestorer {
   public:
    // Shrinks `path` to size_bytes when it is longer.
    virtual absl::Status TruncateFile(const std::string& path, uint64_t size_bytes) = 0;
    virtual absl::Status RemoveFile(const std::string& path) = 0;

   protected:
    ~FileRestorer() = default;
  };

  // Reports, after the operation succeeded. Paths are compared after
  // lexical normalisation; a path that is not tracked is left alone at a
  // drop (files that existed before tracking count as synced).
  //
  // `path` was created empty or emptied by opening it for writing;
  // `existed`: its name was there before (its directory entry is durable
  // unless it was itself created since the last directory sync).
  void TrackFileCreated(FileRestorer* owner, const std::string& path, bool existed);
  // An existing file of size_bytes was opened for appending. A file not
  // tracked yet starts synced at that size.
  void TrackFileOpened(FileRestorer* owner, const std::string& path, uint64_t size_bytes);
  // A sync of `path` succeeded; its first synced_bytes bytes are durable.
  void TrackFileSynced(const std::string& path, uint64_t synced_bytes);
  // `path` was truncated to size_bytes.
  void TrackFileTruncated(const std::string& path, uint64_t size_bytes);
  // `from` was renamed to `to`; `to_existed`: `to` was there before.
  void TrackFileRenamed(const std::string& from, const std::string& to, bool to_existed);
  void TrackFileDeleted(const std::string& path);
  // A sync of directory `dir` succeeded: the names of its files are durable.
  void TrackDirSynced(const std::string& dir);
  // Forgets every file reported by owner.
  void UntrackFiles(FileRestorer* owner);
  // Files tracked now (a drop forgets them all).
  uint64_t tracked_file_count() const;

 private:
  class FaultBlockFile;
  class FaultIoQueue;

  // Old contents of a range, saved before a write.
  struct UndoRecord {
    uint64_t offset = 0;
    std::vector<uint8_t> old_bytes;
    // Sequence number at completion; 0 while the write is in flight.
    uint64_t completed_seq = 0;
    uint64_t id = 0;
  };
  struct FileState {
    std::vector<UndoRecord> undo;
  };
  // A file of another file system (f).
  struct TrackedFile {
    FileRestorer* owner = nullptr;
    uint64_t synced_bytes = 0;
    // Its name survives a power loss (created before the last directory
    // sync, or existed before it was tracked).
    bool name_durable = false;
  };

  // Decisions for one block-file request (sleeps first when (g) says so).
  Fault ChooseFault(IoOp op);
  Fault ChooseLocked(FileOp op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // (g): the delay for one operation, 0 for none.
  uint64_t SlowDelayLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sleeps delay_micros of real time (never the manual clock); call
  // without mu_.
  static void SleepReal(uint64_t delay_micros);
  absl::Status RestoreBlockFiles();
  absl::Status RestoreTrackedFiles();

  // Saves the bytes a write to `file` at [offset, offset + length) will
  // overwrite; returns the record id (0 when nothing needs saving).
  absl::StatusOr<uint64_t> SaveOldBytes(BlockFile& file, uint64_t offset, uint64_t length);
  void MarkWriteCompleted(const std::string& path, uint64_t id, bool ok);
  // Sequence number to pass to ForgetSynced once the sync succeeded.
  uint64_t NextSeq();
  void ForgetSynced(const std::string& path, uint64_t sync_seq);

  mutable absl::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  uint32_t read_error_one_in_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t write_error_one_in_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t sync_error_one_in_ ABSL_GUARDED_BY(mu_) = 0;
  bool no_space_ ABSL_GUARDED_BY(mu_) = false;
  std::mt19937_64 slow_rng_ ABSL_GUARDED_BY(mu_);
  uint32_t slow_io_one_in_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t slow_io_delay_micros_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t slow_ios_ ABSL_GUARDED_BY(mu_) = 0;
  bool hold_armed_ ABSL_GUARDED_BY(mu_) = false;
  FileOp hold_op_ ABSL_GUARDED_BY(mu_) = FileOp::kRead;
  bool io_held_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_released_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t injected_errors_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t injected_by_op_[4] ABSL_GUARDED_BY(mu_) = {0, 0, 0, 0};  // FileOp order
  uint64_t no_space_faults_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, FileState> files_ ABSL_GUARDED_BY(mu_);
  // By normalised path.
  std::map<std::string, TrackedFile> tracked_ ABSL_GUARDED_BY(mu_);
  std::optional<uint64_t> manual_now_micros_ ABSL_GUARDED_BY(mu_);
  uint64_t manual_wall_base_micros_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t manual_start_micros_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier

#endif  // KVTIER_STORAGE_ENV_FAULT_INJECTION_ENV_H_
