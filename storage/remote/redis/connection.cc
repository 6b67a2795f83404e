#include "storage/remote/redis/connection.h"

#include <hiredis/hiredis.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "absl/container/inlined_vector.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "storage/common/status_macros.h"
#include "storage/remote/redis/host_port.h"

namespace kvtier::remote {
namespace {

// What ReadValue receives at least per recv() (a reply line, small values,
// the start of the next pipelined reply); values are received whole.
constexpr size_t kReadChunk = size_t{64} << 10;
// A reply line longer than this is not RESP a GET is answered with.
constexpr size_t kMaxLineBytes = size_t{64} << 10;

timeval MsToTimeval(uint32_t ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  return tv;
}

}  // namespace

void ReplyDeleter::operator()(redisReply* reply) const { freeReplyObject(reply); }

absl::string_view ReplyText(const redisReply& reply) {
  switch (reply.type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR:
      return reply.str == nullptr ? absl::string_view() : absl::string_view(reply.str, reply.len);
    default:
      return absl::string_view();
  }
}

void AppendArrayHeader(size_t count, std::string* out) { absl::StrAppend(out, "*", count, "\r\n"); }

void AppendBulkHeader(size_t size, std::string* out) { absl::StrAppend(out, "$", size, "\r\n"); }

void AppendBulk(absl::string_view bytes, std::string* out) {
  AppendBulkHeader(bytes.size(), out);
  out->append(bytes.data(), bytes.size());
  out->append("\r\n");
}

std::string FormatCommand(std::initializer_list<absl::string_view> argv) {
  std::string out;
  AppendArrayHeader(argv.size(), &out);
  for (const absl::string_view arg : argv) AppendBulk(arg, &out);
  return out;
}

absl::StatusOr<std::unique_ptr<RedisConnection>> RedisConnection::Dial(const std::string& address,
                                                                       const DialOptions& options) {
  KVTIER_ASSIGN_OR_RETURN(const HostPort host_port, ParseHostPort(address));
  redisContext* context = redisConnectWithTimeout(host_port.host.c_str(), host_port.port,
                                                  MsToTimeval(options.connect_timeout_ms));
  if (context == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("redis ", address, ": cannot allocate a hiredis context"));
  }
  // Owns the context from here on, whatever happens below.
  std::unique_ptr<RedisConnection> connection(
      new RedisConnection(address, context, options.command_timeout_ms));
  if (context->err != 0) {
    return absl::UnavailableError(absl::StrCat("redis ", address, ": connect: ", context->errstr));
  }
  if (redisSetTimeout(context, MsToTimeval(options.command_timeout_ms)) != REDIS_OK) {
    return absl::UnavailableError(
        absl::StrCat("redis ", address, ": setting the command timeout: ", context->errstr));
  }
  if (!options.password.empty()) {
    absl::StatusOr<ReplyPtr> reply =
        options.username.empty()
            ? connection->Command({"AUTH", options.password})
            : connection->Command({"AUTH", options.username, options.password});
    if (!reply.ok()) return reply.status();
    // Never echo the password: only the node's answer goes into the error.
    if ((*reply)->type != REDIS_REPLY_STATUS || ReplyText(**reply) != "OK") {
      return absl::PermissionDeniedError(
          absl::StrCat("redis ", address, ": AUTH refused: ", ReplyText(**reply)));
    }
  }
  if (options.readonly) {
    absl::StatusOr<ReplyPtr> reply = connection->Command({"READONLY"});
    if (!reply.ok()) return reply.status();
    if ((*reply)->type != REDIS_REPLY_STATUS || ReplyText(**reply) != "OK") {
      return absl::UnavailableError(
          absl::StrCat("redis ", address, ": READONLY refused: ", ReplyText(**reply)));
    }
  }
  return connection;
}

RedisConnection::~RedisConnection() { redisFree(context_); }

absl::Status RedisConnection::Fail(TransportFailure kind, absl::string_view what,
                                   absl::string_view detail) {
  failure_ = kind;
  return absl::UnavailableError(absl::StrCat("redis ", address_, ": ", what, ": ", detail));
}

