// FdServer: hands a tenant the file descriptors of its own shared memory
// (its device arena and its staging file) over a Unix socket, so those
// files can be mode 0600 in a directory only the daemon can enter, or have
// no path at all (staging files are sealed memfds), and no other process
// can open them.
//
// Protocol (one request per connection, text lines, at most 512 bytes):
//
//   client -> daemon   "<kind> <token>\n"    kind: "arena" | "staging"
//   daemon -> client   "ok <size_bytes>\n"   with one descriptor attached
//                                            (SCM_RIGHTS): the arena
//                                            read-only, staging read-write
//                                            and sealed against shrinking
//                                            and growing (F_GET_SEALS)
//                      "error <code> <message>\n"
//                                            no descriptor; <code> is the
//                                            gRPC status code number
//
// <token> is the same bearer token the gRPC calls carry ("-" when
// authentication is off; the socket then serves the one tenant's staging
// file to whoever can connect, as the gRPC socket serves its calls). The daemon closes the
// connection after its reply; a client that sends nothing within 2 s is dropped.
//
// The client side is client/shm/fd_fetch.h.
//
// Thread safety: Start and the destructor from one thread; the resolver is
// called from the server's one worker thread (one event loop for every
// connection); the counters may be read from any thread.
#ifndef KVTIER_DAEMON_AUTH_FD_SERVER_H_
#define KVTIER_DAEMON_AUTH_FD_SERVER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/common/owned_fd.h"

namespace kvtier::daemon {

enum class SharedFile : uint8_t { kArena = 0, kStaging = 1 };

// A file the server may hand out: a descriptor to send as it is (fd), or
// else the path it opens (read-only for the arena, read-write for
// staging), and the file's size.
struct SharedFileRef {
  OwnedFd fd;
  std::string path;
  uint64_t size_bytes = 0;
};

inline constexpr int kRequestTimeoutMs = 2000;
inline constexpr size_t kMaxPendingConnections = 128;

class FdServer {
 public:
  // Maps (token, kind) to the caller's file; an error (UNAUTHENTICATED for
  // a bad token) is sent back as the "error" line.
  using Resolver =
      std::function<absl::StatusOr<SharedFileRef>(const std::string& token, SharedFile kind)>;

  // Listens on path (replacing a stale socket there), created with `mode`
  // (applied through the umask, so the socket never exists with wider
  // permissions).
  static absl::StatusOr<std::unique_ptr<FdServer>> Start(const std::string& path, uint32_t mode,
                                                         Resolver resolver);
  ~FdServer();  // stops the worker and removes the socket

  const std::string& path() const { return path_; }
  uint64_t served() const { return served_.load(); }
  // Connections closed at their deadline, and closed over the cap.
  uint64_t timed_out() const { return timed_out_.load(); }
  uint64_t refused() const { return refused_.load(); }
  // accept4 failures for want of descriptors (each backs off kEmfileBackoff).
  uint64_t fd_exhausted() const { return fd_exhausted_.load(); }

 private:
  struct Pending {
    int fd;
    std::chrono::steady_clock::time_point deadline;
    std::string line;  // bytes received so far
  };
  FdServer(std::string path, int listen_fd, int wake_fd, Resolver resolver);
  void Loop();
  void Accept();
  // Reads what arrived; serves a complete line. False: close the connection.
  bool ReadRequest(Pending* c);
  void Serve(int fd, const std::string& line);

  const std::string path_;
  const int listen_fd_;
  const int wake_fd_;  // eventfd: written by the destructor to stop Loop
  const Resolver resolver_;
  std::atomic<uint64_t> served_{0};
  std::atomic<uint64_t> timed_out_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> fd_exhausted_{0};
  std::vector<Pending> pending_;                           // the worker's only
  OwnedFd spare_fd_;                                       // the worker's only: shed on EMFILE
  std::chrono::steady_clock::time_point backoff_until_{};  // the worker's only
  std::thread worker_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_AUTH_FD_SERVER_H_
