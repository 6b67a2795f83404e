// "host:port" node addresses as Redis Cluster writes them (CLUSTER SLOTS,
// MOVED, ASK): an IPv4 address, a hostname or an IPv6 address, then a
// colon and a decimal port.
//
// Thread safety: pure functions.
#ifndef KVTIER_STORAGE_REMOTE_REDIS_HOST_PORT_H_
#define KVTIER_STORAGE_REMOTE_REDIS_HOST_PORT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvtier::remote {

struct HostPort {
  std::string host;   // never empty; IPv6 without brackets
  uint16_t port = 0;  // 1 .. 65535
};

// Splits at the last ':' ("[::1]:7000" and "::1:7000" both give host
// "::1"). INVALID_ARGUMENT `"<text>" is not host:port` (with the reason)
// when the host is empty or holds whitespace or control bytes, or the port
// is not a decimal number in 1 .. 65535.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view text);

// "host:port", the form every map and pool in this folder is keyed by.
std::string FormatHostPort(absl::string_view host, uint16_t port);

}  // namespace kvtier::remote

#endif  // KVTIER_STORAGE_REMOTE_REDIS_HOST_PORT_H_
