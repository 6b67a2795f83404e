// The bearer token kvtierctl sends with every call (ClientOptions.token).
#ifndef KVTIER_CLIENT_KVTIERCTL_CREDENTIALS_H_
#define KVTIER_CLIENT_KVTIERCTL_CREDENTIALS_H_

#include <string>

#include "absl/status/statusor.h"

namespace kvtier::ctl {

// --token, else the content of --token-file, else env_token ($KVTIER_TOKEN;
// null or empty: unset), else "" (no token). Giving both --token and
// --token-file is INVALID_ARGUMENT. A token file holds the token and
// nothing else; surrounding whitespace (a trailing newline) is dropped. An
// unreadable, empty or multi-line file is an error naming the file.
absl::StatusOr<std::string> ResolveToken(const std::string& flag_token,
                                         const std::string& token_file, const char* env_token);

}  // namespace kvtier::ctl

#endif  // KVTIER_CLIENT_KVTIERCTL_CREDENTIALS_H_
