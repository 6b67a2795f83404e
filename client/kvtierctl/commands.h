// kvtierctl subcommands. Each returns the process exit code: 0 on success,
// 1 when the daemon answered with an error, 2 for usage errors, 3 when the
// daemon cannot be reached.
#ifndef KVTIER_CLIENT_KVTIERCTL_COMMANDS_H_
#define KVTIER_CLIENT_KVTIERCTL_COMMANDS_H_

#include <iosfwd>

#include "client/client.h"

namespace kvtier::ctl {

struct GlobalOptions {
  bool json = false;
};

// Prints version, uptime, each tier (capacity, use) and the configuration.
int RunStatus(Client& client, const GlobalOptions& options, std::ostream& out,
              std::ostream& err);

// Exit code for a failed call: 3 for UNAVAILABLE / DEADLINE_EXCEEDED (no
// daemon), else 1; prints the status to err.
int ReportError(const absl::Status& status, const Client& client, std::ostream& err);

}  // namespace kvtier::ctl

#endif  // KVTIER_CLIENT_KVTIERCTL_COMMANDS_H_
