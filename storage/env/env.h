// kvtier::Env: the injected environment of the storage layer. Every file
// system call, every block-file I/O and every clock read of storage/ goes
// through an Env, so tests can substitute a FaultInjectionEnv (dropped
// unsynced data, I/O errors, ENOSPC, a manual clock).
//
// Three abstractions:
//   BlockFile  a preallocated, fixed-size data file opened for positional I/O,
//              normally with O_DIRECT (the NVMe tier's files).
//   IoQueue    batched asynchronous reads / writes / fdatasyncs at offsets of
//              block files (io_uring in the POSIX Env). One queue per I/O
//              thread.
//   Env        directories, small file operations, opening block files,
//              creating queues, clocks.
//
// Thread safety: Env methods are safe to call concurrently. A BlockFile is
// safe for concurrent ReadAt/WriteAt/Sync calls (positional I/O). An IoQueue
// is NOT thread-safe: it belongs to one thread at a time (see IoQueue).
#ifndef KVTIER_STORAGE_ENV_ENV_H_
#define KVTIER_STORAGE_ENV_ENV_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvtier {

// Alignment of offsets, lengths and buffer addresses for O_DIRECT I/O.
inline constexpr uint64_t kDirectIoAlignmentBytes = 4096;
// Largest single read or write request an IoQueue accepts (io_uring lengths
// are 32-bit; kept well below).
inline constexpr uint64_t kMaxIoRequestBytes = uint64_t{1} << 30;

struct BlockFileOptions {
  // Size of the file; the file is preallocated to exactly this many bytes
  // (fallocate) when it is created or found empty. Must be > 0 and, with
  // direct_io, a multiple of kDirectIoAlignmentBytes.
  uint64_t size_bytes = 0;
  // Create the file if it does not exist; otherwise a missing file is
  // NOT_FOUND.
  bool create_if_missing = true;
  // Open with O_DIRECT. If the file system refuses O_DIRECT (EINVAL, e.g.
  // some FUSE or older tmpfs), OpenBlockFile returns FAILED_PRECONDITION
  // saying so; the caller may then retry with direct_io = false (buffered
  // I/O through the page cache).
  bool direct_io = true;
};

// A preallocated fixed-size file for positional I/O. Owned by the caller of
// Env::OpenBlockFile; closing (destroying) it while an IoQueue still has
// requests on it in flight is a programming error.
class BlockFile {
 public:
  virtual ~BlockFile() = default;

  virtual const std::string& path() const = 0;
  virtual uint64_t size_bytes() const = 0;
  // True when opened with O_DIRECT: then every offset, length and buffer
  // address must be a multiple of kDirectIoAlignmentBytes.
  virtual bool direct_io() const = 0;
  // False when the file system could not preallocate (fallocate
  // unsupported) and the file was only extended (sparse).
  virtual bool preallocated() const = 0;

  // Synchronous positional I/O for tools and tests (the hot path uses an
  // IoQueue). Both transfer exactly buffer.size() bytes or fail; reading
  // past the end is OUT_OF_RANGE. Thread-safe.
  virtual absl::Status ReadAt(uint64_t offset, absl::Span<uint8_t> buffer) = 0;
  virtual absl::Status WriteAt(uint64_t offset, absl::Span<const uint8_t> data) = 0;
  // fdatasync. Data written before the call is durable once it returns OK.
  virtual absl::Status Sync() = 0;
};

enum class IoOp : uint8_t { kRead, kWrite, kSync };

// One operation for an IoQueue. The caller owns the request; from Enqueue
// until the queue hands it back through Poll, the request and its buffer
// must stay alive and untouched.
struct IoRequest {
  IoOp op = IoOp::kRead;
  BlockFile* file = nullptr;
  uint64_t offset = 0;
  // kRead: destination; kWrite: source (never modified); kSync: unused.
  uint8_t* buffer = nullptr;
  uint64_t length = 0;
  // Opaque to the queue.
  void* user_data = nullptr;

