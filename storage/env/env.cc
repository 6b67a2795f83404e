#include "storage/env/env.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "storage/common/errno_status.h"

namespace kvtier {
namespace {

const char* OpName(IoOp op) {
  switch (op) {
    case IoOp::kRead:
      return "read";
    case IoOp::kWrite:
      return "write";
    case IoOp::kSync:
      return "fdatasync";
  }
  return "io";
}

}  // namespace

absl::Status IoErrorToStatus(int err, const IoRequest& request) {
  const std::string& path =
      request.file != nullptr ? request.file->path() : std::string("<no file>");
  std::string context = request.op == IoOp::kSync
                            ? absl::StrCat(OpName(request.op), " ", path)
                            : absl::StrCat(OpName(request.op), " ", path,
                                           " offset=", request.offset, " length=", request.length);
  return ErrnoToStatus(err, context);
}

absl::Status RunIoRequests(IoQueue& queue, absl::Span<IoRequest> requests) {
  absl::Status first_error;
  size_t next = 0;
  size_t finished = 0;
  std::vector<IoRequest*> completed;
  while (finished < requests.size()) {
    while (next < requests.size() && queue.in_flight() < queue.depth()) {
      queue.Enqueue(&requests[next++]);
    }
    completed.clear();
    absl::Status polled = queue.Poll(/*wait=*/true, &completed);
    if (!polled.ok()) return polled;
    for (IoRequest* request : completed) {
      ++finished;
      if (!request->status.ok() && first_error.ok()) {
        first_error = request->status;
      }
    }
  }
  return first_error;
}

}  // namespace kvtier
