#include "proto/auth/tenants_file.h"

#include <fcntl.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <iterator>
#include <map>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvtier::auth {
namespace {

// The one place errno becomes a status in reading the file.
absl::Status FileError(int err, absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " ", path));
}

absl::Status Bad(const std::string& path, size_t i, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": tenants[", i, "]: ", what));
}

// Position in kQuotaKeys, or -1.
int QuotaIndex(absl::string_view key) {
  for (size_t i = 0; i < std::size(kQuotaKeys); ++i) {
    if (key == kQuotaKeys[i]) return static_cast<int>(i);
  }
  return -1;
}

bool IsQuotaKey(absl::string_view key) { return QuotaIndex(key) >= 0; }

std::string KnownQuotaKeys() { return absl::StrJoin(kQuotaKeys, ", "); }

bool AllDigits(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

bool ValidSizeText(absl::string_view text) { return ParseSizeText(text).has_value(); }

void AppendStringList(const char* key, const std::vector<std::string>& values, std::string* out) {
  if (values.size() == 1) {
    absl::StrAppend(out, key, " = [", QuoteString(values[0]), "]\n");
    return;
  }
  absl::StrAppend(out, key, " = [\n");
  for (const std::string& v : values) absl::StrAppend(out, "  ", QuoteString(v), ",\n");
  absl::StrAppend(out, "]\n");
}

absl::Status ParseStringList(const toml::node& node, const std::string& key,
                             std::vector<std::string>* out) {
  const toml::array* a = node.as_array();
  if (a == nullptr) return absl::InvalidArgumentError(key + " must be a list of strings");
  for (const toml::node& v : *a) {
    if (!v.is_string()) return absl::InvalidArgumentError(key + " must be a list of strings");
    out->push_back(v.as_string()->get());
  }
  return absl::OkStatus();
}

absl::Status ParseQuotaTable(const toml::table& table, std::vector<Quota>* out) {
  for (const auto& [k, node] : table) {
    const std::string key(k.str());
    if (!IsQuotaKey(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown quota quotas.", key, " (known: ", KnownQuotaKeys(), ")"));
    }
    if (const auto* i = node.as_integer()) {
      if (i->get() < 0) return absl::InvalidArgumentError(absl::StrCat("quotas.", key, " < 0"));
      out->push_back(Quota{key, std::to_string(i->get()), false});
    } else if (const auto* s = node.as_string(); s != nullptr && ValidSizeText(s->get())) {
      out->push_back(Quota{key, s->get(), true});
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("quotas.", key, ": a non-negative integer or a size like \"64MiB\""));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TenantEntry> ParseEntry(const toml::table& e, const std::string& path, size_t i) {
  TenantEntry t;
  t.role.clear();
  for (const auto& [k, node] : e) {
    const std::string key(k.str());
    if (key == "name") {
      if (!node.is_string()) return Bad(path, i, "name must be a string");
      t.name = node.as_string()->get();
    } else if (key == "role") {
      if (!node.is_string()) return Bad(path, i, "role must be data or admin");
      t.role = node.as_string()->get();
    } else if (key == "token_sha256" || key == "cert_names") {
      absl::Status st =
          ParseStringList(node, key, key == "token_sha256" ? &t.token_sha256 : &t.cert_names);
      if (!st.ok()) return Bad(path, i, st.message());
    } else if (key == "uids") {
      const toml::array* a = node.as_array();
      if (a == nullptr) return Bad(path, i, "uids must be a list of integers");
      for (const auto& v : *a) {
        const std::optional<int64_t> uid = v.value<int64_t>();
        if (!v.is_integer() || !uid || *uid < 0 || *uid >= 0xFFFFFFFFll) {
          return Bad(path, i, "uids entries are integers in [0, 4294967294]");
        }
        t.uids.push_back(static_cast<uint32_t>(*uid));
      }
    } else if (key == "quotas") {
      if (!node.is_table()) return Bad(path, i, "quotas must be a table");
      absl::Status st = ParseQuotaTable(*node.as_table(), &t.quotas);
      if (!st.ok()) return Bad(path, i, st.message());
    } else {
      return Bad(path, i, absl::StrCat("unknown key '", key, "'"));
    }
  }
  if (t.role.empty()) t.role = "data";  // the daemon's default
  SortQuotas(&t.quotas);
  return t;
}

}  // namespace

std::string QuoteString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04X", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

void SortQuotas(std::vector<Quota>* quotas) {
  std::stable_sort(quotas->begin(), quotas->end(), [](const Quota& a, const Quota& b) {
    return QuotaIndex(a.key) < QuotaIndex(b.key);
  });
}

bool ValidTenantName(absl::string_view name) { return IsTenantName(name); }

uint64_t QuotaValue(const Quota& quota) {
  if (quota.is_size_string) return ParseSizeText(quota.value).value_or(0);
  return std::strtoull(quota.value.c_str(), nullptr, 10);
}

absl::StatusOr<Quota> ParseQuotaArgument(absl::string_view key_equals_value) {
  const size_t eq = key_equals_value.find('=');
  if (eq == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--quota ", key_equals_value, ": expected key=value"));
  }
  const std::string key(absl::StripAsciiWhitespace(key_equals_value.substr(0, eq)));
  const std::string value(absl::StripAsciiWhitespace(key_equals_value.substr(eq + 1)));
  if (!IsQuotaKey(key)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--quota ", key, ": unknown quota (known: ", KnownQuotaKeys(), ")"));
  }
  const bool is_size = absl::EndsWith(key, "_bytes");
  // Plain digits become a TOML integer, which is signed 64-bit.
  if (AllDigits(value) &&
      (value.size() < 19 || (value.size() == 19 && value <= "9223372036854775807"))) {
    return Quota{key, value, false};
  }
  if (is_size && !AllDigits(value) && ValidSizeText(value)) return Quota{key, value, true};
  return absl::InvalidArgumentError(
      absl::StrCat("--quota ", key, ": ",
                   is_size ? "a size like 4096 or 64MiB (units B KiB MiB GiB TiB KB MB GB TB)"
                           : "a non-negative integer",
                   ", got '", value, "'"));
}

absl::Status ValidateTenants(const std::vector<TenantEntry>& tenants, const std::string& path) {
  if (tenants.size() > kMaxTenants) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", tenants.size(), " tenants exceed the limit of ", kMaxTenants));
  }
  // Each value -> the entry that listed it first.
  std::map<std::string, size_t> names, hashes, certs;
  std::map<uint32_t, size_t> uids;
  // "listed twice" within one entry, "listed under two tenants" across.
  auto duplicate = [](size_t first, size_t i) {
    return first == i ? "listed twice" : "listed under two tenants";
  };
  for (size_t i = 0; i < tenants.size(); ++i) {
    const TenantEntry& t = tenants[i];
    if (t.name.empty()) return Bad(path, i, "name is required");
    if (!ValidTenantName(t.name)) {
      return Bad(path, i,
                 absl::StrCat("name \"", t.name, "\" must be 1..", kMaxTenantNameBytes,
                              " bytes of [A-Za-z0-9._-]"));
    }
    if (t.role != "data" && t.role != "admin") return Bad(path, i, "role must be data or admin");
    if (t.token_sha256.empty() && t.cert_names.empty() && t.uids.empty()) {
      return Bad(path, i, "needs token_sha256, cert_names or uids (else it cannot authenticate)");
    }
    if (auto [it, fresh] = names.emplace(t.name, i); !fresh) {
      return Bad(path, i, absl::StrCat("tenant \"", t.name, "\" is listed twice"));
    }
    for (const std::string& h : t.token_sha256) {
      if (!IsTokenHash(h)) {
        return Bad(path, i, "token_sha256 entries are 64 lowercase hex digits (SHA-256)");
      }
      if (auto [it, fresh] = hashes.emplace(h, i); !fresh) {
        return Bad(path, i, absl::StrCat("a token hash is ", duplicate(it->second, i)));
      }
    }
    for (const std::string& n : t.cert_names) {
      if (n.empty() || n.size() > kMaxCertNameBytes) {
        return Bad(path, i,
                   absl::StrCat("cert_names entries are 1..", kMaxCertNameBytes, " bytes"));
      }
      if (auto [it, fresh] = certs.emplace(n, i); !fresh) {
        return Bad(path, i, absl::StrCat("cert name \"", n, "\" is ", duplicate(it->second, i)));
      }
    }
    for (uint32_t uid : t.uids) {
      if (auto [it, fresh] = uids.emplace(uid, i); !fresh) {
        return Bad(path, i, absl::StrCat("uid ", uid, " is ", duplicate(it->second, i)));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TenantEntry>> ParseTenants(const std::string& text,
                                                      const std::string& path) {
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ":", e.source().begin.line, ": ", std::string(e.description())));
  }
  for (const auto& [key, node] : root) {
    if (key.str() != "tenants") {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": unknown key '", std::string(key.str()), "' (only [[tenants]])"));
    }
  }
  std::vector<TenantEntry> out;
  if (root.contains("tenants")) {
    const toml::array* list = root["tenants"].as_array();
    if (list == nullptr) {
      return absl::InvalidArgumentError(path + ": tenants must be an array of tables");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      const toml::table* e = (*list)[i].as_table();
      if (e == nullptr) return Bad(path, i, "not a table");
      absl::StatusOr<TenantEntry> t = ParseEntry(*e, path, i);
      if (!t.ok()) return t.status();
      out.push_back(std::move(*t));
    }
  }
  if (absl::Status st = ValidateTenants(out, path); !st.ok()) return st;
  return out;
}

absl::StatusOr<std::vector<TenantEntry>> ReadTenantsFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return FileError(errno, "open", path);
  std::string text;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
  const int err = errno;
  close(fd);
  if (n < 0) return FileError(err, "read", path);
  return ParseTenants(text, path);
}

