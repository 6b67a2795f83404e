#include "daemon/net/fd_limit.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvtier::daemon {

uint64_t RaiseFdLimit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 0;
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  return lim.rlim_cur;
}

uint64_t TcpFdCost(const Config::Server& server) { return 3 * server.max_tcp_connections; }

absl::StatusOr<ConnectionLimits> ConnectionLimitsFor(const Config::Server& server) {
  rlimit lim{};
  uint64_t soft = UINT64_MAX;
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) soft = lim.rlim_cur;
  uint64_t reserve = kFdReserve + 2 * server.max_pending_connections;
  if (!server.tcp_address.empty()) reserve += TcpFdCost(server);
  const uint64_t room = soft > reserve ? soft - reserve : 0;
  if (room < 16) {
    return absl::FailedPreconditionError(absl::StrCat(
        "RLIMIT_NOFILE is ", soft, ": too low for kvtierd, which keeps ", reserve,
        " descriptors for itself (", kFdReserve, " plus twice server.max_pending_connections",
        server.tcp_address.empty() ? "" : " plus TCP's: 3 x server.max_tcp_connections",
        ") and needs at least 16 for server.max_connections; raise it (LimitNOFILE= in the "
        "unit, ulimit -n)"));
  }
  ConnectionLimits limits;
  limits.max_total = server.max_connections;
  if (limits.max_total > room) {
    spdlog::warn(
        "server.max_connections = {} lowered to {}: RLIMIT_NOFILE is {} and {} "
        "descriptors are kept for the daemon itself",
        server.max_connections, room, soft, reserve);
    limits.max_total = room;
  }
  limits.max_per_uid = std::min(server.max_connections_per_uid, limits.max_total);
  return limits;
}

}  // namespace kvtier::daemon
