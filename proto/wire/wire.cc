#include "proto/wire/wire.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvtier::wire {

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

void AppendKey(uint32_t field, WireType type, std::string* out) {
  AppendVarint((uint64_t{field} << 3) | type, out);
}

void AppendLengthKey(uint32_t field, uint64_t length, std::string* out) {
  AppendKey(field, kLengthDelimited, out);
  AppendVarint(length, out);
}

void AppendVarintField(uint32_t field, uint64_t value, std::string* out) {
  if (value == 0) return;
  AppendKey(field, kVarint, out);
  AppendVarint(value, out);
}

void AppendBytesField(uint32_t field, std::string_view bytes, std::string* out) {
  if (bytes.empty()) return;
  AppendLengthKey(field, bytes.size(), out);
  out->append(bytes);
}

int VarintSize(uint64_t value) {
  int n = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++n;
  }
  return n;
}

PieceReader::PieceReader(absl::Span<const Bytes> pieces) : pieces_(pieces) {
  for (const Bytes& p : pieces_) limit_ += p.size();
}

bool PieceReader::Fail(const std::string& message) {
  error_ = absl::InvalidArgumentError(absl::StrCat("at byte ", position_, ": ", message));
  return false;
}

bool PieceReader::ReadByte(uint8_t* b) {
  if (position_ >= limit_) return Fail("truncated");
  while (offset_ >= pieces_[piece_].size()) {
    ++piece_;
    offset_ = 0;
  }
  *b = pieces_[piece_][offset_++];
  ++position_;
  return true;
}

bool PieceReader::ReadVarint(uint64_t* value) {
  uint64_t v = 0;
  for (int i = 0; i < kMaxVarintBytes; ++i) {
    uint8_t b = 0;
    if (!ReadByte(&b)) return Fail("truncated varint");
    // The tenth byte may hold only the top bit of a uint64.
    if (i == kMaxVarintBytes - 1 && b > 1) return Fail("varint longer than 64 bits");
    v |= uint64_t{b & 0x7fu} << (7 * i);
    if ((b & 0x80) == 0) {
      *value = v;
      return true;
    }
  }
  return Fail("varint longer than 10 bytes");
}

bool PieceReader::ReadKey(uint32_t* field, WireType* type) {
  uint64_t key = 0;
  if (!ReadVarint(&key)) return false;
  const uint64_t number = key >> 3;
  const uint32_t t = static_cast<uint32_t>(key & 7);
  if (number == 0 || number > (uint64_t{1} << 29) - 1) {
    return Fail(absl::StrCat("field number ", number, " is not valid"));
  }
  if (t == kStartGroup || t == kEndGroup) return Fail("groups are not supported");
  if (t > kFixed32) return Fail(absl::StrCat("wire type ", t, " is not valid"));
  *field = static_cast<uint32_t>(number);
  *type = static_cast<WireType>(t);
  return true;
}

bool PieceReader::ReadLength(uint64_t* length) {
  if (!ReadVarint(length)) return false;
  if (*length > limit_ - position_) {
    return Fail(absl::StrCat("length ", *length, " runs past the end (", limit_ - position_,
                             " bytes left)"));
  }
  return true;
}

template <typename Fn>
bool PieceReader::Consume(uint64_t n, Fn take_range) {
  if (n > limit_ - position_) return Fail("truncated");
  while (n > 0) {
    const Bytes& p = pieces_[piece_];
    if (offset_ >= p.size()) {
      ++piece_;
      offset_ = 0;
      continue;
    }
    const size_t take = static_cast<size_t>(std::min<uint64_t>(n, p.size() - offset_));
    take_range(p.subspan(offset_, take));
    offset_ += take;
    position_ += take;
    n -= take;
  }
  return true;
}

bool PieceReader::ReadRanges(uint64_t n, std::vector<Bytes>* out) {
  return Consume(n, [out](Bytes range) { out->push_back(range); });
}

bool PieceReader::ReadString(uint64_t n, uint64_t max_copy, const char* what, std::string* out) {
  if (n > max_copy) return Fail(absl::StrCat(what, ": ", n, " bytes, at most ", max_copy));
  out->clear();
  if (n <= limit_ - position_) out->reserve(static_cast<size_t>(n));
  return Consume(n, [out](Bytes range) {
    out->append(reinterpret_cast<const char*>(range.data()), range.size());
  });
}

bool PieceReader::Skip(uint64_t n) {
  return Consume(n, [](Bytes) {});
}

bool PieceReader::SkipValue(WireType type) {
  uint64_t ignored = 0;
  switch (type) {
    case kVarint:
      return ReadVarint(&ignored);
    case kFixed64:
      return Skip(8);
    case kFixed32:
      return Skip(4);
    case kLengthDelimited:
      return ReadLength(&ignored) && Skip(ignored);
    default:
      return Fail("groups are not supported");
  }
}

uint64_t PieceReader::PushLimit(uint64_t n) {
  const uint64_t previous = limit_;
  limit_ = position_ + n;
  return previous;
}

}  // namespace kvtier::wire
