// ProgressReactor<T>: a server-streaming reactor for long admin operations
// (Verify, Drain). The operation runs on its own thread and Post()s
// progress messages; the reactor writes them in order, one at a time. When
// the client goes away the remaining messages are dropped but the
// operation still runs to its end (it leaves the store consistent).
//
// Thread safety: Post/Done may be called from the worker while gRPC runs
// OnWriteDone/OnDone on its threads; all shared state is under mu_.
#ifndef KVTIER_DAEMON_PROGRESS_REACTOR_H_
#define KVTIER_DAEMON_PROGRESS_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/grpc_status.h"

namespace kvtier::daemon {

template <class T>
class ProgressReactor final : public grpc::ServerWriteReactor<T> {
 public:
  // work(post) runs on a new thread; post(message) queues a message.
  // Bounded: when more than kMaxQueued messages wait, older intermediate
  // ones are dropped (progress is cumulative, the last one matters).
  using Work = std::function<absl::Status(const std::function<void(const T&)>& post)>;
  static constexpr size_t kMaxQueued = 64;

  // `hold` (may be null) is dropped as soon as the work returns, before the
  // final status is sent: a slot the call holds is free by the time its
  // client sees the end.
  explicit ProgressReactor(Work work, std::shared_ptr<void> hold = nullptr) {
    worker_ = std::thread([this, work = std::move(work), hold = std::move(hold)]() mutable {
      absl::Status st = work([this](const T& message) { Post(message); });
      hold.reset();
      absl::MutexLock lock(&mu_);
      final_ = st;
      work_done_ = true;
      MaybeWriteLocked();
    });
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) broken_ = true;
    MaybeWriteLocked();
  }

  void OnDone() override {
    worker_.join();
    delete this;
  }

 private:
  void Post(const T& message) {
    absl::MutexLock lock(&mu_);
    if (broken_) return;
    if (queue_.size() >= kMaxQueued) queue_.pop_front();
    queue_.push_back(message);
    MaybeWriteLocked();
  }

  // Starts the next write, or finishes the call once the work is done and
  // nothing is left to write. StartWrite/Finish are called under mu_, so
  // they happen in order and at most one write is in flight.
  void MaybeWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    mu_.AssertHeld();
    if (writing_ || finished_) return;
    if (!broken_ && !queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      this->StartWrite(&current_);
      return;
    }
    if (work_done_ && (queue_.empty() || broken_)) {
      finished_ = true;
      this->Finish(broken_ ? ToGrpcStatus(absl::CancelledError("client went away"))
                           : ToGrpcStatus(final_));
    }
  }

  absl::Mutex mu_;
  std::deque<T> queue_ ABSL_GUARDED_BY(mu_);
  T current_ ABSL_GUARDED_BY(mu_);  // the message being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool work_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status final_ ABSL_GUARDED_BY(mu_);
  std::thread worker_;  // set in the constructor, joined in OnDone
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_PROGRESS_REACTOR_H_
