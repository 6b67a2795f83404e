#include "daemon/auth/token.h"

#include <openssl/rand.h>
#include <openssl/sha.h>

#include "absl/strings/escaping.h"

namespace kvtier::daemon {

std::string HashToken(absl::string_view token) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}

std::string NewToken() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) return std::string();
  std::string out;
  absl::WebSafeBase64Escape(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)), &out);
  return out;
}

}  // namespace kvtier::daemon
