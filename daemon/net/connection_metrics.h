// The connection metrics of the Unix sockets and the TCP front
// (docs/OPERATIONS.md), written at scrape time from the ConnectionGate and
// the accept loops' counters.
//
// Thread safety: reads only thread-safe accessors; call from the metrics
// registry's collector.
#ifndef KVTIER_DAEMON_NET_CONNECTION_METRICS_H_
#define KVTIER_DAEMON_NET_CONNECTION_METRICS_H_

#include <vector>

#include "daemon/metrics/registry.h"
#include "daemon/net/connection_gate.h"
#include "daemon/net/tcp_front.h"
#include "daemon/net/unix_acceptor.h"

namespace kvtier::daemon {

// acceptors: the counters of every accept loop (main socket, peer socket).
void WriteConnectionMetrics(const ConnectionGate& gate,
                            const std::vector<UnixAcceptorStats>& acceptors, metrics::Writer& w);

// The TCP front's (kvtier_tcp_*); only written when TCP is on.
void WriteTcpMetrics(const TcpFrontStats& tcp, metrics::Writer& w);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_NET_CONNECTION_METRICS_H_
