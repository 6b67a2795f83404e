#include "daemon/config.h"

#include <cctype>
#include <cmath>
#include <filesystem>
#include <functional>
#include <sstream>

#include <toml++/toml.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "index/select/scorer.h"
#include "proto/auth/tenants_file.h"
#include "storage/common/status_macros.h"

namespace kvtier::daemon {
namespace {

// Embedded by CMake from deploy/kvtierd.toml.
#include "kvtierd_default_toml.inc"

enum class Kind { kString, kSize, kUint, kBool, kMode, kEnum, kFloat };

// A parsed scalar; only the member matching the field's kind is set.
struct Value {
  std::string text;
  uint64_t number = 0;
  double real = 0;
  bool flag = false;
};

Value TextValue(std::string text) {
  Value v;
  v.text = std::move(text);
  return v;
}
Value NumberValue(uint64_t number) {
  Value v;
  v.number = number;
  return v;
}
Value RealValue(double real) {
  Value v;
  v.real = real;
  return v;
}
Value FlagValue(bool flag) {
  Value v;
  v.flag = flag;
  return v;
}

template <typename E, size_t N>
std::vector<std::string> ChoicesOf(const EnumName<E> (&names)[N]) {
  std::vector<std::string> out;
  out.reserve(N);
  for (const EnumName<E>& n : names) out.emplace_back(n.name.data(), n.name.size());
  return out;
}

// One configuration key: its TOML path, its type and where it lands.
struct Field {
  const char* key;
  Kind kind;
  std::function<void(Config&, const Value&)> set;
  std::function<std::string(const Config&)> get;
  std::vector<std::string> choices = {};  // kEnum only
};

#define KV_STR(path, member)                                                   \
  Field {                                                                      \
    path, Kind::kString, [](Config& c, const Value& v) { c.member = v.text; }, \
        [](const Config& c) { return c.member; }                               \
  }
#define KV_ENUM(path, member, ...)                                           \
  Field {                                                                    \
    path, Kind::kEnum, [](Config& c, const Value& v) { c.member = v.text; }, \
        [](const Config& c) { return c.member; }, {                          \
      __VA_ARGS__                                                            \
    }                                                                        \
  }
// An enum-typed key: the text (checked against the table's names first)
// becomes its enum value once, here.
#define KV_TYPED_ENUM(path, member, names)                                                     \
  Field {                                                                                      \
    path, Kind::kEnum,                                                                         \
        [](Config& c, const Value& v) {                                                        \
          for (const auto& n : (names)) {                                                      \
            if (n.name == v.text) c.member = n.value;                                          \
          }                                                                                    \
        },                                                                                     \
        [](const Config& c) { return std::string(NameOf(names, c.member)); }, ChoicesOf(names) \
  }
#define KV_NUM(path, kind, member)                                                               \
  Field {                                                                                        \
    path, kind,                                                                                  \
        [](Config& c, const Value& v) { c.member = static_cast<decltype(c.member)>(v.number); }, \
        [](const Config& c) { return std::to_string(c.member); }                                 \
  }
#define KV_FLOAT(path, member)                                                \
  Field {                                                                     \
    path, Kind::kFloat, [](Config& c, const Value& v) { c.member = v.real; }, \
        [](const Config& c) { return absl::StrCat(c.member); }                \
  }
#define KV_BOOL(path, member)                                                    \
  Field {                                                                        \
    path, Kind::kBool, [](Config& c, const Value& v) { c.member = v.flag; },     \
        [](const Config& c) { return std::string(c.member ? "true" : "false"); } \
  }

// server.*: the socket, TLS, messages, streams, connections and threads.
std::vector<Field> ServerFields() {
  return {
      KV_STR("server.data_dir", server.data_dir),
      KV_STR("server.socket_path", server.socket_path),
      Field{
          "server.socket_mode", Kind::kMode,
          [](Config& c, const Value& v) { c.server.socket_mode = static_cast<uint32_t>(v.number); },
          [](const Config& c) {
            std::ostringstream os;
            os << "0" << std::oct << c.server.socket_mode;
            return os.str();
          }},
      KV_STR("server.tcp_address", server.tcp_address),
      KV_STR("server.tls_cert_file", server.tls_cert_file),
      KV_STR("server.tls_key_file", server.tls_key_file),
      KV_STR("server.tls_client_ca_file", server.tls_client_ca_file),
      KV_NUM("server.max_message_bytes", Kind::kSize, server.max_message_bytes),
      KV_NUM("server.shutdown_grace_ms", Kind::kUint, server.shutdown_grace_ms),
      KV_NUM("server.max_concurrent_streams", Kind::kUint, server.max_concurrent_streams),
      KV_NUM("server.max_connections", Kind::kUint, server.max_connections),
      KV_NUM("server.max_connections_per_uid", Kind::kUint, server.max_connections_per_uid),
      KV_NUM("server.max_pending_connections", Kind::kUint, server.max_pending_connections),
      KV_NUM("server.max_tcp_connections", Kind::kUint, server.max_tcp_connections),
      KV_NUM("server.max_tcp_connections_per_address", Kind::kUint,
             server.max_tcp_connections_per_address),
      KV_NUM("server.connection_setup_ms", Kind::kUint, server.connection_setup_ms),
      KV_NUM("server.connection_idle_ms", Kind::kUint, server.connection_idle_ms),
      KV_BOOL("server.reflection", server.reflection),
      KV_NUM("server.max_streams_per_tenant", Kind::kUint, server.max_streams_per_tenant),
      KV_NUM("server.max_streams", Kind::kUint, server.max_streams),
      KV_NUM("server.stream_write_timeout_ms", Kind::kUint, server.stream_write_timeout_ms),
      KV_NUM("server.max_queued_bytes_per_tenant", Kind::kSize, server.max_queued_bytes_per_tenant),
      KV_NUM("server.max_queued_bytes", Kind::kSize, server.max_queued_bytes),
      KV_NUM("server.io_threads", Kind::kUint, server.io_threads),
      KV_NUM("server.io_queue_limit", Kind::kUint, server.io_queue_limit),
      KV_NUM("server.io_queue_limit_per_tenant", Kind::kUint, server.io_queue_limit_per_tenant),
      KV_NUM("server.io_threads_per_tenant", Kind::kUint, server.io_threads_per_tenant),
      KV_NUM("server.put_parallelism", Kind::kUint, server.put_parallelism),
      KV_BOOL("server.defer_summaries", server.defer_summaries),
  };
}

const std::vector<Field>& Fields() {
  static const auto* fields = [] {
    auto* all = new std::vector<Field>(ServerFields());
    std::vector<Field> rest = {
        KV_STR("metrics.listen_address", metrics.listen_address),
        KV_STR("auth.tenants_file", auth.tenants_file),
        KV_STR("auth.shm_dir", auth.shm_dir),
        KV_STR("auth.fd_socket_path", auth.fd_socket_path),
        KV_STR("auth.peer_socket_path", auth.peer_socket_path),
        KV_NUM("auth.tenant_arena_bytes", Kind::kSize, auth.tenant_arena_bytes),
        KV_NUM("auth.tenant_staging_bytes", Kind::kSize, auth.tenant_staging_bytes),
        KV_NUM("auth.tenant_max_leases", Kind::kUint, auth.tenant_max_leases),
        KV_ENUM("log.level", log.level, "trace", "debug", "info", "warn", "error", "critical",
                "off"),
        KV_TYPED_ENUM("log.format", log.format, kLogFormatNames),
        KV_TYPED_ENUM("tiers.placement", placement.policy, kPlacementNames),
        KV_FLOAT("tiers.keydiff.redundancy_weight", placement.redundancy_weight),
        KV_FLOAT("tiers.keydiff.age_weight", placement.age_weight),
        KV_NUM("tiers.keydiff.sample_blocks", Kind::kUint, placement.sample_blocks),
        KV_FLOAT("tiers.keydiff.newest_protected", placement.newest_protected),
        KV_BOOL("tiers.stability.unwanted_first", placement.unwanted_first),
        KV_TYPED_ENUM("tiers.device.backend", device.backend, kDeviceBackendNames),
        KV_NUM("tiers.device.capacity_bytes", Kind::kSize, device.capacity_bytes),
        KV_STR("tiers.device.shm_dir", device.shm_dir),
        KV_NUM("tiers.host.capacity_bytes", Kind::kSize, host.capacity_bytes),
        KV_STR("tiers.host.shm_dir", host.shm_dir),
        KV_NUM("tiers.host.staging_bytes", Kind::kSize, host.staging_bytes),
        KV_NUM("tiers.host.max_in_flight_get_bytes", Kind::kSize, host.max_in_flight_get_bytes),
        KV_BOOL("tiers.host.prefault", host.prefault),
        KV_STR("tiers.nvme.dir", nvme.dir),
        KV_NUM("tiers.nvme.file_count", Kind::kUint, nvme.file_count),
        KV_NUM("tiers.nvme.file_size_bytes", Kind::kSize, nvme.file_size_bytes),
        KV_BOOL("tiers.nvme.direct_io", nvme.direct_io),
        KV_NUM("tiers.nvme.io_threads", Kind::kUint, nvme.io_threads),
        KV_NUM("tiers.nvme.queue_depth", Kind::kUint, nvme.queue_depth),
        KV_BOOL("tiers.nvme.write_through", nvme.write_through),
        KV_STR("tiers.remote.redis_cluster", remote.redis_cluster),
        KV_STR("tiers.remote.password_file", remote.password_file),
        KV_NUM("tiers.remote.connect_timeout_ms", Kind::kUint, remote.connect_timeout_ms),
        KV_NUM("tiers.remote.command_timeout_ms", Kind::kUint, remote.command_timeout_ms),
        KV_NUM("tiers.remote.down_backoff_ms", Kind::kUint, remote.down_backoff_ms),
        KV_BOOL("tiers.remote.read_from_replicas", remote.read_from_replicas),
        KV_BOOL("tiers.remote.publish", remote.publish),
        KV_TYPED_ENUM("tiers.remote.publish_policy", remote.publish_policy, kPublishPolicyNames),
        KV_NUM("tiers.remote.writeback_buffer_bytes", Kind::kSize, remote.writeback_buffer_bytes),
        KV_NUM("tiers.remote.publish_threads", Kind::kUint, remote.publish_threads),
        KV_NUM("tiers.remote.publish_queue_blocks", Kind::kUint, remote.publish_queue_blocks),
        KV_NUM("tiers.remote.ttl_ms", Kind::kUint, remote.ttl_ms),
        KV_NUM("tiers.remote.miss_cache_ms", Kind::kUint, remote.miss_cache_ms),
        KV_NUM("leases.default_ttl_ms", Kind::kUint, leases.default_ttl_ms),
        KV_NUM("leases.max_ttl_ms", Kind::kUint, leases.max_ttl_ms),
        KV_NUM("limits.max_batch_blocks", Kind::kUint, limits.max_batch_blocks),
        KV_NUM("limits.max_contexts", Kind::kUint, limits.max_contexts),
        KV_NUM("limits.max_admin_operations", Kind::kUint, limits.max_admin_operations),
        KV_NUM("compaction.max_context_bytes", Kind::kSize, compaction.max_context_bytes),
        KV_NUM("compaction.max_observation_rows", Kind::kUint, compaction.max_observation_rows),
        KV_TYPED_ENUM("index.summary_encoding", index.summary_encoding, kSummaryEncodingNames),
        KV_BOOL("index.summary_bounds", index.summary_bounds),
        KV_BOOL("index.summary_weighted", index.summary_weighted),
        KV_BOOL("index.summary_per_layer", index.summary_per_layer),
        KV_TYPED_ENUM("index.summary_layer_encoding", index.summary_layer_encoding,
                      kLayerEncodingNames),
        KV_BOOL("index.summary_per_layer_bounds", index.summary_per_layer_bounds),
        KV_NUM("index.head_weights_min_blocks", Kind::kUint, index.head_weights_min_blocks),
        KV_NUM("index.pages_per_chunk", Kind::kUint, index.pages_per_chunk),
        KV_NUM("index.chunks_per_grid", Kind::kUint, index.chunks_per_grid),
        KV_BOOL("index.keep_summaries", index.keep_summaries),
        KV_BOOL("index.q8_page_rows", index.q8_page_rows),
        Field{
            "select.default_scorer",
            Kind::kEnum,
            [](Config& c, const Value& v) {
              c.select.default_scorer = *index::ParseScorerKind(v.text);  // one of the choices
            },
            [](const Config& c) { return std::string(index::ScorerName(c.select.default_scorer)); },
            {"keykey", "keykey_weighted", "quest", "arkvale", "keydiff", "recency", "random",
             "mass"}},
        KV_TYPED_ENUM("select.algorithm", select.algorithm, kSelectAlgorithmNames),
        KV_FLOAT("select.grid_keep_fraction", select.grid_keep_fraction),
        KV_FLOAT("select.chunk_keep_fraction", select.chunk_keep_fraction),
        KV_FLOAT("select.page_keep_fraction", select.page_keep_fraction),
        KV_NUM("select.sink_blocks", Kind::kUint, select.sink_blocks),
        KV_NUM("select.local_blocks", Kind::kUint, select.local_blocks),
        KV_NUM("select.window_steps", Kind::kUint, select.window_steps),
        KV_FLOAT("select.theta", select.theta),
        KV_FLOAT("select.stability_weight", select.stability_weight),
        KV_FLOAT("select.hold_threshold", select.hold_threshold),
        KV_STR("select.stability_scorers", select.stability_scorers),
        KV_BOOL("select.keykey_centered", select.keykey_centered),
        KV_FLOAT("select.keykey_recency_weight", select.keykey_recency_weight),
        KV_NUM("select.max_prefetch_blocks", Kind::kUint, select.max_prefetch_blocks),
        KV_NUM("select.inline_promotion_bytes", Kind::kSize, select.inline_promotion_bytes),
        KV_NUM("select.max_contexts_per_request", Kind::kUint, select.max_contexts_per_request),
        KV_NUM("select.batch_threads", Kind::kUint, select.batch_threads),
        KV_NUM("select.threads", Kind::kUint, select.threads),
        KV_NUM("select.queue_limit", Kind::kUint, select.queue_limit),
        KV_NUM("select.queue_limit_per_tenant", Kind::kUint, select.queue_limit_per_tenant),
        KV_NUM("select.threads_per_tenant", Kind::kUint, select.threads_per_tenant),
        KV_NUM("select.max_queued_responses", Kind::kUint, select.max_queued_responses),
        KV_NUM("select.mass_tree_min_blocks", Kind::kUint, select.mass_tree_min_blocks),
        KV_FLOAT("select.mass_tree_max_read_fraction", select.mass_tree_max_read_fraction),
        KV_NUM("select.mass_tree_recent_blocks", Kind::kUint, select.mass_tree_recent_blocks),
        KV_NUM("select.mass_tree_reuse_steps", Kind::kUint, select.mass_tree_reuse_steps),
        KV_FLOAT("select.mass_tree_reuse_min_cosine", select.mass_tree_reuse_min_cosine),
    };
    all->insert(all->end(), std::make_move_iterator(rest.begin()),
                std::make_move_iterator(rest.end()));
    return all;
  }();
  return *fields;
}

const Field* FindField(const std::string& key) {
  for (const Field& f : Fields()) {
    if (key == f.key) return &f;
  }
  return nullptr;
}

absl::Status BadValue(const std::string& where, const std::string& key, const std::string& want) {
  return absl::InvalidArgumentError(absl::StrCat(where, "key '", key, "': expected ", want));
}

// Applies one scalar value (from TOML or from a --set override) to a field.
// `text` is the raw string form, `node` the TOML node when there is one.
absl::Status ApplyValue(Config& config, const Field& field, const std::string& where,
                        const toml::node& node) {
  const std::string key = field.key;
  switch (field.kind) {
    case Kind::kString:
    case Kind::kEnum: {
      auto s = node.value<std::string>();
      if (!s) return BadValue(where, key, "a string");
      if (field.kind == Kind::kEnum) {
        bool ok = false;
        for (const auto& c : field.choices) ok = ok || c == *s;
        if (!ok) {
          std::string list;
          for (const auto& c : field.choices) absl::StrAppend(&list, list.empty() ? "" : ", ", c);
          return BadValue(where, key, absl::StrCat("one of ", list, ", got \"", *s, "\""));
        }
      }
      field.set(config, TextValue(*s));
      return absl::OkStatus();
    }
    case Kind::kSize:
    case Kind::kUint: {
      uint64_t n = 0;
      if (auto i = node.value<int64_t>(); i && node.is_integer()) {
        if (*i < 0) return BadValue(where, key, "a non-negative integer");
        n = static_cast<uint64_t>(*i);
      } else if (auto s = node.value<std::string>(); s && field.kind == Kind::kSize) {
        auto parsed = ParseSize(*s);
        if (!parsed.ok()) {
          return BadValue(where, key,
                          absl::StrCat("a size like 4096 or \"64MiB\", got \"", *s, "\""));
        }
        n = *parsed;
      } else {
        return BadValue(where, key,
                        field.kind == Kind::kSize ? "a size (integer bytes or \"64MiB\")"
                                                  : "a non-negative integer");
      }
      field.set(config, NumberValue(n));
      return absl::OkStatus();
    }
    case Kind::kFloat: {
      auto d = node.value<double>();
      if (!d || !(node.is_floating_point() || node.is_integer()) || !std::isfinite(*d)) {
        return BadValue(where, key, "a finite number");
      }
      field.set(config, RealValue(*d));
      return absl::OkStatus();
    }
    case Kind::kBool: {
      auto b = node.value<bool>();
      if (!b || !node.is_boolean()) return BadValue(where, key, "true or false");
      field.set(config, FlagValue(*b));
      return absl::OkStatus();
    }
    case Kind::kMode: {
      auto s = node.value<std::string>();
      if (!s || s->empty() || s->size() > 4) {
        return BadValue(where, key, "an octal mode string like \"0660\"");
      }
      uint64_t mode = 0;
      for (char ch : *s) {
        if (ch < '0' || ch > '7') return BadValue(where, key, "an octal mode string like \"0660\"");
        mode = mode * 8 + static_cast<uint64_t>(ch - '0');
      }
      field.set(config, NumberValue(mode));
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unreachable");
}

// Walks a parsed TOML table, applying every leaf; unknown keys are errors.
absl::Status ApplyTable(Config& config, const toml::table& table, const std::string& prefix,
                        const std::string& where) {
  for (const auto& [k, node] : table) {
    std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const toml::table* sub = node.as_table()) {
      KVTIER_RETURN_IF_ERROR(ApplyTable(config, *sub, key, where));
      continue;
    }
    const Field* field = FindField(key);
    if (field == nullptr) {
      std::string line;
      if (node.source().begin) line = absl::StrCat(" (line ", node.source().begin.line, ")");
      return absl::InvalidArgumentError(absl::StrCat(where, "unknown key '", key, "'", line));
    }
    KVTIER_RETURN_IF_ERROR(ApplyValue(config, *field, where, node));
  }
  return absl::OkStatus();
}

absl::Status ParseError(const std::string& source, const toml::parse_error& err) {
  return absl::InvalidArgumentError(absl::StrCat(source, ":", err.source().begin.line, ":",
                                                 err.source().begin.column, ": ",
                                                 std::string(err.description())));
}

// tomlplusplus reports syntax errors by exception; they stop here.
absl::Status ParseInto(Config& config, const std::string& text, const std::string& source) {
  toml::table table;
  try {
    table = toml::parse(text, source);
  } catch (const toml::parse_error& err) {
    return ParseError(source, err);
  }
  return ApplyTable(config, table, "", source + ": ");
}

// "a.b.c=value": value is parsed as a TOML value when possible (numbers,
// booleans, quoted strings), otherwise taken as a bare string.
absl::Status ApplyOverride(Config& config, const std::string& item) {
  size_t eq = item.find('=');
  if (eq == std::string::npos || eq == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--set '", item, "': expected section.key=value"));
  }
  std::string key = item.substr(0, eq);
  std::string value = item.substr(eq + 1);
  const Field* field = FindField(key);
  if (field == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--set: unknown key '", key, "'"));
  }
  // The value is TOML when it parses as one (42, true, "text"); otherwise it
  // is taken as a bare string (64MiB, /srv/kvtier).
  toml::table parsed;
  bool is_toml = true;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    is_toml = false;
  }
  if (!is_toml) {
    parsed = toml::table();
    parsed.insert("v", value);
  }
  return ApplyValue(config, *field, "--set: ", *parsed.get("v"));
}

absl::Status Invalid(const std::string& key, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("key '", key, "': ", why));
}

absl::Status InRange(const std::string& key, double v, double lo, double hi, bool lo_open) {
  if ((lo_open ? v > lo : v >= lo) && v <= hi) return absl::OkStatus();
  return Invalid(key,
                 absl::StrCat("is ", v, "; must be in ", lo_open ? "(" : "[", lo, ", ", hi, "]"));
}

absl::Status ValidatePlacement(const Config& c) {
  KVTIER_RETURN_IF_ERROR(
      InRange("tiers.keydiff.redundancy_weight", c.placement.redundancy_weight, 0, 1000, false));
  KVTIER_RETURN_IF_ERROR(
      InRange("tiers.keydiff.age_weight", c.placement.age_weight, 0, 1000, false));
  KVTIER_RETURN_IF_ERROR(
      InRange("tiers.keydiff.newest_protected", c.placement.newest_protected, 0, 0.9, false));
  if (c.placement.sample_blocks == 0 || c.placement.sample_blocks > 1024) {
    return Invalid("tiers.keydiff.sample_blocks", "must be between 1 and 1024");
  }
  return absl::OkStatus();
}

absl::Status ValidateIndex(const Config& c) {
  if (c.index.summary_per_layer_bounds && !c.index.summary_per_layer) {
    return Invalid("index.summary_per_layer_bounds", "needs index.summary_per_layer = true");
  }
  if (c.index.head_weights_min_blocks == 0 || c.index.head_weights_min_blocks > (1u << 30)) {
    return Invalid("index.head_weights_min_blocks", "must be between 1 and 2^30");
  }
  if (c.index.pages_per_chunk == 0 || c.index.pages_per_chunk > 4096) {
    return Invalid("index.pages_per_chunk", "must be between 1 and 4096");
  }
  if (c.index.chunks_per_grid == 0 || c.index.chunks_per_grid > 4096) {
    return Invalid("index.chunks_per_grid", "must be between 1 and 4096");
  }
  return absl::OkStatus();
}

absl::Status ValidateSelect(const Config& c) {
  const Config::Select& s = c.select;
  if (s.default_scorer == index::ScorerKind::kKeyKeyWeighted && !c.index.summary_weighted) {
    return Invalid("select.default_scorer",
                   "\"keykey_weighted\" needs index.summary_weighted = true");
  }
  for (absl::string_view name : absl::StrSplit(s.stability_scorers, ',', absl::SkipEmpty())) {
    if (!index::ParseScorerKind(absl::StripAsciiWhitespace(name)).ok()) {
      return Invalid("select.stability_scorers",
                     absl::StrCat("\"", name,
                                  "\" is not a scorer (keykey, keykey_weighted, quest, arkvale, "
                                  "keydiff, recency, random, mass)"));
    }
  }
  KVTIER_RETURN_IF_ERROR(
      InRange("select.keykey_recency_weight", s.keykey_recency_weight, 0, 1, false));
  if (c.index.q8_page_rows) {
    return Invalid("index.q8_page_rows",
                   "was removed (int8 tree rows with an fp16 re-rank were slower than the fp16 "
                   "rows, docs/BENCHMARKS.md); delete the line or set it false");
  }
  if ((s.default_scorer == index::ScorerKind::kQuest ||
       s.default_scorer == index::ScorerKind::kArkVale) &&
      (!c.index.keep_summaries || !c.index.summary_bounds)) {
    return Invalid("select.default_scorer", absl::StrCat("\"", s.default_scorer,
                                                         "\" needs index.keep_summaries = true and "
                                                         "index.summary_bounds = true"));
  }
  KVTIER_RETURN_IF_ERROR(
      InRange("select.grid_keep_fraction", s.grid_keep_fraction, 0, 1, /*lo_open=*/true));
  KVTIER_RETURN_IF_ERROR(
      InRange("select.chunk_keep_fraction", s.chunk_keep_fraction, 0, 1, /*lo_open=*/true));
  KVTIER_RETURN_IF_ERROR(
      InRange("select.page_keep_fraction", s.page_keep_fraction, 0, 1, /*lo_open=*/true));
  if (s.sink_blocks > 4096) return Invalid("select.sink_blocks", "must be at most 4096");
  if (s.local_blocks > 4096) return Invalid("select.local_blocks", "must be at most 4096");
  if (s.sink_blocks + s.local_blocks > c.limits.max_batch_blocks) {
    return Invalid("select.local_blocks",
                   "select.sink_blocks + select.local_blocks must be at most "
                   "limits.max_batch_blocks (the most blocks one Select may return)");
  }
  if (s.window_steps == 0 || s.window_steps > 64) {
    return Invalid("select.window_steps", "must be between 1 and 64");
  }
  KVTIER_RETURN_IF_ERROR(InRange("select.theta", s.theta, 0, 1, false));
  KVTIER_RETURN_IF_ERROR(InRange("select.stability_weight", s.stability_weight, 0, 1, false));
  KVTIER_RETURN_IF_ERROR(InRange("select.hold_threshold", s.hold_threshold, 0, 2, true));
  if (s.max_prefetch_blocks > 4096) {
    return Invalid("select.max_prefetch_blocks", "must be at most 4096");
  }
  if (s.max_contexts_per_request == 0 || s.max_contexts_per_request > 65536) {
    return Invalid("select.max_contexts_per_request", "must be between 1 and 65536");
  }
  if (s.batch_threads > 64) {
    return Invalid("select.batch_threads", "must be at most 64 (0 = min(4, cores))");
  }
  if (s.threads > 256) {
    return Invalid("select.threads", "must be at most 256 (0 = on gRPC's threads)");
  }
  if (s.queue_limit == 0 || s.queue_limit > 1000000) {
    return Invalid("select.queue_limit", "must be between 1 and 1000000");
  }
  if (s.queue_limit_per_tenant > s.queue_limit) {
    return Invalid("select.queue_limit_per_tenant",
                   "must be at most select.queue_limit (0 = a quarter of it)");
  }
  if (s.threads_per_tenant > s.threads) {
    return Invalid("select.threads_per_tenant",
                   "must be at most select.threads (0 = threads - 1 with auth on)");
  }
  if (s.max_queued_responses == 0 || s.max_queued_responses > 1024) {
    return Invalid("select.max_queued_responses", "must be between 1 and 1024");
  }
  KVTIER_RETURN_IF_ERROR(InRange("select.mass_tree_max_read_fraction",
                                 s.mass_tree_max_read_fraction, 0, 1, /*lo_open=*/true));
  if (s.mass_tree_recent_blocks > 65536) {
    return Invalid("select.mass_tree_recent_blocks", "must be at most 65536");
  }
  if (s.mass_tree_reuse_steps > 1024) {
    return Invalid("select.mass_tree_reuse_steps", "must be at most 1024 (0 = no reuse)");
  }
  KVTIER_RETURN_IF_ERROR(InRange("select.mass_tree_reuse_min_cosine", s.mass_tree_reuse_min_cosine,
                                 -1, 1, /*lo_open=*/false));
  return absl::OkStatus();
}

// The seed list's syntax is checked again (per entry) by the cluster
// client; here the ranges.
absl::Status ValidateRemote(const Config& c) {
  const Config::Remote& r = c.remote;
  if (r.connect_timeout_ms == 0 || r.connect_timeout_ms > 60000) {
    return Invalid("tiers.remote.connect_timeout_ms", "must be between 1 and 60000");
  }
  if (r.command_timeout_ms == 0 || r.command_timeout_ms > 60000) {
    return Invalid("tiers.remote.command_timeout_ms", "must be between 1 and 60000");
  }
  if (r.down_backoff_ms > 600000) {
    return Invalid("tiers.remote.down_backoff_ms", "must be at most 600000");
  }
  if (r.publish_threads == 0 || r.publish_threads > 64) {
    return Invalid("tiers.remote.publish_threads", "must be between 1 and 64");
  }
  if (r.writeback_buffer_bytes > (uint64_t{64} << 30)) {
    return Invalid("tiers.remote.writeback_buffer_bytes", "must be at most 64GiB");
  }
  if (r.publish_queue_blocks == 0 || r.publish_queue_blocks > (1u << 20)) {
    return Invalid("tiers.remote.publish_queue_blocks", "must be between 1 and 1048576");
  }
  if (r.miss_cache_ms > 3600000) {
    return Invalid("tiers.remote.miss_cache_ms", "must be at most 3600000");
  }
  if (r.redis_cluster.empty() && !r.password_file.empty()) {
    return Invalid("tiers.remote.password_file", "is set but tiers.remote.redis_cluster is not");
  }
  return absl::OkStatus();
}

// A Unix socket path fits sockaddr_un (107 bytes and the NUL).
absl::Status CheckSocketPath(const char* key, const std::string& path) {
  if (path.size() <= 107) return absl::OkStatus();
  return Invalid(
      key, absl::StrCat("is ", path.size(), " bytes; a Unix socket path is at most 107 bytes"));
}

// server.data_dir, the sockets (defaults filled in), TCP and TLS, auth.*.
absl::Status ValidateListeners(Config& c) {
  if (c.server.data_dir.empty()) return Invalid("server.data_dir", "must not be empty");
  if (c.server.socket_path.empty()) {
    c.server.socket_path = (std::filesystem::path(c.server.data_dir) / "kvtierd.sock").string();
  }
  KVTIER_RETURN_IF_ERROR(CheckSocketPath("server.socket_path", c.server.socket_path));
  if (c.server.socket_mode > 0777) return Invalid("server.socket_mode", "must be at most 0777");
  if (!c.server.tcp_address.empty() && c.server.tcp_address.rfind(':') == std::string::npos) {
    return Invalid("server.tcp_address", "must be host:port, e.g. 127.0.0.1:50551");
  }
  if (!c.server.tcp_address.empty() &&
      (c.server.tls_cert_file.empty() || c.server.tls_key_file.empty())) {
    return Invalid("server.tls_cert_file",
                   "TCP (server.tcp_address) is served only with TLS: set server.tls_cert_file "
                   "and server.tls_key_file");
  }
  if (c.server.tls_cert_file.empty() != c.server.tls_key_file.empty()) {
    return Invalid("server.tls_key_file", "set both server.tls_cert_file and server.tls_key_file");
  }
  if (!c.server.tls_client_ca_file.empty() && c.server.tls_cert_file.empty()) {
    return Invalid("server.tls_client_ca_file", "needs server.tls_cert_file (mTLS is TLS)");
  }
  if (c.auth.fd_socket_path.empty()) c.auth.fd_socket_path = c.server.socket_path + ".fd";
  KVTIER_RETURN_IF_ERROR(CheckSocketPath("auth.fd_socket_path", c.auth.fd_socket_path));
  KVTIER_RETURN_IF_ERROR(CheckSocketPath("auth.peer_socket_path", c.auth.peer_socket_path));
  if (!c.auth.peer_socket_path.empty() && c.auth.tenants_file.empty()) {
    return Invalid("auth.peer_socket_path", "needs auth.tenants_file (uids map to tenants there)");
  }
  if (c.auth.tenant_arena_bytes < 4096) {
    return Invalid("auth.tenant_arena_bytes", "must be >= 4KiB");
  }
  if (c.auth.tenant_staging_bytes < 4096) {
    return Invalid("auth.tenant_staging_bytes", "must be >= 4KiB");
  }
  if (c.auth.tenant_max_leases > (1u << 24)) {
    return Invalid("auth.tenant_max_leases", "must be at most 16777216 (0 = no limit)");
  }
  return absl::OkStatus();
}

// server.* limits: messages, streams, queues and threads.
absl::Status ValidateServerLimits(const Config& c) {
  if (c.server.max_message_bytes < (64u << 10) || c.server.max_message_bytes > (1ull << 31) - 1) {
    return Invalid("server.max_message_bytes", "must be between 64KiB and 2GiB-1");
  }
  if (c.server.shutdown_grace_ms > 600000) {
    return Invalid("server.shutdown_grace_ms", "must be at most 600000");
  }
  if (c.server.max_concurrent_streams == 0 || c.server.max_concurrent_streams > 65536) {
    return Invalid("server.max_concurrent_streams", "must be between 1 and 65536");
  }
  if (c.server.max_connections == 0 || c.server.max_connections > 1000000) {
    return Invalid("server.max_connections", "must be between 1 and 1000000");
  }
  if (c.server.max_connections_per_uid == 0 ||
      c.server.max_connections_per_uid > c.server.max_connections) {
    return Invalid("server.max_connections_per_uid",
                   "must be between 1 and server.max_connections");
  }
  if (c.server.max_pending_connections == 0 || c.server.max_pending_connections > 65536) {
    return Invalid("server.max_pending_connections", "must be between 1 and 65536");
  }
  if (c.limits.max_admin_operations == 0 || c.limits.max_admin_operations > 64) {
    return Invalid("limits.max_admin_operations", "must be between 1 and 64");
  }
  if (c.server.max_tcp_connections == 0 || c.server.max_tcp_connections > 100000) {
    return Invalid("server.max_tcp_connections", "must be between 1 and 100000");
  }
  if (c.server.max_tcp_connections_per_address == 0 ||
      c.server.max_tcp_connections_per_address > c.server.max_tcp_connections) {
    return Invalid("server.max_tcp_connections_per_address",
                   "must be between 1 and server.max_tcp_connections");
  }
  if (c.server.connection_setup_ms < 100 || c.server.connection_setup_ms > 600000) {
    return Invalid("server.connection_setup_ms", "must be between 100 and 600000");
  }
  if (c.server.connection_idle_ms != 0 &&
      (c.server.connection_idle_ms < 1000 || c.server.connection_idle_ms > 86400000)) {
    return Invalid("server.connection_idle_ms", "must be 0 (never) or between 1000 and 86400000");
  }
  if (c.server.io_queue_limit_per_tenant > c.server.io_queue_limit) {
    return Invalid("server.io_queue_limit_per_tenant", "must be at most server.io_queue_limit");
  }
  if (c.server.io_threads_per_tenant > c.server.io_threads) {
    return Invalid("server.io_threads_per_tenant", "must be at most server.io_threads");
  }
  if (c.server.max_streams == 0 || c.server.max_streams > 1000000) {
    return Invalid("server.max_streams", "must be between 1 and 1000000");
  }
  if (c.server.max_streams_per_tenant == 0 ||
      c.server.max_streams_per_tenant > c.server.max_streams) {
    return Invalid("server.max_streams_per_tenant", "must be between 1 and server.max_streams");
  }
  if (c.server.stream_write_timeout_ms < 100 || c.server.stream_write_timeout_ms > 3600000) {
    return Invalid("server.stream_write_timeout_ms", "must be between 100 and 3600000");
  }
  if (c.server.max_queued_bytes_per_tenant == 0 ||
      c.server.max_queued_bytes_per_tenant > c.server.max_queued_bytes) {
    return Invalid("server.max_queued_bytes_per_tenant",
                   "must be between 1 byte and server.max_queued_bytes");
  }
  if (c.server.io_threads > 64) return Invalid("server.io_threads", "must be at most 64");
  if (c.server.io_queue_limit == 0 || c.server.io_queue_limit > 65536) {
    return Invalid("server.io_queue_limit", "must be between 1 and 65536");
  }
  if (c.server.put_parallelism > 64) {
    return Invalid("server.put_parallelism", "must be at most 64 (0 = min(4, cores))");
  }
  return absl::OkStatus();
}

// tiers.host, tiers.device and tiers.nvme (the NVMe folder's default filled in).
absl::Status ValidateTiers(Config& c) {
  if (c.host.capacity_bytes < 4096) return Invalid("tiers.host.capacity_bytes", "must be >= 4KiB");
  if (c.host.staging_bytes < 4096) return Invalid("tiers.host.staging_bytes", "must be >= 4KiB");
  if (c.host.max_in_flight_get_bytes > c.host.capacity_bytes) {
    return Invalid("tiers.host.max_in_flight_get_bytes",
                   "must be at most tiers.host.capacity_bytes (0 = a quarter of it)");
  }
  if (c.device.capacity_bytes < 4096) {
    return Invalid("tiers.device.capacity_bytes", "must be >= 4KiB");
  }
  if (c.nvme.dir.empty()) c.nvme.dir = (std::filesystem::path(c.server.data_dir) / "nvme").string();
  if (c.nvme.file_count == 0 || c.nvme.file_count > 4096) {
    return Invalid("tiers.nvme.file_count", "must be between 1 and 4096");
  }
  if (c.nvme.file_size_bytes < (1u << 20) || c.nvme.file_size_bytes % 4096 != 0) {
    return Invalid("tiers.nvme.file_size_bytes", "must be at least 1MiB and a multiple of 4096");
  }
  if (c.nvme.io_threads == 0 || c.nvme.io_threads > 64) {
    return Invalid("tiers.nvme.io_threads", "must be between 1 and 64");
  }
  if (c.nvme.queue_depth == 0 || c.nvme.queue_depth > 4096) {
    return Invalid("tiers.nvme.queue_depth", "must be between 1 and 4096");
  }
  return absl::OkStatus();
}

absl::Status Validate(Config& c) {
  KVTIER_RETURN_IF_ERROR(ValidateListeners(c));
  KVTIER_RETURN_IF_ERROR(ValidateServerLimits(c));
  KVTIER_RETURN_IF_ERROR(ValidateTiers(c));
  if (c.leases.default_ttl_ms == 0) return Invalid("leases.default_ttl_ms", "must be > 0");
  if (c.leases.max_ttl_ms < c.leases.default_ttl_ms) {
    return Invalid("leases.max_ttl_ms", "must be >= leases.default_ttl_ms");
  }
  if (c.limits.max_batch_blocks == 0 || c.limits.max_batch_blocks > 1u << 20) {
    return Invalid("limits.max_batch_blocks", "must be between 1 and 1048576");
  }
  if (c.limits.max_contexts == 0 || c.limits.max_contexts > (1u << 20)) {
    return Invalid("limits.max_contexts", "must be between 1 and 1048576");
  }
  if (c.compaction.max_context_bytes < (1u << 20) ||
      c.compaction.max_context_bytes > (uint64_t{1} << 40)) {
    return Invalid("compaction.max_context_bytes", "must be between 1 MiB and 1 TiB");
  }
  if (c.compaction.max_observation_rows == 0 || c.compaction.max_observation_rows > 65536) {
    return Invalid("compaction.max_observation_rows", "must be between 1 and 65536");
  }
  KVTIER_RETURN_IF_ERROR(ValidateRemote(c));
  KVTIER_RETURN_IF_ERROR(ValidatePlacement(c));
  KVTIER_RETURN_IF_ERROR(ValidateIndex(c));
  return ValidateSelect(c);
}

}  // namespace

