// FetchSharedFd: the client side of the daemon's descriptor socket
// (daemon/auth/fd_server.h). With authentication on, a tenant's device
// arena and staging file are mode 0600 in a directory only the daemon can
// enter; OpenArena and ReserveSlots then name a Unix socket
// (fd_socket_path) instead of a path, and the client asks it for an open
// descriptor of its own file:
//
//   client -> daemon   "<arena|staging> <token>\n"   token "-" when none
//   daemon -> client   "ok <size_bytes>\n"           one fd (SCM_RIGHTS):
//                                                    arena O_RDONLY,
//                                                    staging O_RDWR
//                      "error <code> <message>\n"    no fd; <code> is a
//                                                    gRPC status code number
//
// One request per connection; the daemon closes it after the reply.
//
// Depends only on the C++ standard library and POSIX (no gRPC, no abseil),
// like the rest of client/shm: errors carry the gRPC status code as a
// number, which absl::StatusCode / grpc::StatusCode take unchanged.
//
// Thread safety: FetchSharedFd is thread-safe (one connection per call). A
// FetchedFd is a plain value: use one from one thread at a time.
#ifndef KVTIER_CLIENT_SHM_FD_FETCH_H_
#define KVTIER_CLIENT_SHM_FD_FETCH_H_

#include <cstdint>
#include <string>

namespace kvtier::client {

enum class SharedFileKind : uint8_t { kArena, kStaging };

// gRPC status code numbers FetchSharedFd reports for its own failures (a
// daemon "error" line passes its code through unchanged).
inline constexpr int kFdOk = 0;
inline constexpr int kFdInvalidArgument = 3;   // bad token or socket path
inline constexpr int kFdDeadlineExceeded = 4;  // no reply within timeout_ms
inline constexpr int kFdInternal = 13;         // malformed reply, fd missing
inline constexpr int kFdUnavailable = 14;      // cannot connect or send

// The outcome of FetchSharedFd: a descriptor and the size the daemon
// announced, or a code and a message. Owns the descriptor: the destructor
// closes it unless Release() handed it over. Move-only.
class FetchedFd {
 public:
  FetchedFd() = default;
  FetchedFd(int fd, uint64_t size_bytes) : fd_(fd), size_bytes_(size_bytes) {}
  static FetchedFd Error(int code, std::string message);
  FetchedFd(FetchedFd&& other) noexcept;
  FetchedFd& operator=(FetchedFd&& other) noexcept;
  FetchedFd(const FetchedFd&) = delete;
  FetchedFd& operator=(const FetchedFd&) = delete;
  ~FetchedFd();

  bool ok() const { return code_ == kFdOk; }
  // kFdOk, or a gRPC status code number (16 UNAUTHENTICATED for a bad token).
  int code() const { return code_; }
  // Empty on success; otherwise names the socket and the cause.
  const std::string& message() const { return message_; }
  // "UNAUTHENTICATED: <message>", or "OK".
  std::string ToString() const;
  // >= 0 exactly when ok(); still owned by this object.
  int fd() const { return fd_; }
  // The file's size as the daemon announced it (not checked against the
  // file: the mappers in shm_mapping.h do that).
  uint64_t size_bytes() const { return size_bytes_; }
  // Hands the descriptor to the caller (who must close it); -1 if none.
  int Release();

 private:
  int fd_ = -1;
  uint64_t size_bytes_ = 0;
  int code_ = kFdOk;
  std::string message_;
};

// Connects to socket_path, asks for the caller's `kind` file with `token`
// (empty: none, sent as "-"), and waits at most timeout_ms for the reply.
// The token must be printable ASCII without spaces (kFdInvalidArgument
// otherwise, nothing is sent). Never blocks longer than about timeout_ms
// in total; the descriptor comes back close-on-exec.
FetchedFd FetchSharedFd(const std::string& socket_path, SharedFileKind kind,
                        const std::string& token, int timeout_ms = 5000);

// "arena" / "staging", as on the wire.
const char* SharedFileKindName(SharedFileKind kind);

// The canonical name of a gRPC status code number ("UNAUTHENTICATED"), or
// "CODE_<n>" for numbers outside 0..16.
std::string StatusCodeName(int code);

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_SHM_FD_FETCH_H_
