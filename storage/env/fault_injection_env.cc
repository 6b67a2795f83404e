#include "storage/env/fault_injection_env.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "storage/common/errno_status.h"
#include "storage/common/status_macros.h"
#include "storage/env/aligned_buffer.h"

namespace kvtier {

// A BlockFile that records undo data for its synchronous writes. Queue I/O
// is handled by FaultIoQueue, which unwraps to base().
class FaultInjectionEnv::FaultBlockFile final : public BlockFile {
 public:
  FaultBlockFile(FaultInjectionEnv* env, std::unique_ptr<BlockFile> base)
      : env_(env), base_(std::move(base)) {}

  BlockFile* base() const { return base_.get(); }

  const std::string& path() const override { return base_->path(); }
  uint64_t size_bytes() const override { return base_->size_bytes(); }
  bool direct_io() const override { return base_->direct_io(); }
  bool preallocated() const override { return base_->preallocated(); }

  absl::Status ReadAt(uint64_t offset, absl::Span<uint8_t> buffer) override {
    return base_->ReadAt(offset, buffer);
  }

  absl::Status WriteAt(uint64_t offset, absl::Span<const uint8_t> data) override {
    const Fault fault = env_->ChooseFault(IoOp::kWrite);
    if (fault != Fault::kNone) {
      return ErrnoToStatus(fault == Fault::kNoSpace ? ENOSPC : EIO,
                           absl::StrCat("pwrite ", path(), " offset=", offset));
    }
    KVTIER_ASSIGN_OR_RETURN(uint64_t id, env_->SaveOldBytes(*base_, offset, data.size()));
    absl::Status status = base_->WriteAt(offset, data);
    env_->MarkWriteCompleted(path(), id, status.ok());
    return status;
  }

  absl::Status Sync() override {
    if (env_->ChooseFault(IoOp::kSync) != Fault::kNone) {
      return ErrnoToStatus(EIO, absl::StrCat("fdatasync ", path()));
    }
    const uint64_t seq = env_->NextSeq();
    KVTIER_RETURN_IF_ERROR(base_->Sync());
    env_->ForgetSynced(path(), seq);
    return absl::OkStatus();
  }

 private:
  FaultInjectionEnv* const env_;
  const std::unique_ptr<BlockFile> base_;
};

// Wraps a real queue: decides faults at Enqueue, records undo data for
// writes, and forgets it when a sync completes.
class FaultInjectionEnv::FaultIoQueue final : public IoQueue {
 public:
  FaultIoQueue(FaultInjectionEnv* env, std::unique_ptr<IoQueue> base)
      : env_(env), base_(std::move(base)) {}

  uint32_t depth() const override { return base_->depth(); }
  uint32_t in_flight() const override {
    return base_->in_flight() + static_cast<uint32_t>(failed_.size());
  }
  absl::Status RegisterBuffers(absl::Span<const absl::Span<uint8_t>> regions) override {
    return base_->RegisterBuffers(regions);
  }
  bool has_registered_buffers() const override { return base_->has_registered_buffers(); }
  void Wake() override { base_->Wake(); }
  IoQueueStats stats() const override { return base_->stats(); }

  void Enqueue(IoRequest* request) override {
    auto* file = dynamic_cast<FaultBlockFile*>(request->file);
    if (file == nullptr) {
      // Not ours: no faults, no undo data.
      base_->Enqueue(request);
      return;
    }
    request->status = absl::OkStatus();
    const Fault fault = env_->ChooseFault(request->op);
    if (fault != Fault::kNone) {
      Fail(request, fault == Fault::kNoSpace ? ENOSPC : EIO);
      return;
    }
    Pending pending{file, 0};
    if (request->op == IoOp::kWrite) {
      absl::StatusOr<uint64_t> id =
          env_->SaveOldBytes(*file->base(), request->offset, request->length);
      if (!id.ok()) {
        request->status = id.status();
        failed_.push_back(request);
        return;
      }
      pending.number = *id;
    } else if (request->op == IoOp::kSync) {
      pending.number = env_->NextSeq();
    }
    pending_[request] = pending;
    request->file = file->base();
    base_->Enqueue(request);
  }