absl::Status RedisConnection::Send(absl::string_view bytes) {
  iovec part{const_cast<char*>(bytes.data()), bytes.size()};
  return Send(absl::MakeConstSpan(&part, 1));
}

absl::Status RedisConnection::Send(absl::Span<const iovec> parts) {
  if (broken()) return Fail(failure_, "send", "connection already broken");
  // Descriptors only (the bytes are not copied); advanced as sendmsg
  // consumes them.
  absl::InlinedVector<iovec, 8> iov(parts.begin(), parts.end());
  size_t first = 0;
  while (true) {
    while (first < iov.size() && iov[first].iov_len == 0) ++first;
    if (first == iov.size()) return absl::OkStatus();
    msghdr message{};
    message.msg_iov = iov.data() + first;
    message.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    const ssize_t sent = ::sendmsg(context_->fd, &message, MSG_NOSIGNAL);
    if (sent < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        return Fail(TransportFailure::kTimeout, "send",
                    absl::StrCat("timed out after ", command_timeout_ms_, " ms"));
      }
      const TransportFailure kind = (err == ECONNRESET || err == EPIPE) ? TransportFailure::kClosed
                                                                        : TransportFailure::kOther;
      return Fail(kind, "send", std::strerror(err));
    }
    size_t left = static_cast<size_t>(sent);
    while (left > 0) {
      iovec& part = iov[first];
      if (left >= part.iov_len) {
        left -= part.iov_len;
        part.iov_len = 0;
        ++first;
      } else {
        part.iov_base = static_cast<char*>(part.iov_base) + left;
        part.iov_len -= left;
        left = 0;
      }
    }
  }
}

absl::StatusOr<ReplyPtr> RedisConnection::Read() {
  if (broken()) return Fail(failure_, "receive", "connection already broken");
  if (in_pos_ != in_len_) {
    return Fail(TransportFailure::kOther, "receive",
                "bytes of a later reply were already read by ReadValue");
  }
  void* raw = nullptr;
  errno = 0;
  if (redisGetReply(context_, &raw) != REDIS_OK) {
    const int err = errno;  // hiredis leaves the read(2) errno in place
    if (context_->err == REDIS_ERR_EOF) {
      return Fail(TransportFailure::kClosed, "receive", "the node closed the connection");
    }
    if (context_->err == REDIS_ERR_IO && (err == EAGAIN || err == EWOULDBLOCK)) {
      return Fail(TransportFailure::kTimeout, "receive",
                  absl::StrCat("timed out after ", command_timeout_ms_, " ms"));
    }
    if (context_->err == REDIS_ERR_IO && (err == ECONNRESET || err == EPIPE)) {
      return Fail(TransportFailure::kClosed, "receive", context_->errstr);
    }
    return Fail(TransportFailure::kOther, "receive", context_->errstr);
  }
  if (raw == nullptr) return Fail(TransportFailure::kOther, "receive", "hiredis returned no reply");
  return ReplyPtr(static_cast<redisReply*>(raw));
}

absl::Status RedisConnection::Fill(size_t want) {
  if (in_pos_ == in_len_) in_pos_ = in_len_ = 0;
  const size_t have = in_len_ - in_pos_;
  const size_t room = std::max(want, have + kReadChunk);
  if (in_pos_ + room > in_cap_) {
    if (room > in_cap_) {
      auto grown = std::make_unique_for_overwrite<char[]>(room);
      if (have > 0) std::memcpy(grown.get(), in_.get() + in_pos_, have);
      in_ = std::move(grown);
      in_cap_ = room;
    } else if (have > 0) {
      std::memmove(in_.get(), in_.get() + in_pos_, have);
    }
    in_pos_ = 0;
    in_len_ = have;
  }
  while (true) {
    const ssize_t got = ::recv(context_->fd, in_.get() + in_len_, in_cap_ - in_len_, 0);
    if (got > 0) {
      in_len_ += static_cast<size_t>(got);
      return absl::OkStatus();
    }
    if (got == 0)
      return Fail(TransportFailure::kClosed, "receive", "the node closed the connection");
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      return Fail(TransportFailure::kTimeout, "receive",
                  absl::StrCat("timed out after ", command_timeout_ms_, " ms"));
    }
    const TransportFailure kind =
        (err == ECONNRESET || err == EPIPE) ? TransportFailure::kClosed : TransportFailure::kOther;
    return Fail(kind, "receive", std::strerror(err));
  }
}

