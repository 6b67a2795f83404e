#include "client/kvtierctl/format.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <cstdio>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"

namespace kvtier::ctl {
namespace {

// Block ids are bytes, which protobuf's JSON mapping writes as base64; the
// CLI shows them in hex everywhere (as its tables do).
bool IsIdField(const std::string& name) {
  return name == "block_id" || name == "block_ids" || name == "context_key" ||
         absl::EndsWith(name, "_block_ids");
}

void HexifyIds(google::protobuf::Value* value, bool is_id);

void HexifyStruct(google::protobuf::Struct* s) {
  for (auto& [name, value] : *s->mutable_fields()) HexifyIds(&value, IsIdField(name));
}

void HexifyIds(google::protobuf::Value* value, bool is_id) {
  switch (value->kind_case()) {
    case google::protobuf::Value::kStringValue:
      if (is_id) {
        std::string raw;
        if (absl::Base64Unescape(value->string_value(), &raw)) {
          value->set_string_value(absl::BytesToHexString(raw));
        }
      }
      break;
    case google::protobuf::Value::kListValue:
      for (auto& v : *value->mutable_list_value()->mutable_values()) HexifyIds(&v, is_id);
      break;
    case google::protobuf::Value::kStructValue:
      HexifyStruct(value->mutable_struct_value());
      break;
    default:
      break;
  }
}

}  // namespace

std::string HumanBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  char buf[32];
  if (unit == 0 || value == static_cast<double>(static_cast<uint64_t>(value))) {
    std::snprintf(buf, sizeof(buf), "%llu %s", static_cast<unsigned long long>(value),
                  kUnits[unit]);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f %s", value, kUnits[unit]);
  }
  return buf;
}

std::string HumanDuration(uint64_t seconds) {
  uint64_t d = seconds / 86400, h = seconds / 3600 % 24, m = seconds / 60 % 60, s = seconds % 60;
  std::string out;
  if (d) out += std::to_string(d) + "d";
  if (d || h) out += std::to_string(h) + "h";
  if (d || h || m) out += std::to_string(m) + "m";
  out += std::to_string(s) + "s";
  return out;
}

const char* TierLabel(v1::Tier tier) {
  switch (tier) {
    case v1::TIER_DEVICE:
      return "device";
    case v1::TIER_HOST:
      return "host";
    case v1::TIER_NVME:
      return "nvme";
    case v1::TIER_REMOTE:
      return "remote";
    default:
      return "?";
  }
}

namespace {

int PrintJsonWith(const google::protobuf::Message& message, bool pretty, std::ostream& out,
                  std::ostream& err) {
  std::string json;
  google::protobuf::util::JsonPrintOptions print;
  print.add_whitespace = pretty;
  print.always_print_primitive_fields = true;
  print.preserve_proto_field_names = true;
  auto st = google::protobuf::util::MessageToJsonString(message, &json, print);
  google::protobuf::Struct tree;
  if (st.ok()) st = google::protobuf::util::JsonStringToMessage(json, &tree);
  if (st.ok()) {
    HexifyStruct(&tree);
    json.clear();
    st = google::protobuf::util::MessageToJsonString(tree, &json, print);
  }
  if (!st.ok()) {
    err << "kvtierctl: cannot encode JSON: " << st.ToString() << "\n";
    return 1;
  }
  out << json;
  return 0;
}

}  // namespace

int PrintJson(const google::protobuf::Message& message, std::ostream& out, std::ostream& err) {
  return PrintJsonWith(message, /*pretty=*/true, out, err);
}

int PrintJsonCompact(const google::protobuf::Message& message, std::ostream& out,
                     std::ostream& err) {
  return PrintJsonWith(message, /*pretty=*/false, out, err);
}

}  // namespace kvtier::ctl
