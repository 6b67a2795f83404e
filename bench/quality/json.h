// JSON values for the safetensors header and the calibration files, read
// with nlohmann-json (Debian's nlohmann-json3-dev) into a plain value the
// rest of the harness walks: objects (members in file order), arrays,
// strings (every escape; \uXXXX surrogate pairs become UTF-8), numbers,
// true, false, null.
//
// Limits nlohmann-json does not set by itself: nesting depth <=
// kMaxJsonDepth, and duplicate object keys are an error (the safetensors
// header maps each tensor name once). Numbers without fraction or exponent
// that fit int64 are kept exactly in `integer`.
//
// Thread safety: ParseJson is pure; a JsonValue is a plain value.
#ifndef KVTIER_BENCH_QUALITY_JSON_H_
#define KVTIER_BENCH_QUALITY_JSON_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvtier::quality {

inline constexpr int kMaxJsonDepth = 64;

struct JsonMember;

struct JsonValue {
  enum class Type : uint8_t { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  double number = 0;
  bool is_integer = false;  // the literal was an integer that fits int64
  int64_t integer = 0;
  std::string string;
  std::vector<JsonValue> array;
  std::vector<JsonMember> object;  // file order

  // The member named `key` of an object, or null (also for non-objects).
  const JsonValue* Find(absl::string_view key) const;
};

// One member of an object (a struct, not a std::pair: a pair of the
// still-incomplete JsonValue cannot be a vector's element in its own type).
struct JsonMember {
  std::string key;
  JsonValue value;
};

// Parses one JSON value that spans all of `text` (surrounding whitespace
// allowed). InvalidArgument "JSON header parse error at byte N: <what>" on
// malformed input or trailing bytes, and "JSON header parse error: <what>"
// on too deep nesting or a duplicate key.
absl::StatusOr<JsonValue> ParseJson(absl::string_view text);

}  // namespace kvtier::quality

#endif  // KVTIER_BENCH_QUALITY_JSON_H_
