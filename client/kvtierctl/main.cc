// kvtierctl: administration CLI for kvtierd.
//
//   kvtierctl status [--json]          version, uptime, tiers, configuration
//   kvtierctl stats  [--json]          same as status
//   kvtierctl ls [--profile N] [--limit N]   blocks per tier and profile
//   kvtierctl verify [--profile N]     re-read and checksum every durable block
//   kvtierctl drain [device]           demote everything to NVMe (or empty the device tier)
//   kvtierctl profiles                 registered model profiles
//   kvtierctl evict --profile N [--tier T] ID...   give up copies in one tier
//   kvtierctl contexts | top           open contexts; live view
//   kvtierctl compact --profile N --retention R ID...   SelKV-compact a context
//   kvtierctl versions --profile N [KEY]        versions of compacted contexts
//   kvtierctl drop-version --profile N KEY V    delete one version's blocks
//   kvtierctl tenants add NAME --file PATH [--role data|admin]
//                     [--quota key=value ...] [--cert-name CN ...] [--uid UID ...]
//   kvtierctl tenants list --file PATH
//   kvtierctl tenants rotate NAME --file PATH [--revoke-others]
//
// The daemon is found at --socket, else $KVTIER_SOCKET, else
// ./var/kvtier/kvtierd.sock (where deploy/run.sh starts it) when that
// exists, else /run/kvtier/kvtierd.sock (the packaged service's). A daemon with
// tenants (auth.tenants_file) wants a bearer token: --token, --token-file,
// else $KVTIER_TOKEN. `tenants` edits the file offline and needs neither.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <CLI/CLI.hpp>

#include "client/client.h"
#include "client/kvtierctl/commands.h"
#include "client/kvtierctl/credentials.h"

namespace {

// Everything the command line sets, and the subcommands whose parsed() picks
// what runs. Filled by the Add*Commands functions before parsing; the CLI
// holds pointers into it, so it must outlive the CLI::App.
struct CtlArgs {
  std::string socket, token, token_file;
  kvtier::ctl::GlobalOptions options;
  int timeout_ms = 10000;

  CLI::App* status = nullptr;
  kvtier::ctl::LsOptions ls_options;
  CLI::App* ls = nullptr;
  CLI::App* contexts = nullptr;
  kvtier::ctl::TopOptions top_options;
  CLI::App* top = nullptr;
  kvtier::ctl::VerifyOptions verify_options;
  CLI::App* verify = nullptr;
  kvtier::ctl::DrainOptions drain_options;
  CLI::App* drain = nullptr;
  CLI::App* profiles = nullptr;
  kvtier::ctl::EvictOptions evict_options;
  CLI::App* evict = nullptr;

  kvtier::ctl::CompactOptions compact_options;
  CLI::App* compact = nullptr;
  kvtier::ctl::VersionsOptions versions_options;
  CLI::App* versions = nullptr;
  kvtier::ctl::DropVersionOptions drop_options;
  CLI::App* drop = nullptr;

