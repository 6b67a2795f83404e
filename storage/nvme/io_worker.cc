#include "storage/nvme/io_worker.h"

#include <utility>
#include <vector>

namespace kvtier {

IoWorker::IoWorker(std::unique_ptr<IoQueue> queue)
    : queue_(std::move(queue)), thread_([this] { Run(); }) {}

IoWorker::~IoWorker() {
  bool wake;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    wake = sleeping_;
    sleeping_ = false;
  }
  if (wake) queue_->Wake();
  thread_.join();
}

void IoWorker::Submit(absl::Span<IoRequest* const> requests) {
  if (requests.empty()) return;
  bool wake;
  {
    absl::MutexLock lock(&mu_);
    inbox_.insert(inbox_.end(), requests.begin(), requests.end());
    wake = sleeping_;
    sleeping_ = false;
  }
  if (wake) queue_->Wake();
}

uint64_t IoWorker::queue_failures() const {
  absl::MutexLock lock(&mu_);
  return queue_failures_;
}

void IoWorker::Run() {
  std::vector<IoRequest*> fresh;
  std::vector<IoRequest*> completed;
  for (;;) {
    fresh.clear();
    {
      absl::MutexLock lock(&mu_);
      const uint32_t room = queue_->depth() - queue_->in_flight();
      while (fresh.size() < room && !inbox_.empty()) {
        fresh.push_back(inbox_.front());
        inbox_.pop_front();
      }
      if (stopping_ && inbox_.empty() && fresh.empty() && queue_->in_flight() == 0) {
        return;
      }
      // With an empty inbox the next Poll may sleep until a new Submit; with
      // requests still waiting the ring is full and a completion will come.
      sleeping_ = inbox_.empty() && !stopping_;
    }
    for (IoRequest* request : fresh) queue_->Enqueue(request);
    completed.clear();
    // Always safe to wait: either requests are in flight, or sleeping_ is
    // set and the next Submit (or the destructor) calls Wake.
    absl::Status polled = queue_->Poll(/*wait=*/true, &completed);
    if (!polled.ok()) {
      absl::MutexLock lock(&mu_);
      ++queue_failures_;
    }
    for (IoRequest* request : completed) {
      static_cast<IoCompletion*>(request->user_data)->OnIoDone(request);
    }
  }
}

}  // namespace kvtier