  // Result, set before the request is handed back. kRead/kWrite succeed only
  // when all `length` bytes were transferred.
  absl::Status status;

  // Owned by the queue (progress of short transfers, retry count).
  uint64_t transferred_bytes = 0;
  uint32_t attempts = 0;
};

// Converts a failed I/O (errno value err > 0) into a Status naming the file,
// operation, offset and length ("write /d/nvme-001.dat offset=8192
// length=4096: No space left on device"). The one place where I/O errors
// of an IoQueue become Status; codes follow ErrnoToStatus (ENOSPC ->
// RESOURCE_EXHAUSTED, EIO -> INTERNAL, ...).
absl::Status IoErrorToStatus(int err, const IoRequest& request);

struct IoQueueOptions {
  // Most requests in flight at once (the ring size). 1..4096.
  uint32_t depth = 64;
};

struct IoQueueStats {
  uint64_t submit_calls = 0;      // system calls that submitted or waited
  uint64_t completed = 0;         // requests handed back
  uint64_t fixed_buffer_ops = 0;  // used a registered buffer
  uint64_t requeued_short = 0;    // short transfers resubmitted
  uint64_t requeued_again = 0;    // -EAGAIN resubmitted
};

// Batched asynchronous I/O on block files.
//
// Thread safety: a queue belongs to one thread (its owner) at a time. Every
// method except Wake() must be called by the owner; Wake() may be called by
// any thread. A queue may be handed to another thread with a
// happens-before edge (e.g. created, then passed to a new std::thread).
//
// Usage: Enqueue up to depth() - in_flight() requests, then Poll() submits
// them all in one system call and collects whatever has completed. Short
// transfers and -EAGAIN are resubmitted inside the queue; a request comes
// back only when it is finished (fully transferred or failed).
class IoQueue {
 public:
  virtual ~IoQueue() = default;

  virtual uint32_t depth() const = 0;
  // Requests enqueued and not yet handed back by Poll.
  virtual uint32_t in_flight() const = 0;

  // Registers memory regions for fixed-buffer I/O (io_uring
  // READ_FIXED/WRITE_FIXED). Later requests whose buffer lies inside one
  // region use it. May be called once, before the first Enqueue. On failure
  // (e.g. RLIMIT_MEMLOCK) nothing is registered and requests use ordinary
  // buffers; the caller decides whether that is acceptable.
  virtual absl::Status RegisterBuffers(absl::Span<const absl::Span<uint8_t>> regions) = 0;
  virtual bool has_registered_buffers() const = 0;

  // Adds a request. Precondition: in_flight() < depth(). Invalid requests
  // (bad alignment for a direct_io file, out of range, null buffer) are not
  // submitted; they come back from the next Poll with INVALID_ARGUMENT or
  // OUT_OF_RANGE.
  virtual void Enqueue(IoRequest* request) = 0;

  // Submits everything enqueued, then appends every finished request to
  // *completed. With wait = true blocks until at least one request finished
  // or Wake() was called (returns right away if something already
  // finished). A non-OK return means the queue itself failed (not one
  // request); requests stay in flight and Poll may be retried.
  virtual absl::Status Poll(bool wait, std::vector<IoRequest*>* completed) = 0;

  // Makes a blocked (or the next) Poll(wait = true) return. Thread-safe.
  virtual void Wake() = 0;

  // Safe to read from any thread (relaxed counters).
  virtual IoQueueStats stats() const = 0;
};

// Runs `requests` on `queue` from its owner thread until all finished,
// keeping the queue as full as it allows. Each request's status is set;
// returns the first request error (or a queue failure), else OK.
absl::Status RunIoRequests(IoQueue& queue, absl::Span<IoRequest> requests);

class Env {
 public:
  virtual ~Env() = default;

  // The POSIX Env (io_uring queues, real clocks). A process-wide singleton,
  // never destroyed; thread-safe.
  static Env* Default();

