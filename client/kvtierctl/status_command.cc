#include <cstdio>
#include <ostream>
#include <map>
#include <string>

#include "client/kvtierctl/commands.h"
#include "client/kvtierctl/format.h"

namespace kvtier::ctl {

int ReportError(const absl::Status& status, const Client& client, std::ostream& err) {
  bool unreachable = status.code() == absl::StatusCode::kUnavailable ||
                     status.code() == absl::StatusCode::kDeadlineExceeded;
  err << "kvtierctl: " << (unreachable ? "cannot reach kvtierd at " + client.target() + ": " : "")
      << absl::StatusCodeToString(status.code()) << ": " << status.message() << "\n";
  if (status.code() == absl::StatusCode::kUnauthenticated) {
    err << "kvtierctl: this daemon has tenants: give your token with --token-file, "
           "$KVTIER_TOKEN or --token\n";
  }
  return unreachable ? 3 : 1;
}

int RunStatus(Client& client, const GlobalOptions& options, std::ostream& out,
              std::ostream& err) {
  auto stats = client.Stats();
  if (!stats.ok()) return ReportError(stats.status(), client, err);
  if (options.json) return PrintJson(*stats, out, err);
  out << "kvtierd " << stats->version() << ", up " << HumanDuration(stats->uptime_s())
      << ", at " << client.target() << "\n\n";
  char line[256];
  std::snprintf(line, sizeof(line), "%-7s %-18s %12s %12s %12s %10s  %s\n", "TIER", "BACKEND",
                "CAPACITY", "USED", "PINNED", "BLOCKS", "LOCATION");
  out << line;
  for (const v1::TierStats& t : stats->tiers()) {
    std::snprintf(line, sizeof(line), "%-7s %-18s %12s %12s %12s %10llu  %s\n",
                  TierLabel(t.tier()), t.backend().c_str(), HumanBytes(t.capacity_bytes()).c_str(),
                  HumanBytes(t.used_bytes()).c_str(), HumanBytes(t.pinned_bytes()).c_str(),
                  static_cast<unsigned long long>(t.blocks()), t.location().c_str());
    out << line;
  }
  out << "\nprofiles " << stats->profiles() << ", open contexts " << stats->open_contexts()
      << ", active leases " << stats->active_leases() << ", quarantined blocks "
      << stats->quarantined_blocks() << "\n\nconfiguration:\n";
  std::map<std::string, std::string> sorted(stats->config().begin(), stats->config().end());
  for (const auto& [key, value] : sorted) out << "  " << key << " = " << value << "\n";
  return 0;
}

}  // namespace kvtier::ctl
