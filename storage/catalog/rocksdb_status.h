// The one place where rocksdb::Status becomes absl::Status.
#ifndef KVTIER_STORAGE_CATALOG_ROCKSDB_STATUS_H_
#define KVTIER_STORAGE_CATALOG_ROCKSDB_STATUS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "rocksdb/status.h"

namespace kvtier {

// ok -> OK; NotFound -> NOT_FOUND; Corruption -> DATA_LOSS;
// IOError: NoSpace -> RESOURCE_EXHAUSTED, PathNotFound -> NOT_FOUND, other
// -> INTERNAL; InvalidArgument -> INVALID_ARGUMENT; NotSupported ->
// UNIMPLEMENTED; Busy/TryAgain/Incomplete/ShutdownInProgress -> UNAVAILABLE;
// TimedOut/Expired -> DEADLINE_EXCEEDED; Aborted -> ABORTED;
// ColumnFamilyDropped -> FAILED_PRECONDITION; anything else -> INTERNAL.
// The message is "<context>: <rocksdb message>". Thread-safe.
absl::Status RocksToStatus(const rocksdb::Status& status, absl::string_view context);

}  // namespace kvtier

#endif  // KVTIER_STORAGE_CATALOG_ROCKSDB_STATUS_H_
