#include "storage/remote/redis/host_port.h"

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvtier::remote {
namespace {

absl::Status NotHostPort(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("\"", absl::CHexEscape(text), "\" is not host:port (", why, ")"));
}

}  // namespace

absl::StatusOr<HostPort> ParseHostPort(absl::string_view text) {
  const size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos) return NotHostPort(text, "no ':'");
  absl::string_view host = text.substr(0, colon);
  const absl::string_view port_text = text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty()) return NotHostPort(text, "empty host");
  for (const char c : host) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= ' ' || u == 0x7f) return NotHostPort(text, "space or control byte in host");
  }
  uint32_t port = 0;
  if (port_text.empty() || port_text.size() > 5 ||
      port_text.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(port_text, &port) || port == 0 || port > 65535) {
    return NotHostPort(text, "port must be 1..65535");
  }
  return HostPort{std::string(host), static_cast<uint16_t>(port)};
}

std::string FormatHostPort(absl::string_view host, uint16_t port) {
  return absl::StrCat(host, ":", port);
}

}  // namespace kvtier::remote
