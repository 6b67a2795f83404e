#include <cstdio>
#include <map>
#include <ostream>
#include <string>

#include "absl/strings/str_join.h"
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

namespace {

// One row per tenant: what it holds now; then the quotas that are set.
void PrintTenants(const v1::StatsResponse& stats, std::ostream& out) {
  if (stats.tenants().empty()) return;
  char line[256];
  std::snprintf(line, sizeof(line), "\n%-20s %-5s %10s %10s %10s %10s %6s %6s %6s\n", "TENANT",
                "ROLE", "ARENA", "PINNED", "HOST", "NVME", "SLOTS", "LEASES", "CTXS");
  out << line;
  for (const v1::TenantStats& t : stats.tenants()) {
    std::snprintf(
        line, sizeof(line), "%-20s %-5s %10s %10s %10s %10s %6llu %6llu %6llu\n", t.name().c_str(),
        t.role().c_str(), HumanBytes(t.arena_bytes()).c_str(), HumanBytes(t.pinned_bytes()).c_str(),
        HumanBytes(t.host_bytes()).c_str(), HumanBytes(t.nvme_bytes()).c_str(),
        static_cast<unsigned long long>(t.staging_slots()),
        static_cast<unsigned long long>(t.leases()), static_cast<unsigned long long>(t.contexts()));
    out << line;
  }
  for (const v1::TenantStats& t : stats.tenants()) {
    if (t.quotas().empty()) continue;
    std::map<std::string, uint64_t> sorted(t.quotas().begin(), t.quotas().end());
    out << "  quotas of " << t.name() << ":";
    for (const auto& [key, value] : sorted) {
      const bool bytes = key.size() > 6 && key.compare(key.size() - 6, 6, "_bytes") == 0;
      out << " " << key << "=" << (bytes ? HumanBytes(value) : std::to_string(value));
    }
    out << "\n";
  }
}

}  // namespace

int RunStatus(Client& client, const GlobalOptions& options, std::ostream& out, std::ostream& err) {
  auto stats = client.Stats();
  if (!stats.ok()) return ReportError(stats.status(), client, err);
  if (options.json) return PrintJson(*stats, out, err);
  out << "kvtierd " << stats->version() << ", up " << HumanDuration(stats->uptime_s()) << ", at "
      << client.target() << "\n\n";
  char line[256];
  std::snprintf(line, sizeof(line), "%-7s %-18s %12s %12s %12s %10s  %s\n", "TIER", "BACKEND",
                "CAPACITY", "USED", "PINNED", "BLOCKS", "LOCATION");
  out << line;
  for (const v1::TierStats& t : stats->tiers()) {
    std::snprintf(line, sizeof(line), "%-7s %-18s %12s %12s %12s %10llu  %s\n", TierLabel(t.tier()),
                  t.backend().c_str(), HumanBytes(t.capacity_bytes()).c_str(),
                  HumanBytes(t.used_bytes()).c_str(), HumanBytes(t.pinned_bytes()).c_str(),
                  static_cast<unsigned long long>(t.blocks()), t.location().c_str());
    out << line;
  }
  for (const v1::TierStats& t : stats->tiers()) {
    if (t.prefault_target_bytes() == 0) continue;
    out << "prefaulted " << TierLabel(t.tier()) << ": " << HumanBytes(t.prefaulted_bytes())
        << " of " << HumanBytes(t.prefault_target_bytes());
    if (t.prefault_failed_bytes() != 0) {
      out << " (" << HumanBytes(t.prefault_failed_bytes())
          << " left to first use after: " << t.prefault_error() << ")";
    }
    out << "\n";
  }
  uint64_t releasing = 0;
  for (const v1::TierStats& t : stats->tiers()) releasing += t.releasing_bytes();
  out << "\nprofiles " << stats->profiles() << ", open contexts " << stats->open_contexts()
      << ", active leases " << stats->active_leases() << ", staging slots "
      << stats->staging_slots() << ", quarantined blocks " << stats->quarantined_blocks() << "\n"
      << "evicted blocks " << stats->evicted_blocks() << " (" << HumanBytes(releasing)
      << " on NVMe until their removal is synced), retained " << HumanBytes(stats->retained_bytes())
      << ", checksum failures device/host/nvme " << stats->checksum_failures_device() << "/"
      << stats->checksum_failures_host() << "/" << stats->checksum_failures_nvme() << "\n";
  if (stats->has_remote()) {
    const v1::RemoteTierStats& r = stats->remote();
    out << "remote tier: " << r.masters_size() << " masters (" << absl::StrJoin(r.masters(), ", ")
        << "); lookups hit/miss/unavailable/corrupt " << r.hits() << "/" << r.misses() << "/"
        << r.unavailable() << "/" << r.corrupt() << ", read " << HumanBytes(r.bytes_read())
        << "; published " << r.published() << " (" << HumanBytes(r.bytes_written()) << "), queued "
        << r.publish_queued() << ", dropped " << r.publish_dropped() << ", failed "
        << r.publish_failed() << ", cancelled by deletes " << r.publish_cancelled() << " (policy "
        << r.publish_policy() << ", write-back buffer " << HumanBytes(r.writeback_buffered_bytes())
        << ")\n";
  }
  PrintTenants(*stats, out);
  out << "\nconfiguration:\n";
  std::map<std::string, std::string> sorted(stats->config().begin(), stats->config().end());
  for (const auto& [key, value] : sorted) out << "  " << key << " = " << value << "\n";
  return 0;
}

}  // namespace kvtier::ctl
