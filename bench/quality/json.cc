#include "bench/quality/json.h"

#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace kvtier::quality {
namespace {

// Keeps the file's member order.
using Json = nlohmann::ordered_json;

// What nlohmann's parser does not refuse by itself: nesting deeper than
// kMaxJsonDepth and a key repeated within one object. Thrown from the
// parser's callback, which stops the parse.
struct Refused {
  std::string what;
};

JsonValue Convert(const Json& j) {
  JsonValue v;
  switch (j.type()) {
    case Json::value_t::null:
    case Json::value_t::discarded:
    case Json::value_t::binary:
      break;
    case Json::value_t::boolean:
      v.type = JsonValue::Type::kBool;
      v.boolean = j.get<bool>();
      break;
    case Json::value_t::number_integer:
      v.type = JsonValue::Type::kNumber;
      v.is_integer = true;
      v.integer = j.get<int64_t>();
      v.number = static_cast<double>(v.integer);
      break;
    case Json::value_t::number_unsigned: {
      v.type = JsonValue::Type::kNumber;
      const uint64_t u = j.get<uint64_t>();
      v.number = static_cast<double>(u);
      if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        v.is_integer = true;
        v.integer = static_cast<int64_t>(u);
      }
      break;
    }
    case Json::value_t::number_float:
      v.type = JsonValue::Type::kNumber;
      v.number = j.get<double>();
      break;
    case Json::value_t::string:
      v.type = JsonValue::Type::kString;
      v.string = j.get<std::string>();
      break;
    case Json::value_t::array:
      v.type = JsonValue::Type::kArray;
      v.array.reserve(j.size());
      for (const Json& e : j) v.array.push_back(Convert(e));
      break;
    case Json::value_t::object:
      v.type = JsonValue::Type::kObject;
      v.object.reserve(j.size());
      for (const auto& [key, value] : j.items()) v.object.push_back({key, Convert(value)});
      break;
  }
  return v;
}

}  // namespace

const JsonValue* JsonValue::Find(absl::string_view key) const {
  if (type != Type::kObject) return nullptr;
  for (const JsonMember& m : object) {
    if (m.key == key) return &m.value;
  }
  return nullptr;
}

absl::StatusOr<JsonValue> ParseJson(absl::string_view text) {
  // The keys seen so far in each object being parsed, innermost last.
  std::vector<std::set<std::string>> keys;
  const Json::parser_callback_t guard = [&keys](int depth, Json::parse_event_t event,
                                                Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth) {
          throw Refused{absl::StrCat("nesting deeper than ", kMaxJsonDepth)};
        }
        if (event == Json::parse_event_t::object_start) keys.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        keys.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!keys.back().insert(parsed.get<std::string>()).second) {
          throw Refused{absl::StrCat("duplicate key \"", parsed.get<std::string>(), "\"")};
        }
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return Convert(Json::parse(text.begin(), text.end(), guard));
  } catch (const Json::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON header parse error at byte ", e.byte, ": ", e.what()));
  } catch (const Refused& r) {
    return absl::InvalidArgumentError(absl::StrCat("JSON header parse error: ", r.what));
  }
}

}  // namespace kvtier::quality
