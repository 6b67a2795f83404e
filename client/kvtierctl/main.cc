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
// ./var/kvtier/kvtierd.sock (where deploy/run.sh starts it). A daemon with
// tenants (auth.tenants_file) wants a bearer token: --token, --token-file,
// else $KVTIER_TOKEN. `tenants` edits the file offline and needs neither.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "client/client.h"
#include "client/kvtierctl/commands.h"
#include "client/kvtierctl/credentials.h"

int main(int argc, char** argv) {
  CLI::App app{"kvtierctl: administer a kvtierd daemon"};
  app.require_subcommand(1);
  app.fallthrough();  // global options may follow the subcommand
  std::string socket, token, token_file;
  kvtier::ctl::GlobalOptions options;
  int timeout_ms = 10000;
  app.add_option("-s,--socket", socket,
                 "Daemon address: socket path or host:port "
                 "(default $KVTIER_SOCKET or ./var/kvtier/kvtierd.sock)");
  app.add_option("--token", token,
                 "Bearer token of your tenant (default $KVTIER_TOKEN); visible to other local "
                 "users in the process list, so prefer --token-file or the variable");
  app.add_option("--token-file", token_file, "File holding the bearer token");
  app.add_flag("--json", options.json, "Machine-readable JSON output");
  app.add_option("--timeout-ms", timeout_ms, "Deadline of each call")->check(CLI::PositiveNumber);
  CLI::App* status = app.add_subcommand("status", "Version, uptime, tiers and configuration");
  status->add_flag("--json", options.json, "Machine-readable JSON output");
  status->alias("stats");
  kvtier::ctl::LsOptions ls_options;
  CLI::App* ls = app.add_subcommand("ls", "Blocks per tier and profile");
  ls->add_option("--profile", ls_options.profile_id, "Only this profile id");
  ls->add_option("--limit", ls_options.limit, "Also list up to N blocks individually");
  ls->add_flag("--quarantined", ls_options.quarantined,
               "List quarantined blocks (whoever found them) instead; with no --limit, all");
  ls->add_option("--tier", ls_options.tier,
                 "Only blocks whose fastest copy is in this tier: device, host or nvme");
  ls->add_flag("--json", options.json, "Machine-readable JSON output");
  ls->footer(
      "Examples:\n"
      "  kvtierctl ls                          blocks and bytes per profile and tier\n"
      "  kvtierctl ls --tier nvme --limit 20   the first 20 blocks on NVMe (ids in hex)\n"
      "  kvtierctl ls --quarantined --json     every quarantined block, as JSON");
  CLI::App* contexts = app.add_subcommand("contexts", "Open contexts, busiest first");
  contexts->add_flag("--json", options.json, "Machine-readable JSON output");
  contexts->footer(
      "Columns: context id (hex), tenant, profile, blocks, blocks pinned by its\n"
      "current lease, its last Select step, time since it was last used.\n"
      "Example:\n"
      "  kvtierctl contexts --json");
  kvtier::ctl::TopOptions top_options;
  CLI::App* top = app.add_subcommand("top", "Live view of the tiers and the busiest contexts");
  top->add_option("--interval-ms", top_options.interval_ms, "Time between refreshes")
      ->check(CLI::Range(10u, 3600000u));
  top->add_option("--iterations", top_options.iterations,
                  "Refreshes before exiting (default: until interrupted)");
  top->add_option("--limit", top_options.limit, "Contexts shown")->check(CLI::Range(1u, 100000u));
  top->add_flag("--json", options.json, "One JSON object per refresh and line");
  top->footer(
      "Examples:\n"
      "  kvtierctl top                              refresh every 2 s until Ctrl-C\n"
      "  kvtierctl top --iterations 1 --limit 5     one snapshot of the 5 busiest\n"
      "  kvtierctl top --json --interval-ms 1000    newline-delimited JSON for scripts");
  uint64_t verify_profile = 0;
  CLI::App* verify = app.add_subcommand(
      "verify", "Re-read and checksum every copy of every block; list every quarantined block");
  verify->add_option("--profile", verify_profile, "Only this profile id");
  verify->add_flag("--json", options.json, "Machine-readable JSON output");
  std::string drain_tier;
  CLI::App* drain = app.add_subcommand(
      "drain", "Demote every block to NVMe (durable), or empty only the device tier");
  drain->add_option("tier", drain_tier, "device, host or nvme (default: everything to nvme)")
      ->check(CLI::IsMember({"device", "host", "nvme"}));
  drain->add_flag("--json", options.json, "Machine-readable JSON output");
  drain->footer(
      "Examples:\n"
      "  kvtierctl drain            every block durable on NVMe, memory copies dropped\n"
      "  kvtierctl drain device     unpinned device copies dropped (last copies kept in host)");
  CLI::App* profiles = app.add_subcommand("profiles", "Registered model profiles");
  profiles->add_flag("--json", options.json, "Machine-readable JSON output");
  profiles->footer(
      "Columns: id, name, revision, shape (layers/kv heads/head dim/tokens per block),\n"
      "dtype, block size, blocks and bytes stored, the tenant that registered it first.\n"
      "Example:\n"
      "  kvtierctl profiles --json");
  kvtier::ctl::EvictOptions evict_options;
  CLI::App* evict =
      app.add_subcommand("evict", "Give up blocks' copies in one tier as the cache would");
  evict->add_option("ids", evict_options.block_ids_hex, "Block ids in hex (as `ls` prints them)")
      ->required();
  evict->add_option("--profile", evict_options.profile_id, "Profile id")->required();
  evict->add_option("--tenant", evict_options.tenant, "Whose blocks (default: default)");
  evict
      ->add_option("--tier", evict_options.tier,
                   "device: drop device copies; host: drop host copies (last copies go to "
                   "NVMe first); nvme (default): the blocks leave this daemon")
      ->check(CLI::IsMember({"device", "host", "nvme"}));
  evict->add_flag("--json", options.json, "Machine-readable JSON output");
  evict->footer(
      "Pinned copies and retained blocks stay (FAILED_PRECONDITION). A remote tier's copy\n"
      "stays too.\n"
      "Examples:\n"
      "  kvtierctl evict --profile 1 --tier device 0a1b2c3d\n"
      "  kvtierctl evict --profile 1 --tenant acme 0a1b2c3d 4e5f6071 --json");

  kvtier::ctl::CompactOptions compact_options;
  CLI::App* compact = app.add_subcommand(
      "compact", "SelKV-compact a context: keep a fraction of its tokens, merge the rest");
  compact
      ->add_option("ids", compact_options.block_ids_hex,
                   "The context's block ids in hex, in token order")
      ->required();
  compact->add_option("--profile", compact_options.profile_id, "Profile id")->required();
  compact
      ->add_option("--retention", compact_options.retention,
                   "Fraction of tokens kept per layer and KV head, in (0, 1]")
      ->required();
  compact->add_option("--importance", compact_options.importance, "keydiff (default) or snapkv")
      ->check(CLI::IsMember({"keydiff", "snapkv"}));
  compact->add_option("--merge", compact_options.merge, "gated (default), uniform or none")
      ->check(CLI::IsMember({"gated", "uniform", "none"}));
  compact->add_option("--bias", compact_options.bias, "ratio (default) or none")
      ->check(CLI::IsMember({"ratio", "none"}));
  compact->add_flag("--json", options.json, "Machine-readable JSON output");
  compact->footer(
      "The compacted blocks are a new version of the context; the originals are demoted\n"
      "to NVMe and stay until `drop-version KEY 0`. snapkv needs observation queries,\n"
      "which only the API can send (docs/API.md, \"Compaction\").\n"
      "Example:\n"
      "  kvtierctl compact --profile 1 --retention 0.25 0a1b... 4e5f...");
  uint64_t versions_profile = 0;
  std::string versions_key;
  CLI::App* versions = app.add_subcommand("versions", "Versions of compacted contexts");
  versions->add_option("key", versions_key, "Context key in hex (default: every context)");
  versions->add_option("--profile", versions_profile, "Profile id")->required();
  versions->add_flag("--json", options.json, "Machine-readable JSON output");
  uint64_t drop_profile = 0;
  std::string drop_key;
  uint32_t drop_version = 0;
  CLI::App* drop = app.add_subcommand(
      "drop-version", "Delete one version of a compacted context (0 = the originals)");
  drop->add_option("key", drop_key, "Context key in hex (as `versions` prints it)")->required();
  drop->add_option("version", drop_version, "Version; 0 = the original blocks")->required();
  drop->add_option("--profile", drop_profile, "Profile id")->required();
  drop->add_flag("--json", options.json, "Machine-readable JSON output");
  drop->footer(
      "Refused while it would leave no copy of the context: the originals go only while a\n"
      "compacted version exists, and the last compacted version stays once they are gone.\n"
      "Example:\n"
      "  kvtierctl drop-version --profile 1 9f86d081884c7d659a2feaa0c55ad015 0");
  versions->footer(
      "Version 0 is the original blocks; dropped versions stay listed.\n"
      "Example:\n"
      "  kvtierctl versions --profile 1 --json");

  CLI::App* tenants = app.add_subcommand(
      "tenants", "Edit the tenants file (auth.tenants_file); the daemon applies it on SIGHUP");
  tenants->require_subcommand(1);
  kvtier::ctl::TenantAddOptions add;
  CLI::App* add_cmd = tenants->add_subcommand(
      "add", "Append a tenant with a new token (printed once; the file keeps its SHA-256)");
  add_cmd->add_option("name", add.name, "Tenant name: 1..64 bytes of [A-Za-z0-9._-]")->required();
  add_cmd->add_option("--file", add.file, "The tenants file (created 0600 if absent)")->required();
  add_cmd->add_option("--role", add.role, "data (KvTier service) or admin (both services)");
  add_cmd
      ->add_option("--quota", add.quotas,
                   "key=value, repeatable: device_bytes pinned_bytes staging_bytes "
                   "host_bytes nvme_bytes retained_bytes (sizes: 4096, 64MiB) "
                   "leases staging_slots contexts "
                   "blocks_per_context profiles (counts)")
      ->allow_extra_args(false);
  add_cmd
      ->add_option("--cert-name", add.cert_names, "mTLS client-certificate common name, repeatable")
      ->allow_extra_args(false);
  add_cmd
      ->add_option("--uid", add.uids,
                   "local user id served without a token on auth.peer_socket_path, "
                   "repeatable")
      ->allow_extra_args(false);
  add_cmd->add_flag("--json", options.json, "Print the token as JSON");
  std::string list_file;
  CLI::App* list_cmd = tenants->add_subcommand("list", "Tenants, roles, token counts, quotas");
  list_cmd->add_option("--file", list_file, "The tenants file")->required();
  list_cmd->add_flag("--json", options.json, "Machine-readable JSON output");
  std::string rotate_name, rotate_file;
  bool revoke_others = false;
  CLI::App* rotate_cmd = tenants->add_subcommand(
      "rotate",
      "Give a tenant a new token (printed once); rewrites the file in kvtierctl's "
      "layout, without comments");
  rotate_cmd->add_option("name", rotate_name, "Tenant name")->required();
  rotate_cmd->add_option("--file", rotate_file, "The tenants file")->required();
  rotate_cmd->add_flag("--revoke-others", revoke_others, "Drop the tenant's other tokens");
  rotate_cmd->add_flag("--json", options.json, "Print the token as JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help prints and exits 0; every other parse error is a usage error.
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (add_cmd->parsed()) return kvtier::ctl::RunTenantsAdd(add, options, std::cout, std::cerr);
  if (list_cmd->parsed()) {
    return kvtier::ctl::RunTenantsList(list_file, options, std::cout, std::cerr);
  }
  if (rotate_cmd->parsed()) {
    return kvtier::ctl::RunTenantsRotate(rotate_name, rotate_file, revoke_others, options,
                                         std::cout, std::cerr);
  }

  if (socket.empty()) {
    const char* env = std::getenv("KVTIER_SOCKET");
    socket = (env != nullptr && *env != '\0') ? env : "./var/kvtier/kvtierd.sock";
  }
  kvtier::ClientOptions client_options;
  client_options.call_timeout = std::chrono::milliseconds(timeout_ms);
  auto resolved = kvtier::ctl::ResolveToken(token, token_file, std::getenv("KVTIER_TOKEN"));
  if (!resolved.ok()) {
    std::cerr << "kvtierctl: " << resolved.status().message() << "\n";
    return 2;
  }
  client_options.token = *resolved;
  auto client = kvtier::Client::Connect(socket, client_options);
  if (!client.ok()) {
    std::cerr << "kvtierctl: " << client.status().message() << "\n";
    return 2;
  }
  const bool tty = isatty(STDERR_FILENO) != 0;
  if (status->parsed()) return kvtier::ctl::RunStatus(**client, options, std::cout, std::cerr);
  if (ls->parsed()) return kvtier::ctl::RunLs(**client, options, ls_options, std::cout, std::cerr);
  if (contexts->parsed()) {
    return kvtier::ctl::RunContexts(**client, options, std::cout, std::cerr);
  }
  if (top->parsed()) {
    return kvtier::ctl::RunTop(**client, options, top_options, isatty(STDOUT_FILENO) != 0,
                               std::cout, std::cerr);
  }
  if (verify->parsed()) {
    return kvtier::ctl::RunVerify(**client, options, verify_profile, tty, std::cout, std::cerr);
  }
  if (drain->parsed()) {
    return kvtier::ctl::RunDrain(**client, options, drain_tier, tty, std::cout, std::cerr);
  }
  if (profiles->parsed()) return kvtier::ctl::RunProfiles(**client, options, std::cout, std::cerr);
  if (evict->parsed()) {
    return kvtier::ctl::RunEvict(**client, options, evict_options, std::cout, std::cerr);
  }
  if (compact->parsed()) {
    return kvtier::ctl::RunCompact(**client, options, compact_options, std::cout, std::cerr);
  }
  if (versions->parsed()) {
    return kvtier::ctl::RunVersions(**client, options, versions_profile, versions_key, std::cout,
                                    std::cerr);
  }
  if (drop->parsed()) {
    return kvtier::ctl::RunDropVersion(**client, options, drop_profile, drop_key, drop_version,
                                       std::cout, std::cerr);
  }
  return 2;
}
