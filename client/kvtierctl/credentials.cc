#include "client/kvtierctl/credentials.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"

namespace kvtier::ctl {
namespace {

// A token is a single line; 4 KiB is far beyond any token and bounds the read.
constexpr size_t kMaxTokenFileBytes = 4096;

}  // namespace

absl::StatusOr<std::string> ResolveToken(const std::string& flag_token,
                                         const std::string& token_file, const char* env_token) {
  if (!flag_token.empty() && !token_file.empty()) {
    return absl::InvalidArgumentError("--token and --token-file: give at most one");
  }
  if (!flag_token.empty()) return flag_token;
  if (!token_file.empty()) {
    std::ifstream in(token_file, std::ios::binary);
    if (!in) return absl::NotFoundError("--token-file " + token_file + ": cannot be read");
    std::string text(kMaxTokenFileBytes + 1, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxTokenFileBytes) {
      return absl::InvalidArgumentError("--token-file " + token_file + ": larger than " +
                                        std::to_string(kMaxTokenFileBytes) + " bytes");
    }
    const std::string token(absl::StripAsciiWhitespace(text));
    if (token.empty()) {
      return absl::InvalidArgumentError("--token-file " + token_file + ": empty");
    }
    if (token.find_first_of("\r\n") != std::string::npos) {
      return absl::InvalidArgumentError("--token-file " + token_file +
                                        ": more than one line (it must hold only the token)");
    }
    return token;
  }
  if (env_token != nullptr && *env_token != '\0') return std::string(env_token);
  return std::string();
}

}  // namespace kvtier::ctl
