#include "storage/common/errno_status.h"

#include <cerrno>
#include <cstring>
#include <string>

namespace kvtier {

absl::Status ErrnoToStatus(int err, std::string_view context) {
  std::string msg = std::string(context) + ": " + std::strerror(err);
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(msg);
    case EINVAL:
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(msg);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(msg);
    case EAGAIN:
    case EINTR:
    case EBUSY:
      return absl::UnavailableError(msg);
    case EEXIST:
      return absl::AlreadyExistsError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace kvtier
