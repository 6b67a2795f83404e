// UringQueue: the POSIX IoQueue, one io_uring instance.
//
// How a Poll works: every enqueued request already sits in the submission
// ring; Poll submits them with one io_uring_enter (waiting for one
// completion when asked), then peeks every completion that is ready.
// Completions that transferred fewer bytes than asked (short I/O) or failed
// with -EAGAIN are prepared again for the remainder and go out with the next
// submission; other errors become a Status through IoErrorToStatus.
//
// Fixed buffers: regions passed to RegisterBuffers are registered with
// io_uring_register_buffers; a request whose buffer lies inside one uses
// READ_FIXED / WRITE_FIXED.
//
// Wake(): an eventfd that the ring polls (one internal POLL_ADD request, not
// counted in in_flight()), so a thread blocked in Poll can be woken by
// another thread without a second wait primitive.
//
// Thread safety: see IoQueue (one owner thread; Wake() and stats() from
// any thread).
#ifndef KVTIER_STORAGE_ENV_URING_QUEUE_H_
#define KVTIER_STORAGE_ENV_URING_QUEUE_H_

#include <liburing.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "storage/common/locked_stats.h"
#include "storage/env/env.h"

namespace kvtier {

class UringQueue final : public IoQueue {
 public:
  // FAILED_PRECONDITION when io_uring cannot be set up (kernel, seccomp,
  // kernel.io_uring_disabled); the message names the cause.
  static absl::StatusOr<std::unique_ptr<UringQueue>> Create(const IoQueueOptions& options);
  ~UringQueue() override;

  uint32_t depth() const override { return depth_; }
  uint32_t in_flight() const override { return in_flight_; }
  absl::Status RegisterBuffers(absl::Span<const absl::Span<uint8_t>> regions) override;
  bool has_registered_buffers() const override { return !regions_.empty(); }
  void Enqueue(IoRequest* request) override;
  absl::Status Poll(bool wait, std::vector<IoRequest*>* completed) override;
  void Wake() override;
  IoQueueStats stats() const override;

 private:
  UringQueue(uint32_t depth, int event_fd);

  // Validates a new request; returns the failure to report, or OK.
  absl::Status Validate(const IoRequest& request) const;
  // Fills one SQE for the untransferred part of `request`.
  void Prepare(IoRequest* request);
  void ArmWakePoll();
  // Handles one CQE; appends the request to *completed when finished.
  void Complete(io_uring_cqe* cqe, std::vector<IoRequest*>* completed);
  // Index of the registered region holding [data, data + length), or -1.
  int FindRegion(const uint8_t* data, uint64_t length) const;

  const uint32_t depth_;
  const int event_fd_;
  io_uring ring_{};
  bool ring_ready_ = false;
  bool wake_armed_ = false;
  // A Wake() consumed by a Poll(wait = false), owed to the next waiting Poll.
  bool pending_wake_ = false;
  uint32_t in_flight_ = 0;
  // Requests refused by Validate, handed back at the next Poll.
  std::vector<IoRequest*> refused_;
  struct Region {
    const uint8_t* data;
    uint64_t length;
  };
  std::vector<Region> regions_;

  LockedStats<IoQueueStats> stats_;
};

}  // namespace kvtier

#endif  // KVTIER_STORAGE_ENV_URING_QUEUE_H_
