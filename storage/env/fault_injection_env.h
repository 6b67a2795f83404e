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
  absl::StatusOr<std::unique_ptr<IoQueue>> NewIoQueue(
      const IoQueueOptions& options) override;
  uint64_t NowMicros() override;
  uint64_t WallMicros() override;
  void SleepForMicros(uint64_t micros) override;

  // (a) Restores every block file to its contents at its last successful
  // sync. Call it when no I/O is in flight (e.g. after closing the tier that
  // used the files). The restored bytes are synced.
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

  // Decisions for one request, taken under mu_.
  enum class Fault { kNone, kIoError, kNoSpace };
  Fault ChooseFault(IoOp op);

  // Saves the bytes a write to `file` at [offset, offset + length) will
  // overwrite; returns the record id (0 when nothing needs saving).
  absl::StatusOr<uint64_t> SaveOldBytes(BlockFile& file, uint64_t offset,
                                        uint64_t length);
  void MarkWriteCompleted(const std::string& path, uint64_t id, bool ok);
  // Sequence number to pass to ForgetSynced once the sync succeeded.
  uint64_t NextSeq();
  void ForgetSynced(const std::string& path, uint64_t sync_seq);

  mutable absl::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  uint32_t read_error_one_in_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t write_error_one_in_ ABSL_GUARDED_BY(mu_) = 0;
  bool no_space_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t injected_errors_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, FileState> files_ ABSL_GUARDED_BY(mu_);
  std::optional<uint64_t> manual_now_micros_ ABSL_GUARDED_BY(mu_);
  uint64_t manual_wall_base_micros_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t manual_start_micros_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier

#endif  // KVTIER_STORAGE_ENV_FAULT_INJECTION_ENV_H_
