// Protobuf wire format over a message held in pieces (gRPC slices), for the
// block RPCs whose payloads are sent and received without copying them into
// message objects (proto/wire/block_messages.h).
//
// Wire format (protobuf encoding): a message is a sequence of fields, each a
// key varint (field_number << 3 | wire_type) and a value: wire type 0 a
// varint, 1 eight bytes, 2 a length varint then that many bytes, 5 four
// bytes. Groups (3, 4) are not used by kvtier's messages and are refused.
//
// PieceReader reads such bytes where they lie: a field's value may start in
// one piece and end in another. Bytes fields come back either copied (small
// ones: ids, messages) or as the list of piece ranges that hold them (the
// payloads), which stay valid as long as the pieces do.
//
// Thread safety: a PieceReader is used by one thread; the pieces it reads
// must not change while it exists.
#ifndef KVTIER_PROTO_WIRE_WIRE_H_
#define KVTIER_PROTO_WIRE_WIRE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace kvtier::wire {

using Bytes = absl::Span<const uint8_t>;

enum WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

// Longest varint (a uint64 in 7-bit groups).
inline constexpr int kMaxVarintBytes = 10;

// Writing: appends to a string (message heads; payloads go in slices of
// their own).
void AppendVarint(uint64_t value, std::string* out);
void AppendKey(uint32_t field, WireType type, std::string* out);
void AppendLengthKey(uint32_t field, uint64_t length, std::string* out);
// A varint field; proto3 leaves a zero value out, and so does this.
void AppendVarintField(uint32_t field, uint64_t value, std::string* out);
// A length-delimited field with its bytes (a short one: ids).
void AppendBytesField(uint32_t field, std::string_view bytes, std::string* out);
// Bytes AppendVarint writes for `value`.
int VarintSize(uint64_t value);

class PieceReader {
 public:
  // Reads the concatenation of `pieces` (empty pieces are allowed); the
  // span and what it points to must outlive the reader.
  explicit PieceReader(absl::Span<const Bytes> pieces);

  // Offset from the start of the message.
  uint64_t position() const { return position_; }
  // True when the current limit (PushLimit) or the end is reached.
  bool AtLimit() const { return position_ >= limit_; }

  // Each returns false, and sets error(), at malformed or truncated input.
  // ReadKey also refuses field number 0 and group wire types.
  bool ReadKey(uint32_t* field, WireType* type);
  bool ReadVarint(uint64_t* value);
  // A length-delimited value's length, checked against what is left.
  bool ReadLength(uint64_t* length);
  // The next n bytes, copied (at most `max_copy` bytes; more is an error
  // naming `what`).
  bool ReadString(uint64_t n, uint64_t max_copy, const char* what, std::string* out);
  // The next n bytes as ranges of the pieces (appended to *out), no copy.
  bool ReadRanges(uint64_t n, std::vector<Bytes>* out);
  bool Skip(uint64_t n);
  // Skips the value of a field of wire type `type` (unknown fields).
  bool SkipValue(WireType type);

  // Confines reads to the next n bytes (a nested message); returns the
  // previous limit for PopLimit. n must not exceed what is left.
  uint64_t PushLimit(uint64_t n);
  void PopLimit(uint64_t previous) { limit_ = previous; }

  // Why the last read failed: "at byte N: ...". OK before any failure.
  const absl::Status& error() const { return error_; }
  // Sets error() (INVALID_ARGUMENT, prefixed by the position) and returns
  // false: for checks the caller makes on the values it read.
  bool Fail(const std::string& message);

 private:
  bool ReadByte(uint8_t* b);
  // Moves past the next n bytes, handing each piece's share to take_range;
  // false (error set, nothing consumed) when fewer than n are left.
  template <typename Fn>
  bool Consume(uint64_t n, Fn take_range);

  const absl::Span<const Bytes> pieces_;
  size_t piece_ = 0;   // current piece
  size_t offset_ = 0;  // within it
  uint64_t position_ = 0;
  uint64_t limit_ = 0;  // absolute; the total size at the outermost level
  absl::Status error_;
};

}  // namespace kvtier::wire

#endif  // KVTIER_PROTO_WIRE_WIRE_H_
