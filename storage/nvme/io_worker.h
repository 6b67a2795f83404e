// IoWorker: one I/O thread that owns one IoQueue (one io_uring ring).
//
// Other threads hand it requests with Submit(); the worker moves them from
// its inbox into the ring (at most depth() in flight, the rest wait in the
// inbox in FIFO order), submits them in one system call per round, and when
// a request finishes calls the IoCompletion that request->user_data points
// to, on the worker thread.
//
// The worker sleeps inside IoQueue::Poll; a Submit that finds it sleeping
// wakes it with IoQueue::Wake (one eventfd write per sleep, not per
// request).
//
// Thread safety: Submit and queue_stats are thread-safe. Destruction waits
// for every submitted request to finish, so it must not race with Submit.
#ifndef KVTIER_STORAGE_NVME_IO_WORKER_H_
#define KVTIER_STORAGE_NVME_IO_WORKER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "storage/env/env.h"

namespace kvtier {

// Told about finished requests. Called on the worker thread: it must be
// short and must not wait for other I/O.
class IoCompletion {
 public:
  virtual void OnIoDone(IoRequest* request) = 0;

 protected:
  ~IoCompletion() = default;
};

class IoWorker {
 public:
  // Takes the queue (buffers already registered) and starts the thread.
  explicit IoWorker(std::unique_ptr<IoQueue> queue);
  // Finishes every submitted request, then joins the thread.
  ~IoWorker();

  IoWorker(const IoWorker&) = delete;
  IoWorker& operator=(const IoWorker&) = delete;

  // Queues requests for the ring. Each request->user_data must point to an
  // IoCompletion that outlives the request; the request must stay untouched
  // until its OnIoDone.
  void Submit(absl::Span<IoRequest* const> requests);

  IoQueueStats queue_stats() const { return queue_->stats(); }
  // io_uring_enter failures of the queue itself (retried); 0 normally.
  uint64_t queue_failures() const;

 private:
  void Run();

  const std::unique_ptr<IoQueue> queue_;
  mutable absl::Mutex mu_;
  std::deque<IoRequest*> inbox_ ABSL_GUARDED_BY(mu_);
  // The worker is (about to be) blocked in Poll and needs a Wake.
  bool sleeping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t queue_failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace kvtier

#endif  // KVTIER_STORAGE_NVME_IO_WORKER_H_