absl::StatusOr<size_t> RedisConnection::LineEnd() {
  size_t scanned = 0;  // from in_pos_ (Fill may move the bytes)
  while (true) {
    const size_t have = in_len_ - in_pos_;
    if (have > scanned) {
      const char* from = in_.get() + in_pos_;
      const void* nl = std::memchr(from + scanned, '\n', have - scanned);
      if (nl != nullptr) {
        const size_t at = static_cast<size_t>(static_cast<const char*>(nl) - from);
        if (at == 0 || from[at - 1] != '\r') {
          return Fail(TransportFailure::kOther, "receive", "a reply line not ended by CRLF");
        }
        return at - 1;
      }
      scanned = have;
    }
    if (have > kMaxLineBytes) {
      return Fail(TransportFailure::kOther, "receive",
                  absl::StrCat("a reply line longer than ", kMaxLineBytes, " bytes"));
    }
    KVTIER_RETURN_IF_ERROR(Fill(have + 1));
  }
}

absl::StatusOr<RedisConnection::ValueReply> RedisConnection::ReadValue() {
  if (broken()) return Fail(failure_, "receive", "connection already broken");
  if (context_->reader != nullptr && context_->reader->pos != context_->reader->len) {
    return Fail(TransportFailure::kOther, "receive",
                "bytes of a later reply were already read by hiredis");
  }
  KVTIER_ASSIGN_OR_RETURN(const size_t end, LineEnd());
  const char* line = in_.get() + in_pos_;
  const size_t line_bytes = end + 2;
  if (end == 0) return Fail(TransportFailure::kOther, "receive", "an empty reply line");
  const absl::string_view text(line + 1, end - 1);
  if (line[0] == '-') {
    in_pos_ += line_bytes;  // the view stays valid: nothing moves before the next call
    return ValueReply{ValueReply::Kind::kError, text};
  }
  if (line[0] != '$') {
    return Fail(
        TransportFailure::kOther, "receive",
        absl::StrCat("expected a value, got the reply \"",
                     absl::CHexEscape(absl::string_view(line, std::min<size_t>(end, 64))), "\""));
  }
  int64_t size = 0;
  if (!absl::SimpleAtoi(text, &size) || size < -1 ||
      (size >= 0 && static_cast<uint64_t>(size) > kMaxValueBytes)) {
    return Fail(TransportFailure::kOther, "receive",
                absl::StrCat("bad value length \"", absl::CHexEscape(text.substr(0, 32)), "\""));
  }
  if (size == -1) {
    in_pos_ += line_bytes;
    return ValueReply{ValueReply::Kind::kNil, {}};
  }
  const size_t total = line_bytes + static_cast<size_t>(size) + 2;
  while (in_len_ - in_pos_ < total) KVTIER_RETURN_IF_ERROR(Fill(total));
  const char* base = in_.get() + in_pos_;
  if (base[total - 2] != '\r' || base[total - 1] != '\n') {
    return Fail(TransportFailure::kOther, "receive", "a value not followed by CRLF");
  }
  in_pos_ += total;
  return ValueReply{ValueReply::Kind::kValue,
                    absl::string_view(base + line_bytes, static_cast<size_t>(size))};
}

void RedisConnection::TrimBuffer(size_t keep) {
  if (in_cap_ <= keep || in_pos_ != in_len_) return;
  in_.reset();
  in_cap_ = in_pos_ = in_len_ = 0;
}

absl::StatusOr<ReplyPtr> RedisConnection::Command(std::initializer_list<absl::string_view> argv) {
  KVTIER_RETURN_IF_ERROR(Send(FormatCommand(argv)));
  return Read();
}

}  // namespace kvtier::remote
