// Client input quoted in error messages: cut to a few dozen bytes and
// escaped, so that a request cannot make the daemon send back (or log)
// megabytes of its own bytes, or control characters. Every message that
// quotes a client-supplied string (names, ids, keys, paths, tenant names)
// quotes it through one of these.
//
//   absl::StrCat("context_key: ", ClientHex(key), " has no versions")
//   -> "context_key: 6e6e...6e...(1048576 bytes) has no versions"
//
// Thread safety: pure functions.
#ifndef KVTIER_STORAGE_COMMON_CLIENT_TEXT_H_
#define KVTIER_STORAGE_COMMON_CLIENT_TEXT_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace kvtier {

// Bytes of client input a message quotes by default.
inline constexpr size_t kMaxQuotedBytes = 64;

// The first max_bytes bytes of text, non-printable bytes, quotes and
// backslashes escaped (absl::CHexEscape), followed by "...(N bytes)" when
// text is longer (N: its whole size). At most 4 * max_bytes + 32 bytes.
std::string ClientText(absl::string_view text, size_t max_bytes = kMaxQuotedBytes);

// The first max_bytes bytes of opaque client bytes (block ids, context
// keys) in lower-case hex, followed by "...(N bytes)" when longer. At most
// 2 * max_bytes + 32 bytes. 32 bytes: a whole block id.
std::string ClientHex(absl::string_view bytes, size_t max_bytes = 32);

}  // namespace kvtier

#endif  // KVTIER_STORAGE_COMMON_CLIENT_TEXT_H_
