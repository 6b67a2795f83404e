// UnixAcceptor: the accept loop of one of the daemon's Unix sockets. The
// daemon accepts every connection itself and hands it to gRPC (or to the
// peer socket's per-uid server) only once it is worth a descriptor:
//
//   1. closed at once unless its peer uid (SO_PEERCRED) passes
//      `allow_uid` (when set);
//   2. accepted into a bounded pending list (max_pending; when full, the
//      oldest pending connection is closed to make room);
//   3. closed unless it sends its first bytes (a gRPC client sends the
//      HTTP/2 preface as it connects) within setup_timeout;
//   4. closed unless the ConnectionGate admits its uid under the per-uid
//      and total caps;
//   5. handed to `hand_off`, which owns the descriptor from then on.
//
// So idle connections cost nothing for long, and a process that holds many
// connections fills only its own uid's share. EMFILE and ENFILE never stop
// the loop: the acceptor closes its spare descriptor, accepts and closes
// one connection (so the backlog does not hold clients forever), reopens
// the spare and waits kEmfileBackoff before it accepts again. gRPC's own
// listener, by contrast, stops accepting for good on its first EMFILE.
//
// Thread safety: Start and Stop from one thread; the loop runs on a thread
// of its own and calls hand_off and allow_uid there; stats() from any
// thread.
#ifndef KVTIER_DAEMON_NET_UNIX_ACCEPTOR_H_
#define KVTIER_DAEMON_NET_UNIX_ACCEPTOR_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/net/connection_gate.h"
#include "storage/common/locked_stats.h"
#include "storage/common/owned_fd.h"

namespace kvtier::daemon {

inline constexpr std::chrono::milliseconds kEmfileBackoff(50);

// Binds a Unix stream socket at `path` with permission bits `mode` (set
// through the umask, so the socket never exists with wider ones) and
// listens with the kernel's largest backlog. `key` names the config key in
// errors. The path must not exist (callers remove stale sockets first).
absl::StatusOr<OwnedFd> ListenUnix(const std::string& key, const std::string& path, mode_t mode);

// After accept4 on listen_fd failed with `err`: when the process or the
// system is out of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM),
// gives up *spare (an open descriptor kept for this), accepts and closes one
// connection so that the backlog drains, reopens *spare and returns true
// (the caller then waits kEmfileBackoff). False for any other error.
bool ShedIfExhausted(int err, int listen_fd, OwnedFd* spare);

// What an accept loop does after accept4 on listen_fd failed with `err`.
enum class AfterAcceptError {
  kRetry,    // EINTR, ECONNABORTED, EPROTO: accept again now
  kBackOff,  // out of descriptors or memory: one connection was shed
             // (ShedIfExhausted); accept again after kEmfileBackoff
  kDone,     // EAGAIN (nothing left), or another error (logged)
};
// The accept loop HandleAcceptError acts for: its listening socket, the
// spare descriptor it sheds a connection with, its count of running out,
// its name in logs and the setting that sizes it.
struct AcceptLoopRef {
  int listen_fd = -1;
  OwnedFd* spare = nullptr;
  std::function<uint64_t()> count_exhausted;  // adds one; returns the new count
  std::string_view name;
  const char* limit_key = "";
};
// Counts each kBackOff with loop.count_exhausted and warns on the first and
// every 1000th, naming the loop and the setting that sizes it.
AfterAcceptError HandleAcceptError(int err, const AcceptLoopRef& loop);

struct UnixAcceptorOptions {
  std::string name;                               // for logs: "socket", "peer socket"
  OwnedFd listen_fd;                              // bound and listening (ListenUnix)
  ConnectionGate* gate = nullptr;                 // shared; must outlive the acceptor
  std::chrono::milliseconds setup_timeout{2000};  // server.connection_setup_ms
  size_t max_pending = 256;                       // server.max_pending_connections
  // Optional: a uid for which this returns false is closed before the gate.
  std::function<bool(uint32_t uid)> allow_uid;
  // Takes ownership of a connection that sent bytes and was admitted.
  std::function<void(int fd, uint32_t uid)> hand_off;
};

struct UnixAcceptorStats {
  uint64_t accepted = 0;        // accept4 returned a connection
  uint64_t handed_off = 0;      // given to hand_off
  uint64_t setup_timeouts = 0;  // closed: nothing sent within setup_timeout
  uint64_t evicted = 0;         // closed: the pending list was full
  uint64_t refused_uid = 0;     // closed at accept: allow_uid said no
  uint64_t refused_cap = 0;     // closed: the gate was full for its uid or in total
  uint64_t fd_exhausted = 0;    // accept4 failed with EMFILE/ENFILE/ENOBUFS/ENOMEM
};

class UnixAcceptor {
 public:
  static absl::StatusOr<std::unique_ptr<UnixAcceptor>> Start(UnixAcceptorOptions options);
  ~UnixAcceptor();  // Stop()

  // Stops the loop and closes the listening socket and every pending
  // connection; connections already handed off are not touched. Idempotent.
  void Stop();

  UnixAcceptorStats stats() const;

 private:
  struct Pending {
    int fd;
    uint32_t uid;  // SO_PEERCRED at accept
    std::chrono::steady_clock::time_point deadline;
  };
  explicit UnixAcceptor(UnixAcceptorOptions options) : options_(std::move(options)) {}
  void Loop();
  void AcceptBatch(std::chrono::steady_clock::time_point now);
  // True when the connection is done with (handed off or closed).
  bool OnReadable(const Pending& c);

  UnixAcceptorOptions options_;
  OwnedFd wake_fd_;   // eventfd: wakes the loop to stop
  OwnedFd spare_fd_;  // /dev/null, given up to accept one connection on EMFILE
  std::thread thread_;
  std::vector<Pending> pending_;                           // loop thread only, oldest first
  std::chrono::steady_clock::time_point backoff_until_{};  // loop thread only

  LockedStats<UnixAcceptorStats> stats_;
  bool stopped_ = false;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_NET_UNIX_ACCEPTOR_H_
