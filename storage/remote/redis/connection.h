// RedisConnection: one blocking TCP connection to one Redis node, on top of
// a hiredis 0.14 context; and the RESP helpers that format commands for it.
// This file is the one place where hiredis and socket errors become
// absl::Status.
//
// Writes bypass hiredis: Send() hands pre-formatted RESP to sendmsg() with
// MSG_NOSIGNAL (a peer that went away is an error, never SIGPIPE), straight
// from the caller's buffers, without copying them. Read() goes through
// hiredis's reply parser (redisGetReply only reads, since its own output
// buffer is always empty). ReadValue(), for the replies to GET, bypasses it
// too: the value is received into the connection's own buffer and lent in
// place, with no copy into a reply object. The two readers take turns only
// between replies: a Read() while ReadValue() holds bytes of a later reply
// (or the reverse) fails as a protocol error.
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
  std::string username;   // AUTH <username> <password> when both non-empty
  std::string password;   // AUTH <password> when non-empty
  bool readonly = false;  // READONLY after AUTH: a replica then serves reads
};

class RedisConnection {
 public:
  // Connects to `address` ("host:port"; hostnames are resolved here,
  // synchronously) within connect_timeout_ms, sets the command timeout and
  // TCP_NODELAY, and sends AUTH when options.password is non-empty, then
  // READONLY when options.readonly is set (UNAVAILABLE naming the node when
  // it is refused, e.g. by a node without cluster support).
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

  // The reply to a GET (pipelined GETs are answered in order), parsed in
  // the connection's own buffer: kValue lends the value, kNil is a missing
  // key, kError lends an error reply's text (a redirect, say; the
  // connection stays usable). The view is valid until the next call on
  // this connection. A reply of any other type, or a value over
  // kMaxValueBytes, is a protocol error: UNAVAILABLE, connection broken.
  struct ValueReply {
    enum class Kind { kValue, kNil, kError };
    Kind kind = Kind::kNil;
    absl::string_view bytes;
  };
  static constexpr uint64_t kMaxValueBytes = uint64_t{512} << 20;
  absl::StatusOr<ValueReply> ReadValue();
  // Gives back ReadValue's buffer when it grew beyond `keep` bytes.
  void TrimBuffer(size_t keep);

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

  // Reads at least one more byte into in_ (growing it to hold `want`
  // bytes from in_pos_); the error of a failed recv().
  absl::Status Fill(size_t want);
  // Where the next "\r\n" starts in in_, reading as needed.
  absl::StatusOr<size_t> LineEnd();

  const std::string address_;
  redisContext* const context_;
  const uint32_t command_timeout_ms_;
  TransportFailure failure_ = TransportFailure::kNone;
  // ReadValue's buffer: bytes [in_pos_, in_len_) are received, unparsed.
  std::unique_ptr<char[]> in_;
  size_t in_cap_ = 0;
  size_t in_pos_ = 0;
  size_t in_len_ = 0;
};

}  // namespace kvtier::remote

#endif  // KVTIER_STORAGE_REMOTE_REDIS_CONNECTION_H_