  kvtier::ctl::TenantAddOptions add;
  CLI::App* add_cmd = nullptr;
  std::string list_file;
  CLI::App* list_cmd = nullptr;
  kvtier::ctl::TenantsRotateOptions rotate;
  CLI::App* rotate_cmd = nullptr;
};

// Options that apply to every subcommand: daemon address, credentials,
// --json, the per-call deadline.
void AddGlobalOptions(CLI::App& app, CtlArgs& a) {
  app.add_option("-s,--socket", a.socket,
                 "Daemon address: socket path or host:port "
                 "(default $KVTIER_SOCKET, else ./var/kvtier/kvtierd.sock when it exists, "
                 "else /run/kvtier/kvtierd.sock)");
  app.add_option("--token", a.token,
                 "Bearer token of your tenant (default $KVTIER_TOKEN); visible to other local "
                 "users in the process list, so prefer --token-file or the variable");
  app.add_option("--token-file", a.token_file, "File holding the bearer token");
  app.add_flag("--json", a.options.json, "Machine-readable JSON output");
  app.add_option("--timeout-ms", a.timeout_ms, "Deadline of each call")->check(CLI::PositiveNumber);
}

// The store-inspection subcommands: status (stats), ls, contexts, top,
// verify, drain, profiles, evict — added in that order (the help lists them
// so).
void AddStoreCommands(CLI::App& app, CtlArgs& a) {
  a.status = app.add_subcommand("status", "Version, uptime, tiers and configuration");
  a.status->add_flag("--json", a.options.json, "Machine-readable JSON output");
  a.status->alias("stats");
  a.ls = app.add_subcommand("ls", "Blocks per tier and profile");
  a.ls->add_option("--profile", a.ls_options.profile_id, "Only this profile id");
  a.ls->add_option("--limit", a.ls_options.limit, "Also list up to N blocks individually");
  a.ls->add_flag("--quarantined", a.ls_options.quarantined,
                 "List quarantined blocks (whoever found them) instead; with no --limit, all");
  a.ls->add_option("--tier", a.ls_options.tier,
                   "Only blocks whose fastest copy is in this tier: device, host or nvme");
  a.ls->add_flag("--json", a.options.json, "Machine-readable JSON output");
  a.ls->footer(
      "Examples:\n"
      "  kvtierctl ls                          blocks and bytes per profile and tier\n"
      "  kvtierctl ls --tier nvme --limit 20   the first 20 blocks on NVMe (ids in hex)\n"
      "  kvtierctl ls --quarantined --json     every quarantined block, as JSON");
  a.contexts = app.add_subcommand("contexts", "Open contexts, busiest first");
  a.contexts->add_flag("--json", a.options.json, "Machine-readable JSON output");
  a.contexts->footer(
      "Columns: context id (hex), tenant, profile, blocks, blocks pinned by its\n"
      "current lease, its last Select step, time since it was last used.\n"
      "Example:\n"
      "  kvtierctl contexts --json");
  a.top = app.add_subcommand("top", "Live view of the tiers and the busiest contexts");
  a.top->add_option("--interval-ms", a.top_options.interval_ms, "Time between refreshes")
      ->check(CLI::Range(10u, 3600000u));
  a.top->add_option("--iterations", a.top_options.iterations,
                    "Refreshes before exiting (default: until interrupted)");
  a.top->add_option("--limit", a.top_options.limit, "Contexts shown")
      ->check(CLI::Range(1u, 100000u));
  a.top->add_flag("--json", a.options.json, "One JSON object per refresh and line");
  a.top->footer(
      "Examples:\n"
      "  kvtierctl top                              refresh every 2 s until Ctrl-C\n"
      "  kvtierctl top --iterations 1 --limit 5     one snapshot of the 5 busiest\n"
      "  kvtierctl top --json --interval-ms 1000    newline-delimited JSON for scripts");
  a.verify = app.add_subcommand(
      "verify", "Re-read and checksum every copy of every block; list every quarantined block");
  a.verify->add_option("--profile", a.verify_options.profile_id, "Only this profile id");
  a.verify->add_flag("--json", a.options.json, "Machine-readable JSON output");
  a.drain = app.add_subcommand(
      "drain", "Demote every block to NVMe (durable), or empty only the device tier");
  a.drain
      ->add_option("tier", a.drain_options.tier,
                   "device, host or nvme (default: everything to nvme)")
      ->check(CLI::IsMember({"device", "host", "nvme"}));
  a.drain->add_flag("--json", a.options.json, "Machine-readable JSON output");
  a.drain->footer(
      "Examples:\n"
      "  kvtierctl drain            every block durable on NVMe, memory copies dropped\n"
      "  kvtierctl drain device     unpinned device copies dropped (last copies kept in host)");
  a.profiles = app.add_subcommand("profiles", "Registered model profiles");
  a.profiles->add_flag("--json", a.options.json, "Machine-readable JSON output");
  a.profiles->footer(
      "Columns: id, name, revision, shape (layers/kv heads/head dim/tokens per block),\n"
      "dtype, block size, blocks and bytes stored, the tenant that registered it first.\n"
      "Example:\n"
      "  kvtierctl profiles --json");
  a.evict = app.add_subcommand("evict", "Give up blocks' copies in one tier as the cache would");
  a.evict
      ->add_option("ids", a.evict_options.block_ids_hex, "Block ids in hex (as `ls` prints them)")
      ->required();
  a.evict->add_option("--profile", a.evict_options.profile_id, "Profile id")->required();
  a.evict->add_option("--tenant", a.evict_options.tenant, "Whose blocks (default: default)");
  a.evict
      ->add_option("--tier", a.evict_options.tier,
                   "device: drop device copies; host: drop host copies (last copies go to "
                   "NVMe first); nvme (default): the blocks leave this daemon")
      ->check(CLI::IsMember({"device", "host", "nvme"}));
  a.evict->add_flag("--json", a.options.json, "Machine-readable JSON output");
  a.evict->footer(
      "Pinned copies and retained blocks stay (FAILED_PRECONDITION). A remote tier's copy\n"
      "stays too.\n"
      "Examples:\n"
      "  kvtierctl evict --profile 1 --tier device 0a1b2c3d\n"
      "  kvtierctl evict --profile 1 --tenant acme 0a1b2c3d 4e5f6071 --json");
}

// The compaction subcommands: compact, versions, drop-version.
void AddCompactionCommands(CLI::App& app, CtlArgs& a) {
  a.compact = app.add_subcommand(
      "compact", "SelKV-compact a context: keep a fraction of its tokens, merge the rest");
  a.compact
      ->add_option("ids", a.compact_options.block_ids_hex,
                   "The context's block ids in hex, in token order")
      ->required();
  a.compact->add_option("--profile", a.compact_options.profile_id, "Profile id")->required();
  a.compact
      ->add_option("--retention", a.compact_options.retention,
                   "Fraction of tokens kept per layer and KV head, in (0, 1]")
      ->required();
  a.compact->add_option("--importance", a.compact_options.importance, "keydiff (default) or snapkv")
      ->check(CLI::IsMember({"keydiff", "snapkv"}));
  a.compact->add_option("--merge", a.compact_options.merge, "gated (default), uniform or none")
      ->check(CLI::IsMember({"gated", "uniform", "none"}));
  a.compact->add_option("--bias", a.compact_options.bias, "ratio (default) or none")
      ->check(CLI::IsMember({"ratio", "none"}));
  a.compact->add_flag("--json", a.options.json, "Machine-readable JSON output");
  a.compact->footer(
      "The compacted blocks are a new version of the context; the originals are demoted\n"
      "to NVMe and stay until `drop-version KEY 0`. snapkv needs observation queries,\n"
      "which only the API can send (docs/API.md, \"Compaction\").\n"
      "Example:\n"
      "  kvtierctl compact --profile 1 --retention 0.25 0a1b... 4e5f...");
  a.versions = app.add_subcommand("versions", "Versions of compacted contexts");
  a.versions->add_option("key", a.versions_options.context_key_hex,
                         "Context key in hex (default: every context)");
  a.versions->add_option("--profile", a.versions_options.profile_id, "Profile id")->required();
  a.versions->add_flag("--json", a.options.json, "Machine-readable JSON output");
  a.drop = app.add_subcommand("drop-version",
                              "Delete one version of a compacted context (0 = the originals)");
  a.drop
      ->add_option("key", a.drop_options.context_key_hex,
                   "Context key in hex (as `versions` prints it)")
      ->required();
  a.drop->add_option("version", a.drop_options.version, "Version; 0 = the original blocks")
      ->required();
  a.drop->add_option("--profile", a.drop_options.profile_id, "Profile id")->required();
  a.drop->add_flag("--json", a.options.json, "Machine-readable JSON output");
  a.drop->footer(
      "Refused while it would leave no copy of the context: the originals go only while a\n"
      "compacted version exists, and the last compacted version stays once they are gone.\n"
      "Example:\n"
      "  kvtierctl drop-version --profile 1 9f86d081884c7d659a2feaa0c55ad015 0");
  a.versions->footer(
      "Version 0 is the original blocks; dropped versions stay listed.\n"
      "Example:\n"
      "  kvtierctl versions --profile 1 --json");
}

// `tenants add|list|rotate`: offline edits of the tenants file.
void AddTenantsCommands(CLI::App& app, CtlArgs& a) {
  CLI::App* tenants = app.add_subcommand(
      "tenants", "Edit the tenants file (auth.tenants_file); the daemon applies it on SIGHUP");
  tenants->require_subcommand(1);
  a.add_cmd = tenants->add_subcommand(
      "add", "Append a tenant with a new token (printed once; the file keeps its SHA-256)");
  a.add_cmd->add_option("name", a.add.name, "Tenant name: 1..64 bytes of [A-Za-z0-9._-]")
      ->required();
  a.add_cmd->add_option("--file", a.add.file, "The tenants file (created 0600 if absent)")
      ->required();
  a.add_cmd->add_option("--role", a.add.role, "data (KvTier service) or admin (both services)");
  a.add_cmd
      ->add_option("--quota", a.add.quotas,
                   "key=value, repeatable: device_bytes pinned_bytes staging_bytes "
                   "host_bytes nvme_bytes retained_bytes (sizes: 4096, 64MiB) "
                   "leases staging_slots contexts "
                   "blocks_per_context profiles (counts)")
      ->allow_extra_args(false);
  a.add_cmd
      ->add_option("--cert-name", a.add.cert_names,
                   "mTLS client-certificate common name, repeatable")
      ->allow_extra_args(false);
  a.add_cmd
      ->add_option("--uid", a.add.uids,
                   "local user id served without a token on auth.peer_socket_path, "
                   "repeatable")
      ->allow_extra_args(false);
  a.add_cmd->add_flag("--json", a.options.json, "Print the token as JSON");
  a.list_cmd = tenants->add_subcommand("list", "Tenants, roles, token counts, quotas");
  a.list_cmd->add_option("--file", a.list_file, "The tenants file")->required();
  a.list_cmd->add_flag("--json", a.options.json, "Machine-readable JSON output");
  a.rotate_cmd = tenants->add_subcommand(
      "rotate",
      "Give a tenant a new token (printed once); rewrites the file in kvtierctl's "
      "layout, without comments");
  a.rotate_cmd->add_option("name", a.rotate.name, "Tenant name")->required();
  a.rotate_cmd->add_option("--file", a.rotate.file, "The tenants file")->required();
  a.rotate_cmd->add_flag("--revoke-others", a.rotate.revoke_others,
                         "Drop the tenant's other tokens");
  a.rotate_cmd->add_flag("--json", a.options.json, "Print the token as JSON");
}

// Runs the `tenants` subcommand that was parsed and returns its exit code;
// nullopt when the command line named no tenants subcommand.
std::optional<int> RunTenantsCommand(const CtlArgs& a) {
  if (a.add_cmd->parsed()) {
    return kvtier::ctl::RunTenantsAdd(a.add, a.options, std::cout, std::cerr);
  }
  if (a.list_cmd->parsed()) {
    return kvtier::ctl::RunTenantsList(a.list_file, a.options, std::cout, std::cerr);
  }
  if (a.rotate_cmd->parsed()) {
    return kvtier::ctl::RunTenantsRotate(a.rotate, a.options, std::cout, std::cerr);
  }
  return std::nullopt;
}

// The socket when --socket is not given: $KVTIER_SOCKET, else deploy/run.sh's
// socket when it exists, else the packaged service's.
std::string DefaultSocket() {
  const char* env = std::getenv("KVTIER_SOCKET");
  if (env != nullptr && *env != '\0') return env;
  constexpr char kRunSh[] = "./var/kvtier/kvtierd.sock";
  return access(kRunSh, F_OK) == 0 ? kRunSh : "/run/kvtier/kvtierd.sock";
}

// Connects to the daemon named by --socket or DefaultSocket(), with the
// token from --token, --token-file or $KVTIER_TOKEN. On failure prints the
// reason to stderr and returns nullptr.
std::unique_ptr<kvtier::Client> ConnectToDaemon(const CtlArgs& a) {
  const std::string socket = a.socket.empty() ? DefaultSocket() : a.socket;
  kvtier::ClientOptions client_options;
  client_options.call_timeout = std::chrono::milliseconds(a.timeout_ms);
  auto resolved = kvtier::ctl::ResolveToken(a.token, a.token_file, std::getenv("KVTIER_TOKEN"));
  if (!resolved.ok()) {
    std::cerr << "kvtierctl: " << resolved.status().message() << "\n";
    return nullptr;
  }
  client_options.token = *resolved;
  auto client = kvtier::Client::Connect(socket, client_options);
  if (!client.ok()) {
    std::cerr << "kvtierctl: " << client.status().message() << "\n";
    return nullptr;
  }
  return std::move(*client);
}

// Runs the daemon subcommand that was parsed; 2 when none was.
int RunDaemonCommand(kvtier::Client& client, const CtlArgs& a) {
  const bool tty = isatty(STDERR_FILENO) != 0;
  if (a.status->parsed()) return kvtier::ctl::RunStatus(client, a.options, std::cout, std::cerr);
  if (a.ls->parsed()) {
    return kvtier::ctl::RunLs(client, a.options, a.ls_options, std::cout, std::cerr);
  }
  if (a.contexts->parsed()) {
    return kvtier::ctl::RunContexts(client, a.options, std::cout, std::cerr);
  }
  if (a.top->parsed()) {
    kvtier::ctl::TopOptions top = a.top_options;
    top.is_terminal = isatty(STDOUT_FILENO) != 0;
    return kvtier::ctl::RunTop(client, a.options, top, std::cout, std::cerr);
  }
  if (a.verify->parsed()) {
    kvtier::ctl::VerifyOptions verify = a.verify_options;
    verify.is_terminal = tty;
    return kvtier::ctl::RunVerify(client, a.options, verify, std::cout, std::cerr);
  }
  if (a.drain->parsed()) {
    kvtier::ctl::DrainOptions drain = a.drain_options;
    drain.is_terminal = tty;
    return kvtier::ctl::RunDrain(client, a.options, drain, std::cout, std::cerr);
  }
  if (a.profiles->parsed()) {
    return kvtier::ctl::RunProfiles(client, a.options, std::cout, std::cerr);
  }
  if (a.evict->parsed()) {
    return kvtier::ctl::RunEvict(client, a.options, a.evict_options, std::cout, std::cerr);
  }
  if (a.compact->parsed()) {
    return kvtier::ctl::RunCompact(client, a.options, a.compact_options, std::cout, std::cerr);
  }
  if (a.versions->parsed()) {
    return kvtier::ctl::RunVersions(client, a.options, a.versions_options, std::cout, std::cerr);
  }
  if (a.drop->parsed()) {
    return kvtier::ctl::RunDropVersion(client, a.options, a.drop_options, std::cout, std::cerr);
  }
  return 2;
}

// Parses the command line and runs the command; the exit code.
int Main(int argc, char** argv) {
  CLI::App app{"kvtierctl: administer a kvtierd daemon"};
  app.require_subcommand(1);
  app.fallthrough();  // global options may follow the subcommand
  CtlArgs a;
  AddGlobalOptions(app, a);
  AddStoreCommands(app, a);
  AddCompactionCommands(app, a);
  AddTenantsCommands(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help prints and exits 0; every other parse error is a usage error.
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (std::optional<int> code = RunTenantsCommand(a)) return *code;
  std::unique_ptr<kvtier::Client> client = ConnectToDaemon(a);
  if (client == nullptr) return 2;  // usage error or unreachable, as printed
  return RunDaemonCommand(*client, a);
}

}  // namespace

int main(int argc, char** argv) {
  // An exception that escapes (out of memory, a broken output stream) is
  // reported as an error, not as std::terminate's abort.
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "kvtierctl: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "kvtierctl: unknown error\n";
  }
  return 1;
}