  absl::Status Poll(bool wait, std::vector<IoRequest*>* completed) override {
    const size_t before = completed->size();
    completed->insert(completed->end(), failed_.begin(), failed_.end());
    failed_.clear();
    const size_t from_base = completed->size();
    const bool base_wait = wait && from_base == before;
    KVTIER_RETURN_IF_ERROR(base_->Poll(base_wait, completed));
    for (size_t i = from_base; i < completed->size(); ++i) {
      IoRequest* request = (*completed)[i];
      auto it = pending_.find(request);
      if (it == pending_.end()) continue;
      const Pending pending = it->second;
      pending_.erase(it);
      request->file = pending.file;
      if (request->op == IoOp::kWrite) {
        env_->MarkWriteCompleted(pending.file->path(), pending.number, request->status.ok());
      } else if (request->op == IoOp::kSync && request->status.ok()) {
        env_->ForgetSynced(pending.file->path(), pending.number);
      }
    }
    return absl::OkStatus();
  }

 private:
  struct Pending {
    FaultBlockFile* file;
    // Undo record id (writes) or sequence number at enqueue (syncs).
    uint64_t number;
  };

  void Fail(IoRequest* request, int err) {
    request->status = IoErrorToStatus(err, *request);
    failed_.push_back(request);
  }

  FaultInjectionEnv* const env_;
  const std::unique_ptr<IoQueue> base_;
  // Requests failed by injection, handed back at the next Poll.
  std::vector<IoRequest*> failed_;
  absl::flat_hash_map<IoRequest*, Pending> pending_;
};

// The slow-I/O generator's seed differs from the fault generator's, so the
// two sequences are unrelated.
constexpr uint64_t kSlowIoSeedSalt = 0x9e3779b97f4a7c15ull;

FaultInjectionEnv::FaultInjectionEnv(Env* target, uint64_t seed)
    : EnvWrapper(target), rng_(seed), slow_rng_(seed ^ kSlowIoSeedSalt) {}

absl::Status FaultInjectionEnv::CreateDir(const std::string& path, bool recursive) {
  bool no_space;
  {
    absl::MutexLock lock(&mu_);
    no_space = no_space_;
  }
  if (no_space) {
    KVTIER_ASSIGN_OR_RETURN(bool exists, target()->FileExists(path));
    if (!exists) return ErrnoToStatus(ENOSPC, absl::StrCat("mkdir ", path));
  }
  return target()->CreateDir(path, recursive);
}

absl::StatusOr<std::unique_ptr<BlockFile>> FaultInjectionEnv::OpenBlockFile(
    const std::string& path, const BlockFileOptions& options) {
  bool no_space;
  {
    absl::MutexLock lock(&mu_);
    no_space = no_space_;
  }
  if (no_space) {
    // Creating or preallocating would need space.
    KVTIER_ASSIGN_OR_RETURN(bool exists, target()->FileExists(path));
    uint64_t size_bytes = 0;
    if (exists) {
      KVTIER_ASSIGN_OR_RETURN(size_bytes, target()->GetFileSize(path));
    }
    if ((!exists && options.create_if_missing) || (exists && size_bytes == 0)) {
      return ErrnoToStatus(ENOSPC,
                           absl::StrCat("fallocate ", options.size_bytes, " bytes for ", path));
    }
  }
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<BlockFile> base, target()->OpenBlockFile(path, options));
  return std::unique_ptr<BlockFile>(new FaultBlockFile(this, std::move(base)));
}

absl::StatusOr<std::unique_ptr<IoQueue>> FaultInjectionEnv::NewIoQueue(
    const IoQueueOptions& options) {
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<IoQueue> base, target()->NewIoQueue(options));
  return std::unique_ptr<IoQueue>(new FaultIoQueue(this, std::move(base)));
}

FaultInjectionEnv::Fault FaultInjectionEnv::ChooseFault(IoOp op) {
  FileOp file_op = FileOp::kRead;
  switch (op) {
    case IoOp::kRead:
      file_op = FileOp::kRead;
      break;
    case IoOp::kWrite:
      file_op = FileOp::kWrite;
      break;
    case IoOp::kSync:
      file_op = FileOp::kSync;
      break;
  }
  return ChooseFileFault(file_op);
}

FaultInjectionEnv::Fault FaultInjectionEnv::ChooseFileFault(FileOp op) {
  Fault fault;
  uint64_t delay_micros;
  {
    absl::MutexLock lock(&mu_);
    if (hold_armed_ && hold_op_ == op) {
      hold_armed_ = false;
      io_held_ = true;
      mu_.Await(absl::Condition(&hold_released_));  // releases mu_ meanwhile
      io_held_ = false;
    }
    fault = ChooseLocked(op);
    delay_micros = SlowDelayLocked();
  }
  SleepReal(delay_micros);
  return fault;
}

