#include "storage/catalog/rocksdb_status.h"

#include "absl/strings/str_cat.h"

namespace kvtier {

absl::Status RocksToStatus(const rocksdb::Status& status, absl::string_view context) {
  if (status.ok()) return absl::OkStatus();
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (status.IsNotFound()) {
    code = absl::StatusCode::kNotFound;
  } else if (status.IsCorruption()) {
    code = absl::StatusCode::kDataLoss;
  } else if (status.IsNoSpace()) {
    code = absl::StatusCode::kResourceExhausted;
  } else if (status.IsPathNotFound()) {
    code = absl::StatusCode::kNotFound;
  } else if (status.IsIOError()) {
    code = absl::StatusCode::kInternal;
  } else if (status.IsInvalidArgument()) {
    code = absl::StatusCode::kInvalidArgument;
  } else if (status.IsNotSupported()) {
    code = absl::StatusCode::kUnimplemented;
  } else if (status.IsBusy() || status.IsTryAgain() || status.IsIncomplete() ||
             status.IsShutdownInProgress()) {
    code = absl::StatusCode::kUnavailable;
  } else if (status.IsTimedOut() || status.IsExpired()) {
    code = absl::StatusCode::kDeadlineExceeded;
  } else if (status.IsAborted()) {
    code = absl::StatusCode::kAborted;
  } else if (status.IsColumnFamilyDropped()) {
    code = absl::StatusCode::kFailedPrecondition;
  }
  return absl::Status(code, absl::StrCat(context, ": ", status.ToString()));
}

}  // namespace kvtier
