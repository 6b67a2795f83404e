#include "storage/env/uring_queue.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "storage/common/errno_status.h"
#include "storage/env/posix_env.h"

namespace kvtier {
namespace {

// Bound on resubmissions of one request (short transfers and -EAGAIN); a
// device that keeps returning partial I/O fails the request instead of
// spinning forever.
constexpr uint32_t kMaxAttempts = 1000;
// The kernel refuses registered buffers above 1 GiB per iovec.
constexpr uint64_t kMaxRegisteredChunkBytes = uint64_t{1} << 30;
constexpr unsigned kCqeBatch = 64;

// Tag of the internal eventfd poll; no IoRequest can live at this address.
char wake_tag;

}  // namespace

absl::StatusOr<std::unique_ptr<UringQueue>> UringQueue::Create(const IoQueueOptions& options) {
  if (options.depth == 0 || options.depth > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("IoQueueOptions.depth must be in [1, 4096], got ", options.depth));
  }
  const int event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (event_fd < 0) return ErrnoToStatus(errno, "eventfd for io_uring wakeup");
  std::unique_ptr<UringQueue> queue(new UringQueue(options.depth, event_fd));

  // One slot beyond depth for the wakeup poll. COOP_TASKRUN avoids
  // interrupting the owner thread for completions it will collect in its
  // next io_uring_enter anyway; kernels older than 5.19 refuse the flag, so
  // retry without it.
  io_uring_params params{};
  params.flags = IORING_SETUP_COOP_TASKRUN;
  int ret = io_uring_queue_init_params(options.depth + 1, &queue->ring_, &params);
  if (ret == -EINVAL) {
    params = io_uring_params{};
    ret = io_uring_queue_init_params(options.depth + 1, &queue->ring_, &params);
  }
  if (ret < 0) {
    const int err = -ret;
    if (err == ENOSYS || err == EPERM || err == EACCES) {
      return absl::FailedPreconditionError(
          absl::StrCat("io_uring_queue_init failed: ", std::strerror(err),
                       " (kernel without io_uring, blocked by seccomp, or "
                       "kernel.io_uring_disabled set); the NVMe tier needs io_uring"));
    }
    return ErrnoToStatus(err, "io_uring_queue_init");
  }
  queue->ring_ready_ = true;
  return queue;
}

UringQueue::UringQueue(uint32_t depth, int event_fd) : depth_(depth), event_fd_(event_fd) {}

UringQueue::~UringQueue() {
  if (ring_ready_) io_uring_queue_exit(&ring_);
  close(event_fd_);
}

absl::Status UringQueue::RegisterBuffers(absl::Span<const absl::Span<uint8_t>> regions) {
  if (!regions_.empty()) {
    return absl::FailedPreconditionError("io_uring buffers already registered");
  }
  std::vector<iovec> iovecs;
  std::vector<Region> chunks;
  uint64_t total_bytes = 0;
  for (absl::Span<uint8_t> region : regions) {
    for (uint64_t done = 0; done < region.size();) {
      const uint64_t length = std::min<uint64_t>(region.size() - done, kMaxRegisteredChunkBytes);
      iovecs.push_back(iovec{region.data() + done, length});
      chunks.push_back(Region{region.data() + done, length});
      done += length;
      total_bytes += length;
    }
  }
  if (iovecs.empty()) return absl::OkStatus();
  const int ret =
      io_uring_register_buffers(&ring_, iovecs.data(), static_cast<unsigned>(iovecs.size()));
  if (ret < 0) {
    return ErrnoToStatus(-ret, absl::StrCat("io_uring_register_buffers of ", total_bytes,
                                            " bytes (pinned memory counts against "
                                            "RLIMIT_MEMLOCK)"));
  }
  regions_ = std::move(chunks);
  return absl::OkStatus();
}

int UringQueue::FindRegion(const uint8_t* data, uint64_t length) const {
  for (size_t i = 0; i < regions_.size(); ++i) {
    const Region& r = regions_[i];
    if (data >= r.data && length <= r.length &&
        static_cast<uint64_t>(data - r.data) <= r.length - length) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

absl::Status UringQueue::Validate(const IoRequest& request) const {
  if (request.file == nullptr) {
    return absl::InvalidArgumentError("IoRequest.file is null");
  }
  if (dynamic_cast<const PosixBlockFile*>(request.file) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("IoRequest.file ", request.file->path(), " was not opened by PosixEnv"));
  }
  if (request.op == IoOp::kSync) return absl::OkStatus();
  const BlockFile& file = *request.file;
  if (request.buffer == nullptr || request.length == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("IoRequest on ", file.path(), " needs a buffer and length > 0"));
  }
  if (request.length > kMaxIoRequestBytes) {
    return absl::InvalidArgumentError(absl::StrCat("IoRequest.length ", request.length, " on ",
                                                   file.path(), " exceeds ", kMaxIoRequestBytes));
  }
  if (request.offset > file.size_bytes() || request.length > file.size_bytes() - request.offset) {
    return absl::OutOfRangeError(absl::StrCat("IoRequest offset=", request.offset,
                                              " length=", request.length, " beyond the end of ",
                                              file.path(), " (", file.size_bytes(), " bytes)"));
  }
  if (file.direct_io() &&
      (request.offset % kDirectIoAlignmentBytes != 0 ||
       request.length % kDirectIoAlignmentBytes != 0 ||
       reinterpret_cast<uintptr_t>(request.buffer) % kDirectIoAlignmentBytes != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "O_DIRECT request on ", file.path(), " offset=", request.offset, " length=", request.length,
        ": offset, length and buffer address must be multiples of ", kDirectIoAlignmentBytes));
  }
  return absl::OkStatus();
}

