// TcpFront: the daemon's TCP listener. gRPC 1.51 cannot be handed a TLS
// connection the daemon accepted, and its own listener stops accepting for
// good on its first EMFILE, so the daemon accepts TCP itself and relays
// each admitted connection, bytes unchanged, to gRPC's TLS listener on a
// private Unix socket (a 0700 directory in the data directory). TLS runs
// end to end between the client and gRPC: the front never sees plaintext,
// and client certificates (mTLS) and tokens work as on a direct listener.
//
// A connection is
//   1. accepted into a bounded pending list (max_pending; when full, the
//      oldest pending connection is closed to make room);
//   2. closed unless its address is under max_per_address and the daemon
//      under max_total (pending connections count), so one address fills
//      only its own share;
//   3. closed unless it sends its first bytes (the TLS ClientHello) within
//      setup_timeout;
//   4. connected to the upstream socket and relayed until either side
//      closes: gRPC's handshake deadline and idle timeout
//      (server.connection_setup_ms, server.connection_idle_ms) apply to the
//      upstream connection, and their close ends the client's too.
// EMFILE and ENFILE never stop the loop (HandleAcceptError, as the Unix
// acceptor). A relayed connection costs three descriptors (the client's,
// the front's upstream end and gRPC's) and 2 x kRelayBufferBytes.
//
// Thread safety: Start and Stop from one thread; one thread of its own
// runs the accept loop and every relay; stats() from any thread.
#ifndef KVTIER_DAEMON_NET_TCP_FRONT_H_
#define KVTIER_DAEMON_NET_TCP_FRONT_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "storage/common/owned_fd.h"

namespace kvtier::daemon {

inline constexpr size_t kRelayBufferBytes = 16 << 10;  // per direction

// Binds and listens on "HOST:PORT", "[V6]:PORT" or ":PORT" (all
// addresses), non-blocking. `key` names the config key in errors.
absl::StatusOr<OwnedFd> ListenTcp(const std::string& key, const std::string& address);

// The port a bound socket listens on (for ":0" in tests).
int BoundPort(int listen_fd);

struct TcpFrontOptions {
  OwnedFd listen_fd;                              // ListenTcp
  std::string upstream_path;                      // gRPC's private TLS socket
  uint64_t max_total = 1024;                      // server.max_tcp_connections
  uint64_t max_per_address = 64;                  // server.max_tcp_connections_per_address
  size_t max_pending = 256;                       // server.max_pending_connections
  std::chrono::milliseconds setup_timeout{2000};  // server.connection_setup_ms
};

struct TcpFrontStats {
  uint64_t accepted = 0;         // accept4 returned a connection
  uint64_t relayed = 0;          // connected upstream
  uint64_t open = 0;             // pending or relayed now
  uint64_t setup_timeouts = 0;   // closed: nothing sent within setup_timeout
  uint64_t evicted = 0;          // closed: the pending list was full
  uint64_t refused_cap = 0;      // closed: its address or the daemon at its cap
  uint64_t upstream_failed = 0;  // closed: the upstream socket refused it
  uint64_t fd_exhausted = 0;     // accept4 failed with EMFILE/ENFILE/ENOBUFS/ENOMEM
};

class TcpFront {
 public:
  static absl::StatusOr<std::unique_ptr<TcpFront>> Start(TcpFrontOptions options);
  ~TcpFront();  // Stop()
  TcpFront(const TcpFront&) = delete;
  TcpFront& operator=(const TcpFront&) = delete;

  // Closes the listening socket and the pending connections; relayed ones
  // go on until either side closes them (the daemon's shutdown: gRPC
  // drains its calls and then closes the upstream ends). Idempotent.
  void StopAccepting();

  // Stops the loop and closes the listening socket and every pending and
  // relayed connection. Idempotent.
  void Stop();

  TcpFrontStats stats() const;

 private:
  class Loop;
  explicit TcpFront(std::unique_ptr<Loop> loop);

  std::unique_ptr<Loop> loop_;
  std::thread thread_;
  bool stopped_ = false;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_NET_TCP_FRONT_H_
