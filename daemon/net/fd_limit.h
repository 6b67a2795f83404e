// The daemon's descriptor budget: RLIMIT_NOFILE, raised at start, and the
// connection caps sized below it so that connections can never take the
// descriptors the stores, arenas and listeners need.
//
// Thread safety: plain functions; RaiseFdLimit changes the process's
// limit (call it once, from main, before threads start).
#ifndef KVTIER_DAEMON_NET_FD_LIMIT_H_
#define KVTIER_DAEMON_NET_FD_LIMIT_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "daemon/config.h"
#include "daemon/net/connection_gate.h"

namespace kvtier::daemon {

// Descriptors kept for everything but client connections: the catalog's
// and tiers' files, io_uring, arenas and memfds, threads' eventfds, the
// metrics endpoint and the fd socket's pending requests.
inline constexpr uint64_t kFdReserve = 1024;

// Raises the soft RLIMIT_NOFILE to the hard limit. Returns the soft limit
// now in force.
uint64_t RaiseFdLimit();

// Descriptors the TCP front (tcp_front.h) may hold when TCP is on: three
// per relayed connection (pending ones hold one).
uint64_t TcpFdCost(const Config::Server& server);

// server.max_connections and server.max_connections_per_uid as they apply
// under the current soft RLIMIT_NOFILE: the total is lowered (with a
// warning in the log) to leave kFdReserve, both Unix sockets' pending
// lists and, with TCP on, TcpFdCost free; the per-uid cap never exceeds
// the total. FAILED_PRECONDITION
// naming the keys when fewer than 16 connections would be left.
absl::StatusOr<ConnectionLimits> ConnectionLimitsFor(const Config::Server& server);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_NET_FD_LIMIT_H_
