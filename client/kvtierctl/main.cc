// kvtierctl: administration CLI for kvtierd.
//
//   kvtierctl status [--json]
//
// The daemon is found at --socket, else $KVTIER_SOCKET, else
// ./var/kvtier/kvtierd.sock (where deploy/run.sh starts it).
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
  if (status->parsed()) return kvtier::ctl::RunStatus(**client, options, std::cout, std::cerr);
  return 2;
}
