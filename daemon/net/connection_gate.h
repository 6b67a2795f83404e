// ConnectionGate: the gRPC connections the daemon's Unix listeners have
// handed to gRPC, bounded per peer uid (SO_PEERCRED) and in total, so that
// no local process can take the descriptors every other client needs.
//
//   ConnectionGate gate({.max_total = 4096, .max_per_uid = 512});
//   if (!gate.Admit(fd, uid)) close(fd);      // over a cap: refused
//   else grpc::AddInsecureChannelFromFd(server, fd);
//
// A connection is counted from Admit until its descriptor is closed, by
// whoever owns it then (gRPC closes it when the client leaves or the
// connection idles out). The gate never touches an admitted descriptor: it
// remembers the socket's identity (device and inode) and, when it needs an
// exact count, asks the kernel whether that descriptor number still names
// that socket. A number reused by another file is a closed connection.
//
// Thread safety: every method is thread-safe (one mutex); listeners of
// several sockets share one gate.
#ifndef KVTIER_DAEMON_NET_CONNECTION_GATE_H_
#define KVTIER_DAEMON_NET_CONNECTION_GATE_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace kvtier::daemon {

struct ConnectionLimits {
  uint64_t max_total = 4096;   // server.max_connections
  uint64_t max_per_uid = 512;  // server.max_connections_per_uid
};

struct ConnectionGateStats {
  uint64_t open = 0;           // admitted and not known to be closed
  uint64_t admitted = 0;       // since start
  uint64_t refused_uid = 0;    // refused: the uid's cap was full
  uint64_t refused_total = 0;  // refused: the total cap was full
};

class ConnectionGate {
 public:
  explicit ConnectionGate(ConnectionLimits limits) : limits_(limits) {}
  ConnectionGate(const ConnectionGate&) = delete;
  ConnectionGate& operator=(const ConnectionGate&) = delete;

  // Counts the connected socket fd of peer `uid` and returns true, or
  // returns false (and counts nothing) when the uid or the daemon is at its
  // cap once the connections closed since the last look are forgotten.
  // The caller keeps ownership of fd either way.
  bool Admit(int fd, uint32_t uid);

  // Forgets the connections whose descriptors have been closed. Admit does
  // this itself when a cap looks full (at most every 20 ms); listeners
  // call it now and then so that stats() stays close to the truth.
  void Sweep();

  // Open connections of `uid` as last counted.
  uint64_t OpenOf(uint32_t uid) const;
  ConnectionGateStats stats() const;
  const ConnectionLimits& limits() const { return limits_; }

 private:
  struct Entry {
    dev_t dev = 0;
    ino_t ino = 0;
    uint32_t uid = 0;
  };
  void SweepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool FullLocked(uint32_t uid) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(absl::flat_hash_map<int, Entry>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ConnectionLimits limits_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, Entry> open_ ABSL_GUARDED_BY(mu_);  // by descriptor number
  absl::flat_hash_map<uint32_t, uint64_t> per_uid_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point last_sweep_ ABSL_GUARDED_BY(mu_){};
  uint64_t admitted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_uid_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_NET_CONNECTION_GATE_H_
