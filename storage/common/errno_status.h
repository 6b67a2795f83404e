// The one place where errno values become absl::Status.
#ifndef KVTIER_STORAGE_COMMON_ERRNO_STATUS_H_
#define KVTIER_STORAGE_COMMON_ERRNO_STATUS_H_

#include <string_view>

#include "absl/status/status.h"

namespace kvtier {

// Maps an errno value to a canonical code (ENOENT -> NOT_FOUND,
// ENOSPC/EDQUOT -> RESOURCE_EXHAUSTED, EINVAL -> INVALID_ARGUMENT,
// EACCES/EPERM -> PERMISSION_DENIED, EAGAIN/EINTR -> UNAVAILABLE,
// EEXIST -> ALREADY_EXISTS, EIO and others -> INTERNAL/DATA_LOSS-free
// INTERNAL) with the message "<context>: <strerror>". err must be > 0.
absl::Status ErrnoToStatus(int err, std::string_view context);

}  // namespace kvtier

#endif  // KVTIER_STORAGE_COMMON_ERRNO_STATUS_H_