std::string FormatTenant(const TenantEntry& t) {
  std::string out = "[[tenants]]\n";
  absl::StrAppend(&out, "name = ", QuoteString(t.name), "\n");
  absl::StrAppend(&out, "role = ", QuoteString(t.role), "\n");
  if (!t.token_sha256.empty()) AppendStringList("token_sha256", t.token_sha256, &out);
  if (!t.cert_names.empty()) AppendStringList("cert_names", t.cert_names, &out);
  if (!t.uids.empty()) absl::StrAppend(&out, "uids = [", absl::StrJoin(t.uids, ", "), "]\n");
  if (!t.quotas.empty()) {
    absl::StrAppend(&out, "[tenants.quotas]\n");
    for (const Quota& q : t.quotas) {
      absl::StrAppend(&out, q.key, " = ", q.is_size_string ? QuoteString(q.value) : q.value, "\n");
    }
  }
  return out;
}

std::string FormatTenantsFile(const std::vector<TenantEntry>& tenants) {
  std::string out =
      "# kvtierd tenants (auth.tenants_file; format in daemon/auth/tenants.h).\n"
      "# Edited by `kvtierctl tenants`: tokens are stored only as SHA-256.\n"
      "# Apply changes with `kill -HUP <kvtierd pid>` or `systemctl reload kvtierd`.\n";
  for (const TenantEntry& t : tenants) absl::StrAppend(&out, "\n", FormatTenant(t));
  return out;
}

std::optional<uint64_t> ParseSizeText(absl::string_view text) {
  size_t i = 0;
  while (i < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == 0 || i > 19) return std::nullopt;
  const uint64_t n = std::strtoull(std::string(text.substr(0, i)).c_str(), nullptr, 10);
  absl::string_view unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  static const std::pair<const char*, uint64_t> kUnits[] = {{"", 1},
                                                            {"B", 1},
                                                            {"KiB", 1ull << 10},
                                                            {"MiB", 1ull << 20},
                                                            {"GiB", 1ull << 30},
                                                            {"TiB", 1ull << 40},
                                                            {"KB", 1000ull},
                                                            {"MB", 1000000ull},
                                                            {"GB", 1000000000ull},
                                                            {"TB", 1000000000000ull}};
  for (const auto& [name, mult] : kUnits) {
    if (unit == name) {
      if (n > UINT64_MAX / mult) return std::nullopt;
      return n * mult;
    }
  }
  return std::nullopt;
}

}  // namespace kvtier::auth