  // Creates `path`; with recursive also its missing parents, mode 0700 (the
  // POSIX Env; files it creates are 0600). An existing directory is OK and
  // keeps its mode; an existing non-directory is FAILED_PRECONDITION.
  virtual absl::Status CreateDir(const std::string& path, bool recursive) = 0;
  // Removes an empty directory.
  virtual absl::Status DeleteDir(const std::string& path) = 0;
  // Names (not paths) of the entries of a directory, sorted, without "."
  // and "..".
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) = 0;
  virtual absl::Status DeleteFile(const std::string& path) = 0;
  // Atomically replaces `to` if it exists (rename(2)).
  virtual absl::Status RenameFile(const std::string& from, const std::string& to) = 0;
  // true / false, or an error other than "does not exist" (e.g. EACCES).
  virtual absl::StatusOr<bool> FileExists(const std::string& path) = 0;
  virtual absl::StatusOr<uint64_t> GetFileSize(const std::string& path) = 0;
  // fsync of a directory, making created, renamed and deleted entries
  // durable.
  virtual absl::Status SyncDir(const std::string& path) = 0;

  // Opens (creating and preallocating if needed) a block file. An existing
  // file must have size 0 (then it is preallocated) or exactly
  // options.size_bytes, else FAILED_PRECONDITION. A new file is fdatasync'ed
  // after preallocation; the caller syncs the directory. ENOSPC during
  // creation is RESOURCE_EXHAUSTED and leaves no file behind.
  virtual absl::StatusOr<std::unique_ptr<BlockFile>> OpenBlockFile(
      const std::string& path, const BlockFileOptions& options) = 0;

  // Creates an I/O queue for block files opened by this Env. Fails with
  // FAILED_PRECONDITION when the kernel refuses (no io_uring, seccomp,
  // kernel.io_uring_disabled); there is no silent fallback.
  virtual absl::StatusOr<std::unique_ptr<IoQueue>> NewIoQueue(const IoQueueOptions& options) = 0;

  // Monotonic clock (never goes back), microseconds since an arbitrary
  // epoch. Use for durations and deadlines.
  virtual uint64_t NowMicros() = 0;
  // Wall clock, microseconds since the Unix epoch. Use for timestamps that
  // survive restarts; may jump.
  virtual uint64_t WallMicros() = 0;
  virtual void SleepForMicros(uint64_t micros) = 0;
};

// Forwards every call to a target Env; subclasses override what they change.
// The target must outlive the wrapper.
class EnvWrapper : public Env {
 public:
  explicit EnvWrapper(Env* target) : target_(target) {}
  Env* target() const { return target_; }

  absl::Status CreateDir(const std::string& path, bool recursive) override {
    return target_->CreateDir(path, recursive);
  }
  absl::Status DeleteDir(const std::string& path) override { return target_->DeleteDir(path); }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    return target_->ListDir(path);
  }
  absl::Status DeleteFile(const std::string& path) override { return target_->DeleteFile(path); }
  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    return target_->RenameFile(from, to);
  }
  absl::StatusOr<bool> FileExists(const std::string& path) override {
    return target_->FileExists(path);
  }
  absl::StatusOr<uint64_t> GetFileSize(const std::string& path) override {
    return target_->GetFileSize(path);
  }
  absl::Status SyncDir(const std::string& path) override { return target_->SyncDir(path); }
  absl::StatusOr<std::unique_ptr<BlockFile>> OpenBlockFile(
      const std::string& path, const BlockFileOptions& options) override {
    return target_->OpenBlockFile(path, options);
  }
  absl::StatusOr<std::unique_ptr<IoQueue>> NewIoQueue(const IoQueueOptions& options) override {
    return target_->NewIoQueue(options);
  }
  uint64_t NowMicros() override { return target_->NowMicros(); }
  uint64_t WallMicros() override { return target_->WallMicros(); }
  void SleepForMicros(uint64_t micros) override { target_->SleepForMicros(micros); }

 private:
  Env* const target_;
};

}  // namespace kvtier

#endif  // KVTIER_STORAGE_ENV_ENV_H_