uint64_t FaultInjectionEnv::SlowDelayLocked() {
  mu_.AssertHeld();
  if (slow_io_one_in_ == 0 || slow_io_delay_micros_ == 0) return 0;
  if (slow_rng_() % slow_io_one_in_ != 0) return 0;
  ++slow_ios_;
  return slow_io_delay_micros_;
}

void FaultInjectionEnv::SleepReal(uint64_t delay_micros) {
  // Not SleepForMicros: under the manual clock that only advances it, and
  // slow I/O must cost real time on the I/O path.
  if (delay_micros > 0) absl::SleepFor(absl::Microseconds(delay_micros));
}

FaultInjectionEnv::Fault FaultInjectionEnv::ChooseLocked(FileOp op) {
  mu_.AssertHeld();
  if ((op == FileOp::kWrite || op == FileOp::kCreate) && no_space_) {
    ++no_space_faults_;
    return Fault::kNoSpace;
  }
  uint32_t one_in = 0;
  switch (op) {
    case FileOp::kRead:
      one_in = read_error_one_in_;
      break;
    case FileOp::kWrite:
      one_in = write_error_one_in_;
      break;
    case FileOp::kSync:
      one_in = sync_error_one_in_;
      break;
    case FileOp::kCreate:
      break;
  }
  // The generator advances only while a knob is set, so a seed gives the
  // same faults whatever ran before with the knobs off.
  if (one_in > 0 && rng_() % one_in == 0) {
    ++injected_errors_;
    ++injected_by_op_[static_cast<int>(op)];
    return Fault::kIoError;
  }
  return Fault::kNone;
}

absl::StatusOr<uint64_t> FaultInjectionEnv::SaveOldBytes(BlockFile& file, uint64_t offset,
                                                         uint64_t length) {
  if (length == 0 || offset > file.size_bytes() || length > file.size_bytes() - offset) {
    return 0;  // The real write fails its own validation.
  }
  UndoRecord record;
  record.offset = offset;
  record.old_bytes.resize(length);
  if (file.direct_io()) {
    KVTIER_ASSIGN_OR_RETURN(AlignedBuffer bounce, AlignedBuffer::Allocate(length));
    KVTIER_RETURN_IF_ERROR(file.ReadAt(offset, bounce.span().subspan(0, length)));
    std::memcpy(record.old_bytes.data(), bounce.data(), length);
  } else {
    KVTIER_RETURN_IF_ERROR(file.ReadAt(offset, absl::MakeSpan(record.old_bytes)));
  }
  absl::MutexLock lock(&mu_);
  record.id = ++seq_;
  const uint64_t id = record.id;
  files_[file.path()].undo.push_back(std::move(record));
  return id;
}

void FaultInjectionEnv::MarkWriteCompleted(const std::string& path, uint64_t id, bool ok) {
  if (id == 0) return;
  absl::MutexLock lock(&mu_);
  auto it = files_.find(path);
  if (it == files_.end()) return;
  // A failed write may still have changed some bytes: keep its record so a
  // drop restores them too.
  for (UndoRecord& record : it->second.undo) {
    if (record.id == id) record.completed_seq = ++seq_;
  }
}

uint64_t FaultInjectionEnv::NextSeq() {
  absl::MutexLock lock(&mu_);
  return ++seq_;
}

void FaultInjectionEnv::ForgetSynced(const std::string& path, uint64_t sync_seq) {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(path);
  if (it == files_.end()) return;
  std::vector<UndoRecord>& undo = it->second.undo;
  std::erase_if(undo, [sync_seq](const UndoRecord& record) {
    return record.completed_seq != 0 && record.completed_seq < sync_seq;
  });
}

absl::Status FaultInjectionEnv::DropUnsyncedData() {
  KVTIER_RETURN_IF_ERROR(RestoreBlockFiles());
  return RestoreTrackedFiles();
}

