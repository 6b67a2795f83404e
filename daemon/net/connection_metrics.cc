#include "daemon/net/connection_metrics.h"

namespace kvtier::daemon {

void WriteConnectionMetrics(const ConnectionGate& gate,
                            const std::vector<UnixAcceptorStats>& acceptors, metrics::Writer& w) {
  UnixAcceptorStats sum;
  for (const UnixAcceptorStats& a : acceptors) {
    sum.accepted += a.accepted;
    sum.handed_off += a.handed_off;
    sum.setup_timeouts += a.setup_timeouts;
    sum.evicted += a.evicted;
    sum.refused_uid += a.refused_uid;
    sum.refused_cap += a.refused_cap;
    sum.fd_exhausted += a.fd_exhausted;
  }
  const ConnectionGateStats g = gate.stats();
  w.Gauge("kvtier_connections_open",
          "Client connections of the Unix sockets handed to gRPC and not yet closed", {},
          static_cast<double>(g.open));
  w.Counter("kvtier_connections_accepted_total", "Connections the Unix sockets accepted", {},
            static_cast<double>(sum.accepted));
  w.Counter("kvtier_connections_served_total",
            "Connections handed to gRPC (first bytes sent, under the caps)", {},
            static_cast<double>(sum.handed_off));
  const char* kClosed = "Connections closed before gRPC saw them, by reason";
  w.Counter("kvtier_connections_closed_total", kClosed, {{"reason", "cap"}},
            static_cast<double>(sum.refused_cap));
  w.Counter("kvtier_connections_closed_total", kClosed, {{"reason", "uid"}},
            static_cast<double>(sum.refused_uid));
  w.Counter("kvtier_connections_closed_total", kClosed, {{"reason", "setup_timeout"}},
            static_cast<double>(sum.setup_timeouts));
  w.Counter("kvtier_connections_closed_total", kClosed, {{"reason", "evicted"}},
            static_cast<double>(sum.evicted));
  w.Counter("kvtier_accept_fd_exhausted_total",
            "accept4 failures for want of descriptors or memory (each backs off 50 ms)", {},
            static_cast<double>(sum.fd_exhausted));
}

void WriteTcpMetrics(const TcpFrontStats& tcp, metrics::Writer& w) {
  w.Gauge("kvtier_tcp_connections_open",
          "TCP connections pending or relayed to gRPC's TLS listener", {},
          static_cast<double>(tcp.open));
  w.Counter("kvtier_tcp_connections_accepted_total", "Connections the TCP listener accepted", {},
            static_cast<double>(tcp.accepted));
  w.Counter("kvtier_tcp_connections_served_total",
            "TCP connections relayed to gRPC (first bytes sent, under the caps)", {},
            static_cast<double>(tcp.relayed));
  const char* kClosed = "TCP connections closed before gRPC saw them, by reason";
  w.Counter("kvtier_tcp_connections_closed_total", kClosed, {{"reason", "cap"}},
            static_cast<double>(tcp.refused_cap));
  w.Counter("kvtier_tcp_connections_closed_total", kClosed, {{"reason", "setup_timeout"}},
            static_cast<double>(tcp.setup_timeouts));
  w.Counter("kvtier_tcp_connections_closed_total", kClosed, {{"reason", "evicted"}},
            static_cast<double>(tcp.evicted));
  w.Counter("kvtier_tcp_connections_closed_total", kClosed, {{"reason", "upstream"}},
            static_cast<double>(tcp.upstream_failed));
  w.Counter("kvtier_tcp_accept_fd_exhausted_total",
            "TCP accept4 failures for want of descriptors or memory (each backs off 50 ms)", {},
            static_cast<double>(tcp.fd_exhausted));
}

}  // namespace kvtier::daemon
