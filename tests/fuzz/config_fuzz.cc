// Fuzz target: the configuration loader (daemon/config.h), TOML text in,
// Config or error out.
//
// Input: TOML text, optionally followed by a NUL byte and override lines
// ("section.key=value", one per line, at most 16). The text is written to
// a file of this process and loaded with LoadConfig(file, overrides).
//
// Checked (a violation abort()s):
//   - an error is INVALID_ARGUMENT with a message (the file exists, so
//     NOT_FOUND is wrong too);
//   - a loaded Config has its resolved fields set (socket_path,
//     auth.fd_socket_path, tiers.nvme.dir; the socket paths fit sun_path),
//     a few cross-key rules hold, Flatten() names exactly the keys the
//     defaults name, and loading the same input again gives the same
//     configuration.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "daemon/config.h"

namespace {

using kvtier::daemon::Config;

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "config_fuzz: %s\n", what);
  std::abort();
}

const std::string& ConfigPath() {
  static const std::string* path = [] {
    const char* tmp = std::getenv("TMPDIR");
    auto* p = new std::string(std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                              "/kvtier-fuzz-config-" + std::to_string(::getpid()) + ".toml");
    std::atexit([] { ::unlink(ConfigPath().c_str()); });
    return p;
  }();
  return *path;
}

std::vector<std::string> DefaultKeys() {
  auto config = kvtier::daemon::LoadConfig("", {"server.data_dir=/tmp/x"});
  Check(config.ok(), "the embedded defaults do not load");
  std::vector<std::string> keys;
  for (const auto& [key, value] : config->Flatten()) keys.push_back(key);
  return keys;
}

void CheckConfig(const Config& c) {
  Check(!c.server.data_dir.empty(), "empty server.data_dir");
  Check(!c.server.socket_path.empty() && c.server.socket_path.size() <= 107,
        "server.socket_path unresolved or too long");
  Check(!c.auth.fd_socket_path.empty() && c.auth.fd_socket_path.size() <= 107,
        "auth.fd_socket_path unresolved or too long");
  Check(!c.nvme.dir.empty(), "tiers.nvme.dir unresolved");
  Check(c.server.socket_mode <= 0777, "socket_mode above 0777");
  Check(c.leases.max_ttl_ms >= c.leases.default_ttl_ms && c.leases.default_ttl_ms > 0,
        "lease ttl rules");
  Check(c.server.tcp_address.empty() || !c.server.tls_cert_file.empty(), "TCP without TLS");
  Check(!c.index.summary_per_layer_bounds || c.index.summary_per_layer, "layer bounds rule");
  Check(c.nvme.file_count >= 1 && c.nvme.file_size_bytes >= (1u << 20) &&
            c.nvme.file_size_bytes % 4096 == 0,
        "nvme file rules");
  std::vector<std::string> keys;
  for (const auto& [key, value] : c.Flatten()) keys.push_back(key);
  static const std::vector<std::string> expected = DefaultKeys();
  Check(keys == expected, "Flatten() keys differ from the defaults'");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string toml = input.substr(0, nul);
  std::vector<std::string> overrides;
  if (nul != std::string::npos) {
    for (absl::string_view line : absl::StrSplit(input.substr(nul + 1), '\n', absl::SkipEmpty())) {
      if (overrides.size() == 16) break;
      overrides.emplace_back(line);
    }
  }
  {
    std::ofstream out(ConfigPath(), std::ios::binary | std::ios::trunc);
    out << toml;
    Check(static_cast<bool>(out.flush()), "cannot write the config file");
  }
  auto config = kvtier::daemon::LoadConfig(ConfigPath(), overrides);
  if (!config.ok()) {
    Check(config.status().code() == absl::StatusCode::kInvalidArgument,
          "LoadConfig error is not INVALID_ARGUMENT");
    Check(!config.status().message().empty(), "LoadConfig error without a message");
    return 0;
  }
  CheckConfig(*config);
  auto again = kvtier::daemon::LoadConfig(ConfigPath(), overrides);
  Check(again.ok() && again->Flatten() == config->Flatten(), "LoadConfig is not deterministic");
  return 0;
}