absl::Status FaultInjectionEnv::RestoreBlockFiles() {
  std::map<std::string, FileState> files;
  {
    absl::MutexLock lock(&mu_);
    files.swap(files_);
  }
  for (auto& [path, state] : files) {
    if (state.undo.empty()) continue;
    KVTIER_ASSIGN_OR_RETURN(bool exists, target()->FileExists(path));
    if (!exists) continue;  // Deleted since: nothing to restore.
    KVTIER_ASSIGN_OR_RETURN(uint64_t size_bytes, target()->GetFileSize(path));
    BlockFileOptions options;
    options.size_bytes = size_bytes;
    options.create_if_missing = false;
    options.direct_io = false;  // Undo ranges need no alignment.
    KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<BlockFile> file,
                            target()->OpenBlockFile(path, options));
    // Newest first, so overlapping writes unwind to the oldest contents.
    for (auto it = state.undo.rbegin(); it != state.undo.rend(); ++it) {
      KVTIER_RETURN_IF_ERROR(file->WriteAt(it->offset, absl::MakeConstSpan(it->old_bytes)));
    }
    KVTIER_RETURN_IF_ERROR(file->Sync());
  }
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::RestoreTrackedFiles() {
  std::map<std::string, TrackedFile> tracked;
  {
    absl::MutexLock lock(&mu_);
    tracked.swap(tracked_);
  }
  for (const auto& [path, file] : tracked) {
    if (!file.name_durable) {
      KVTIER_RETURN_IF_ERROR(file.owner->RemoveFile(path));
    } else {
      KVTIER_RETURN_IF_ERROR(file.owner->TruncateFile(path, file.synced_bytes));
    }
  }
  return absl::OkStatus();
}

uint64_t FaultInjectionEnv::unsynced_write_count() const {
  absl::MutexLock lock(&mu_);
  uint64_t count = 0;
  for (const auto& [path, state] : files_) count += state.undo.size();
  return count;
}

void FaultInjectionEnv::SetReadErrorOneIn(uint32_t n) {
  absl::MutexLock lock(&mu_);
  read_error_one_in_ = n;
}

void FaultInjectionEnv::SetWriteErrorOneIn(uint32_t n) {
  absl::MutexLock lock(&mu_);
  write_error_one_in_ = n;
}

uint64_t FaultInjectionEnv::injected_error_count() const {
  absl::MutexLock lock(&mu_);
  return injected_errors_;
}

uint64_t FaultInjectionEnv::injected_error_count(FileOp op) const {
  absl::MutexLock lock(&mu_);
  return injected_by_op_[static_cast<int>(op)];
}

uint64_t FaultInjectionEnv::no_space_fault_count() const {
  absl::MutexLock lock(&mu_);
  return no_space_faults_;
}

void FaultInjectionEnv::SetSyncErrorOneIn(uint32_t n) {
  absl::MutexLock lock(&mu_);
  sync_error_one_in_ = n;
}

void FaultInjectionEnv::SetSlowIoOneIn(uint32_t n, uint64_t delay_micros) {
  absl::MutexLock lock(&mu_);
  slow_io_one_in_ = n;
  slow_io_delay_micros_ = delay_micros;
}

uint64_t FaultInjectionEnv::slow_io_count() const {
  absl::MutexLock lock(&mu_);
  return slow_ios_;
}

void FaultInjectionEnv::HoldNextIo(FileOp op) {
  absl::MutexLock lock(&mu_);
  hold_armed_ = true;
  hold_op_ = op;
  hold_released_ = false;
}

void FaultInjectionEnv::WaitForHeldIo() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&io_held_));
}

void FaultInjectionEnv::ReleaseHeldIo() {
  absl::MutexLock lock(&mu_);
  hold_released_ = true;
}

void FaultInjectionEnv::SetNoSpace(bool no_space) {
  absl::MutexLock lock(&mu_);
  no_space_ = no_space;
}

void FaultInjectionEnv::SetNowMicros(uint64_t now_micros) {
  const uint64_t wall = target()->WallMicros();
  absl::MutexLock lock(&mu_);
  if (!manual_now_micros_.has_value()) {
    manual_wall_base_micros_ = wall;
    manual_start_micros_ = now_micros;
  }
  manual_now_micros_ = now_micros;
}

void FaultInjectionEnv::AdvanceMicros(uint64_t micros) {
  const uint64_t now = target()->NowMicros();
  const uint64_t wall = target()->WallMicros();
  absl::MutexLock lock(&mu_);
  if (!manual_now_micros_.has_value()) {
    manual_wall_base_micros_ = wall;
    manual_start_micros_ = now;
    manual_now_micros_ = now;
  }
  *manual_now_micros_ += micros;
}