const char* DefaultConfigToml() { return kDefaultConfigToml; }

std::map<std::string, std::string> Config::Flatten() const {
  std::map<std::string, std::string> out;
  for (const Field& f : Fields()) out[f.key] = f.get(*this);
  return out;
}

absl::StatusOr<uint64_t> ParseSize(const std::string& text) {
  if (std::optional<uint64_t> bytes = auth::ParseSizeText(text); bytes.has_value()) return *bytes;
  return absl::InvalidArgumentError(absl::StrCat(
      "bad size '", text,
      "': 1 to 19 digits, then an optional unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), "
      "at most 2^64 - 1 bytes"));
}

absl::StatusOr<Config> LoadConfig(const std::string& config_path,
                                  const std::vector<std::string>& overrides) {
  Config config;
  KVTIER_RETURN_IF_ERROR(ParseInto(config, DefaultConfigToml(), "<embedded defaults>"));
  if (!config_path.empty()) {
    std::error_code ec;
    if (!std::filesystem::exists(config_path, ec)) {
      return absl::NotFoundError(absl::StrCat("config file ", config_path, " does not exist"));
    }
    toml::table table;
    try {
      table = toml::parse_file(config_path);
    } catch (const toml::parse_error& err) {
      return ParseError(config_path, err);
    }
    KVTIER_RETURN_IF_ERROR(ApplyTable(config, table, "", config_path + ": "));
  }
  for (const std::string& item : overrides) KVTIER_RETURN_IF_ERROR(ApplyOverride(config, item));
  KVTIER_RETURN_IF_ERROR(Validate(config));
  return config;
}

}  // namespace kvtier::daemon
