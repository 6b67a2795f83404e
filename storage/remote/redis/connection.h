// RedisConnection: one blocking TCP connection to one Redis node, on top of
// a hiredis 0.14 context; and the RESP helpers that format commands for it.
// This file is the one place where hiredis and socket errors become
// absl::Status.
//
// Writes bypass hiredis: Send() hands pre-formatted RESP to sendmsg() with
// MSG_NOSIGNAL (a peer that went away is an error, never SIGPIPE), straight
// from the caller's buffers, without copying them. Reads go through
// hiredis's reply parser (redisGetReply only reads, since its own output
// buffer is always empty).
//
// Timeouts: the command timeout is the socket's SO_SNDTIMEO and SO_RCVTIMEO:
// it bounds every wait for the socket to make progress, so a node that stops
// answering fails a command within about one command timeout; a node that
// keeps trickling bytes does not (a 512 MiB value legitimately takes
// longer than one timeout to send).
//
// Failure: after any transport error (Send or Read failing) the connection
// is broken(): where the byte stream stands is unknown, so the owner must
// discard it, never reuse it. Error replies (-ERR, -MOVED ...) are replies,
// not transport errors: the connection stays usable.
//
// Thread safety: none. One thread uses a connection at a time (the
// RedisCluster pool hands connections over under its mutex).
#ifndef KVTIER_STORAGE_REMOTE_REDIS_CONNECTION_H_
#define KVTIER_STORAGE_REMOTE_REDIS_CONNECTION_H_

#include <sys/uio.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

struct redisContext;
struct redisReply;

namespace kvtier::remote {

struct ReplyDeleter {
  void operator()(redisReply* reply) const;
};
// A parsed reply; owns every nested element.
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

// The text of a status, error or string reply; empty for other types.
absl::string_view ReplyText(const redisReply& reply);

// ---- RESP formatting ----------------------------------------------------
// "*<count>\r\n"
void AppendArrayHeader(size_t count, std::string* out);
// "$<size>\r\n": the caller sends the bytes and "\r\n" after it.
void AppendBulkHeader(size_t size, std::string* out);
// "$<size>\r\n<bytes>\r\n"
void AppendBulk(absl::string_view bytes, std::string* out);
// A whole command: the array header and one bulk string per argument.
std::string FormatCommand(std::initializer_list<absl::string_view> argv);

// What the last transport error was; kNone while the connection is usable.
enum class TransportFailure {
  kNone,
  kTimeout,  // no progress within the command timeout
  kClosed,   // EOF, ECONNRESET or EPIPE: the node closed or lost the socket
  kOther,    // any other socket or protocol error
};

struct DialOptions {
  uint32_t connect_timeout_ms = 100;
  uint32_t command_timeout_ms = 250;
  std::string username;  // AUTH <username> <password> when both non-empty
  std::string password;  // AUTH <password> when non-empty
};

class RedisConnection {
 public:
  // Connects to `address` ("host:port"; hostnames are resolved here,
  // synchronously) within connect_timeout_ms, sets the command timeout and
  // TCP_NODELAY, and sends AUTH when options.password is non-empty.
  // Errors: INVALID_ARGUMENT for a malformed address; UNAVAILABLE
  // "redis <address>: connect: <reason>" when the node cannot be reached or
  // the AUTH exchange fails at transport level; PERMISSION_DENIED naming
  // the node when AUTH is answered with an error.
  static absl::StatusOr<std::unique_ptr<RedisConnection>> Dial(const std::string& address,
                                                               const DialOptions& options);

  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;
  ~RedisConnection();

  // Sends the concatenation of `parts` (pre-formatted RESP). Any number of
  // parts (batches of IOV_MAX per system call). UNAVAILABLE naming the node
  // on failure, which leaves the connection broken().
  absl::Status Send(absl::Span<const iovec> parts);
  absl::Status Send(absl::string_view bytes);

  // Reads the next reply. Error replies are returned as replies
  // (REDIS_REPLY_ERROR). UNAVAILABLE naming the node on a transport error,
  // which leaves the connection broken().
  absl::StatusOr<ReplyPtr> Read();

  // Send(FormatCommand(argv)) then Read().
  absl::StatusOr<ReplyPtr> Command(std::initializer_list<absl::string_view> argv);

  const std::string& address() const { return address_; }
  TransportFailure failure() const { return failure_; }
  bool broken() const { return failure_ != TransportFailure::kNone; }

 private:
  RedisConnection(std::string address, redisContext* context, uint32_t command_timeout_ms)
      : address_(std::move(address)), context_(context), command_timeout_ms_(command_timeout_ms) {}

  // Records the failure and returns UNAVAILABLE "redis <address>: <what>: ...".
  absl::Status Fail(TransportFailure kind, absl::string_view what, absl::string_view detail);

  const std::string address_;
  redisContext* const context_;
  const uint32_t command_timeout_ms_;
  TransportFailure failure_ = TransportFailure::kNone;
};

}  // namespace kvtier::remote

#endif  // KVTIER_STORAGE_REMOTE_REDIS_CONNECTION_H_