uint64_t FaultInjectionEnv::NowMicros() {
  {
    absl::MutexLock lock(&mu_);
    if (manual_now_micros_.has_value()) return *manual_now_micros_;
  }
  return target()->NowMicros();
}

uint64_t FaultInjectionEnv::WallMicros() {
  {
    absl::MutexLock lock(&mu_);
    if (manual_now_micros_.has_value()) {
      return manual_wall_base_micros_ + (*manual_now_micros_ - manual_start_micros_);
    }
  }
  return target()->WallMicros();
}

void FaultInjectionEnv::SleepForMicros(uint64_t micros) {
  {
    absl::MutexLock lock(&mu_);
    if (manual_now_micros_.has_value()) {
      *manual_now_micros_ += micros;
      return;
    }
  }
  target()->SleepForMicros(micros);
}

// ---- Files of other file systems ------------------------------------------

namespace {

std::string NormalPath(const std::string& path) {
  std::string normal = std::filesystem::path(path).lexically_normal().string();
  while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  return normal;
}

std::string ParentDir(const std::string& normal_path) {
  return std::filesystem::path(normal_path).parent_path().string();
}

}  // namespace

void FaultInjectionEnv::TrackFileCreated(FileRestorer* owner, const std::string& path,
                                         bool existed) {
  const std::string key = NormalPath(path);
  absl::MutexLock lock(&mu_);
  auto it = tracked_.find(key);
  // A name created since the last directory sync stays undurable when the
  // file is recreated; a name that existed untracked was durable.
  const bool name_durable = it != tracked_.end() ? it->second.name_durable : existed;
  tracked_[key] = TrackedFile{owner, 0, name_durable};
}

void FaultInjectionEnv::TrackFileOpened(FileRestorer* owner, const std::string& path,
                                        uint64_t size_bytes) {
  const std::string key = NormalPath(path);
  absl::MutexLock lock(&mu_);
  if (tracked_.contains(key)) return;
  tracked_[key] = TrackedFile{owner, size_bytes, true};
}

void FaultInjectionEnv::TrackFileSynced(const std::string& path, uint64_t synced_bytes) {
  absl::MutexLock lock(&mu_);
  auto it = tracked_.find(NormalPath(path));
  if (it != tracked_.end()) it->second.synced_bytes = synced_bytes;
}

void FaultInjectionEnv::TrackFileTruncated(const std::string& path, uint64_t size_bytes) {
  absl::MutexLock lock(&mu_);
  auto it = tracked_.find(NormalPath(path));
  if (it != tracked_.end()) {
    it->second.synced_bytes = std::min(it->second.synced_bytes, size_bytes);
  }
}

void FaultInjectionEnv::TrackFileRenamed(const std::string& from, const std::string& to,
                                         bool to_existed) {
  const std::string from_key = NormalPath(from);
  const std::string to_key = NormalPath(to);
  absl::MutexLock lock(&mu_);
  auto old_to = tracked_.find(to_key);
  const bool to_name_durable = old_to != tracked_.end() ? old_to->second.name_durable : to_existed;
  auto source = tracked_.find(from_key);
  if (source == tracked_.end()) {
    // Untracked contents (synced) under the new name.
    if (old_to != tracked_.end()) tracked_.erase(old_to);
    return;
  }
  TrackedFile moved = source->second;
  tracked_.erase(source);
  moved.name_durable = to_name_durable;
  tracked_[to_key] = moved;
}

void FaultInjectionEnv::TrackFileDeleted(const std::string& path) {
  absl::MutexLock lock(&mu_);
  tracked_.erase(NormalPath(path));
}

void FaultInjectionEnv::TrackDirSynced(const std::string& dir) {
  const std::string key = NormalPath(dir);
  absl::MutexLock lock(&mu_);
  for (auto& [path, file] : tracked_) {
    if (ParentDir(path) == key) file.name_durable = true;
  }
}

void FaultInjectionEnv::UntrackFiles(FileRestorer* owner) {
  absl::MutexLock lock(&mu_);
  std::erase_if(tracked_, [owner](const auto& entry) { return entry.second.owner == owner; });
}

uint64_t FaultInjectionEnv::tracked_file_count() const {
  absl::MutexLock lock(&mu_);
  return tracked_.size();
}

}  // namespace kvtier
