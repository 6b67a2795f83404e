#include "bench/quality/json.h"

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"

namespace kvtier::quality {
namespace {

class Parser {
 public:
  explicit Parser(absl::string_view text) : text_(text) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    JsonValue v;
    if (absl::Status s = ParseValue(0, &v); !s.ok()) return s;
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected trailing characters");
    return v;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON header parse error at byte ", pos_, ": ", what));
  }

  void SkipSpace() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  bool Consume(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  absl::Status ParseValue(int depth, JsonValue* out) {
    if (depth > kMaxJsonDepth) {
      return Error(absl::StrCat("nesting deeper than ", kMaxJsonDepth));
    }
    SkipSpace();
    if (pos_ >= text_.size()) return Error("unexpected end of input");
    const char c = text_[pos_];
    if (c == '{') return ParseObject(depth, out);
    if (c == '[') return ParseArray(depth, out);
    if (c == '"') {
      out->type = JsonValue::Type::kString;
      return ParseString(&out->string);
    }
    if (c == '-' || (c >= '0' && c <= '9')) return ParseNumber(out);
    if (Consume("true")) {
      out->type = JsonValue::Type::kBool;
      out->boolean = true;
      return absl::OkStatus();
    }
    if (Consume("false")) {
      out->type = JsonValue::Type::kBool;
      out->boolean = false;
      return absl::OkStatus();
    }
    if (Consume("null")) {
      out->type = JsonValue::Type::kNull;
      return absl::OkStatus();
    }
    return Error(absl::StrCat("unexpected character '", text_.substr(pos_, 1), "'"));
  }

  absl::Status ParseObject(int depth, JsonValue* out) {
    out->type = JsonValue::Type::kObject;
    ++pos_;  // '{'
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      return absl::OkStatus();
    }
    std::set<std::string> keys;
    for (;;) {
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != '"') {
        return Error("expected a string key");
      }
      const size_t key_pos = pos_;
      std::string key;
      if (absl::Status s = ParseString(&key); !s.ok()) return s;
      if (!keys.insert(key).second) {
        pos_ = key_pos;
        return Error(absl::StrCat("duplicate key \"", key, "\""));
      }
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != ':') {
        return Error("expected ':' after a key");
      }
      ++pos_;
      JsonValue value;
      if (absl::Status s = ParseValue(depth + 1, &value); !s.ok()) return s;
      out->object.push_back({std::move(key), std::move(value)});
      SkipSpace();
      if (pos_ >= text_.size()) return Error("unterminated object");
      if (text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (text_[pos_] == '}') {
        ++pos_;
        return absl::OkStatus();
      }
      return Error("expected ',' or '}' in an object");
    }
  }

  absl::Status ParseArray(int depth, JsonValue* out) {
    out->type = JsonValue::Type::kArray;
    ++pos_;  // '['
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      return absl::OkStatus();
    }
    for (;;) {
      JsonValue value;
      if (absl::Status s = ParseValue(depth + 1, &value); !s.ok()) return s;
      out->array.push_back(std::move(value));
      SkipSpace();
      if (pos_ >= text_.size()) return Error("unterminated array");
      if (text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (text_[pos_] == ']') {
        ++pos_;
        return absl::OkStatus();
      }
      return Error("expected ',' or ']' in an array");
    }
  }

  absl::Status ParseHex4(uint32_t* out) {
    if (pos_ + 4 > text_.size()) return Error("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_ + i];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        return Error("bad hex digit in \\u escape");
      }
    }
    pos_ += 4;
    *out = v;
    return absl::OkStatus();
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  absl::Status ParseString(std::string* out) {
    ++pos_;  // '"'
    out->clear();
    while (pos_ < text_.size()) {
      const char c = text_[pos_++];
      if (c == '"') return absl::OkStatus();
      if (static_cast<unsigned char>(c) < 0x20) {
        --pos_;
        return Error("control character in a string");
      }
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= text_.size()) break;
      const char e = text_[pos_++];
      switch (e) {
        case '"':
          out->push_back('"');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '/':
          out->push_back('/');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t cp = 0;
          if (absl::Status s = ParseHex4(&cp); !s.ok()) return s;
          if (cp >= 0xD800 && cp < 0xDC00) {
            uint32_t lo = 0;
            if (!Consume("\\u")) return Error("unpaired high surrogate");
            if (absl::Status s = ParseHex4(&lo); !s.ok()) return s;
            if (lo < 0xDC00 || lo >= 0xE000) {
              return Error("bad low surrogate");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            return Error("unpaired low surrogate");
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          --pos_;
          return Error("unknown escape");
      }
    }
    return Error("unterminated string");
  }

  absl::Status ParseNumber(JsonValue* out) {
    const size_t start = pos_;
    bool integral = true;
    if (text_[pos_] == '-') ++pos_;
    auto digits = [this]() {
      const size_t p = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        ++pos_;
      }
      return pos_ - p;
    };
    const size_t int_start = pos_;
    if (digits() == 0) return Error("expected digits");
    if (pos_ - int_start > 1 && text_[int_start] == '0') {
      pos_ = int_start;
      return Error("leading zero in a number");
    }
    if (pos_ < text_.size() && text_[pos_] == '.') {
      integral = false;
      ++pos_;
      if (digits() == 0) return Error("expected digits after '.'");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      integral = false;
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) {
        ++pos_;
      }
      if (digits() == 0) return Error("expected digits in the exponent");
    }
    const std::string literal(text_.substr(start, pos_ - start));
    out->type = JsonValue::Type::kNumber;
    out->number = std::strtod(literal.c_str(), nullptr);
    if (integral) {
      errno = 0;
      const long long v = std::strtoll(literal.c_str(), nullptr, 10);
      if (errno == 0) {
        out->is_integer = true;
        out->integer = static_cast<int64_t>(v);
      }
    }
    return absl::OkStatus();
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

const JsonValue* JsonValue::Find(absl::string_view key) const {
  if (type != Type::kObject) return nullptr;
  for (const auto& [k, v] : object) {
    if (k == key) return &v;
  }
  return nullptr;
}

absl::StatusOr<JsonValue> ParseJson(absl::string_view text) { return Parser(text).ParseDocument(); }

}  // namespace kvtier::quality
