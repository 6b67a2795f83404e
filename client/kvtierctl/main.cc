// kvtierctl: administration CLI for kvtierd.
//
//   kvtierctl status [--json]          version, uptime, tiers, configuration
//   kvtierctl stats  [--json]          same as status
//   kvtierctl ls [--profile N] [--limit N]   blocks per tier and profile
//   kvtierctl verify [--profile N]     re-read and checksum every durable block
//   kvtierctl drain                    demote everything to NVMe
//
// The daemon is found at --socket, else $KVTIER_SOCKET, else
// ./var/kvtier/kvtierd.sock (where deploy/run.sh starts it).
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "client/client.h"
#include "client/kvtierctl/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"kvtierctl: administer a kvtierd daemon"};
  app.require_subcommand(1);
  std::string socket;
  kvtier::ctl::GlobalOptions options;
  int timeout_ms = 10000;
  app.add_option("-s,--socket", socket,
                 "Daemon address: socket path or host:port "
                 "(default $KVTIER_SOCKET or ./var/kvtier/kvtierd.sock)");
  app.add_flag("--json", options.json, "Machine-readable JSON output");
  app.add_option("--timeout-ms", timeout_ms, "Deadline of each call")->check(CLI::PositiveNumber);
  CLI::App* status = app.add_subcommand("status", "Version, uptime, tiers and configuration");
  status->add_flag("--json", options.json, "Machine-readable JSON output");
  status->alias("stats");
  kvtier::ctl::LsOptions ls_options;
  CLI::App* ls = app.add_subcommand("ls", "Blocks per tier and profile");
  ls->add_option("--profile", ls_options.profile_id, "Only this profile id");
  ls->add_option("--limit", ls_options.limit, "Also list up to N blocks individually");
  ls->add_flag("--json", options.json, "Machine-readable JSON output");
  uint64_t verify_profile = 0;
  CLI::App* verify = app.add_subcommand("verify", "Re-read and checksum every durable block");
  verify->add_option("--profile", verify_profile, "Only this profile id");
  verify->add_flag("--json", options.json, "Machine-readable JSON output");
  CLI::App* drain = app.add_subcommand("drain", "Demote every block to NVMe (durable)");
  drain->add_flag("--json", options.json, "Machine-readable JSON output");
  CLI11_PARSE(app, argc, argv);

  if (socket.empty()) {
    const char* env = std::getenv("KVTIER_SOCKET");
    socket = (env != nullptr && *env != '\0') ? env : "./var/kvtier/kvtierd.sock";
  }
  kvtier::ClientOptions client_options;
  client_options.call_timeout = std::chrono::milliseconds(timeout_ms);
  auto client = kvtier::Client::Connect(socket, client_options);
  if (!client.ok()) {
    std::cerr << "kvtierctl: " << client.status().message() << "\n";
    return 2;
  }
  const bool tty = isatty(STDERR_FILENO) != 0;
  if (status->parsed()) return kvtier::ctl::RunStatus(**client, options, std::cout, std::cerr);
  if (ls->parsed()) return kvtier::ctl::RunLs(**client, options, ls_options, std::cout, std::cerr);
  if (verify->parsed()) {
    return kvtier::ctl::RunVerify(**client, options, verify_profile, tty, std::cout, std::cerr);
  }
  if (drain->parsed()) return kvtier::ctl::RunDrain(**client, options, tty, std::cout, std::cerr);
  return 2;
}