void UringQueue::Enqueue(IoRequest* request) {
  request->status = absl::OkStatus();
  request->transferred_bytes = 0;
  request->attempts = 0;
  ++in_flight_;
  absl::Status valid = Validate(*request);
  if (!valid.ok()) {
    request->status = std::move(valid);
    refused_.push_back(request);
    return;
  }
  Prepare(request);
}

void UringQueue::Prepare(IoRequest* request) {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  while (sqe == nullptr) {
    // The ring has depth + 1 slots and at most depth + 1 requests
    // (including the wakeup poll) exist, so this only happens when an
    // earlier submit was partial; push those out first.
    io_uring_submit(&ring_);
    stats_.Add(&IoQueueStats::submit_calls);
    sqe = io_uring_get_sqe(&ring_);
  }
  const int fd = static_cast<const PosixBlockFile*>(request->file)->fd();
  const uint64_t done = request->transferred_bytes;
  uint8_t* buffer = request->buffer + done;
  const unsigned length = static_cast<unsigned>(request->length - done);
  const uint64_t offset = request->offset + done;
  switch (request->op) {
    case IoOp::kRead:
    case IoOp::kWrite: {
      const bool read = request->op == IoOp::kRead;
      const int region = FindRegion(buffer, length);
      if (region >= 0) {
        stats_.Add(&IoQueueStats::fixed_buffer_ops);
        if (read) {
          io_uring_prep_read_fixed(sqe, fd, buffer, length, offset, region);
        } else {
          io_uring_prep_write_fixed(sqe, fd, buffer, length, offset, region);
        }
      } else if (read) {
        io_uring_prep_read(sqe, fd, buffer, length, offset);
      } else {
        io_uring_prep_write(sqe, fd, buffer, length, offset);
      }
      break;
    }
    case IoOp::kSync:
      io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC);
      break;
  }
  io_uring_sqe_set_data(sqe, request);
}

void UringQueue::ArmWakePoll() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) return;  // Retried at the next Poll.
  io_uring_prep_poll_add(sqe, event_fd_, POLLIN);
  io_uring_sqe_set_data(sqe, &wake_tag);
  wake_armed_ = true;
}

void UringQueue::Wake() {
  const uint64_t one = 1;
  // EAGAIN means the counter is saturated: a wakeup is already pending.
  ssize_t ignored = write(event_fd_, &one, sizeof(one));
  (void)ignored;
}

void UringQueue::Complete(io_uring_cqe* cqe, std::vector<IoRequest*>* completed) {
  auto* request = static_cast<IoRequest*>(io_uring_cqe_get_data(cqe));
  const int res = cqe->res;
  if (res == -EAGAIN || res == -EINTR) {
    if (++request->attempts < kMaxAttempts) {
      stats_.Add(&IoQueueStats::requeued_again);
      Prepare(request);
      return;
    }
    request->status = IoErrorToStatus(-res, *request);
  } else if (res < 0) {
    request->status = IoErrorToStatus(-res, *request);
  } else if (request->op != IoOp::kSync) {
    request->transferred_bytes += static_cast<uint64_t>(res);
    if (request->transferred_bytes < request->length) {
      if (res == 0 && request->op == IoOp::kRead) {
        request->status = absl::OutOfRangeError(absl::StrCat(
            "read ", request->file->path(), " offset=", request->offset, " length=",
            request->length, ": end of file after ", request->transferred_bytes, " bytes"));
      } else if (++request->attempts < kMaxAttempts) {
        stats_.Add(&IoQueueStats::requeued_short);
        Prepare(request);
        return;
      } else {
        request->status = IoErrorToStatus(EIO, *request);
      }
    }
  }
  --in_flight_;
  stats_.Add(&IoQueueStats::completed);
  completed->push_back(request);
}

absl::Status UringQueue::Poll(bool wait, std::vector<IoRequest*>* completed) {
  const size_t before = completed->size();
  for (IoRequest* request : refused_) {
    --in_flight_;
    stats_.Add(&IoQueueStats::completed);
    completed->push_back(request);
  }
  refused_.clear();
  if (wait && pending_wake_) {
    pending_wake_ = false;
    wait = false;
  }
  const bool must_wait = wait && completed->size() == before;
  for (;;) {
    if (!wake_armed_) ArmWakePoll();
    const int ret = must_wait ? io_uring_submit_and_wait(&ring_, 1) : io_uring_submit(&ring_);
    stats_.Add(&IoQueueStats::submit_calls);
    if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY && ret != -ETIME) {
      return ErrnoToStatus(-ret, "io_uring_enter");
    }
    bool woken = false;
    io_uring_cqe* cqes[kCqeBatch];
    unsigned count;
    while ((count = io_uring_peek_batch_cqe(&ring_, cqes, kCqeBatch)) > 0) {
      for (unsigned i = 0; i < count; ++i) {
        if (io_uring_cqe_get_data(cqes[i]) == &wake_tag) {
          uint64_t value;
          ssize_t ignored = read(event_fd_, &value, sizeof(value));
          (void)ignored;
          wake_armed_ = false;
          woken = true;
        } else {
          Complete(cqes[i], completed);
        }
      }
      io_uring_cq_advance(&ring_, count);
    }
    // A wakeup seen by a non-waiting Poll is kept for the next waiting one.
    if (woken && !must_wait) pending_wake_ = true;
    // Only resubmissions completed: wait again for a real completion.
    if (!must_wait || woken || completed->size() > before) {
      return absl::OkStatus();
    }
  }
}

IoQueueStats UringQueue::stats() const { return stats_.Get(); }

}  // namespace kvtier
