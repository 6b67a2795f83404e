// kvtierctl contexts / top.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ostream>
#include <sstream>
#include <thread>

#include "absl/strings/str_format.h"
#include "client/kvtierctl/commands.h"
#include "client/kvtierctl/format.h"

namespace kvtier::ctl {
namespace {

// Busiest first: most pinned blocks, then the most recently stepped.
void SortByLoad(v1::ListContextsResponse* resp) {
  std::sort(resp->mutable_contexts()->begin(), resp->mutable_contexts()->end(),
            [](const v1::ContextInfo& a, const v1::ContextInfo& b) {
              if (a.pinned_blocks() != b.pinned_blocks())
                return a.pinned_blocks() > b.pinned_blocks();
              if (a.idle_ms() != b.idle_ms()) return a.idle_ms() < b.idle_ms();
              return a.context_id() < b.context_id();
            });
}

void PrintContexts(const v1::ListContextsResponse& resp, size_t limit, std::ostream& out) {
  out << absl::StrFormat("%-18s %-16s %-10s %8s %8s %10s %10s\n", "CONTEXT", "TENANT", "PROFILE",
                         "BLOCKS", "PINNED", "LAST_STEP", "IDLE");
  size_t shown = 0;
  for (const v1::ContextInfo& c : resp.contexts()) {
    if (shown++ == limit) break;
    out << absl::StrFormat("%-18s %-16s %-10d %8d %8d %10d %10s\n",
                           absl::StrFormat("%016x", c.context_id()), c.tenant(), c.profile_id(),
                           c.num_blocks(), c.pinned_blocks(), c.last_step(),
                           absl::StrFormat("%.1fs", c.idle_ms() / 1000.0));
  }
  if (resp.contexts_size() == 0) out << "(no open contexts)\n";
}

}  // namespace

int RunContexts(Client& client, const GlobalOptions& options, std::ostream& out,
                std::ostream& err) {
  auto resp = client.ListContexts();
  if (!resp.ok()) return ReportError(resp.status(), client, err);
  SortByLoad(&*resp);
  if (options.json) return PrintJson(*resp, out, err);
  PrintContexts(*resp, resp->contexts_size(), out);
  return 0;
}

int RunTop(Client& client, const GlobalOptions& options, const TopOptions& top, std::ostream& out,
           std::ostream& err) {
  for (uint32_t i = 0; top.iterations == 0 || i < top.iterations; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(top.interval_ms));
    auto stats = client.Stats();
    if (!stats.ok()) return ReportError(stats.status(), client, err);
    auto contexts = client.ListContexts();
    if (!contexts.ok()) return ReportError(contexts.status(), client, err);
    SortByLoad(&*contexts);
    if (options.json) {
      // One JSON object per refresh (newline-delimited).
      v1::ListContextsResponse busiest;
      for (int k = 0; k < contexts->contexts_size() && k < static_cast<int>(top.limit); ++k) {
        *busiest.add_contexts() = contexts->contexts(k);
      }
      std::ostringstream s1, s2;
      if (int rc = PrintJsonCompact(*stats, s1, err); rc != 0) return rc;
      if (int rc = PrintJsonCompact(busiest, s2, err); rc != 0) return rc;
      out << "{\"refresh\":" << i << ",\"stats\":" << s1.str() << ",\"contexts\":" << s2.str()
          << "}\n";
      out.flush();
      continue;
    }
    if (top.is_terminal) out << "\x1b[H\x1b[2J";  // clear the screen between refreshes
    out << absl::StrFormat("kvtierd %s  up %s  contexts %d  leases %d  quarantined %d\n",
                           stats->version(), HumanDuration(stats->uptime_s()),
                           stats->open_contexts(), stats->active_leases(),
                           stats->quarantined_blocks());
    out << absl::StrFormat("%-7s %10s %10s %10s %8s\n", "TIER", "USED", "CAPACITY", "PINNED",
                           "BLOCKS");
    for (const v1::TierStats& t : stats->tiers()) {
      out << absl::StrFormat("%-7s %10s %10s %10s %8d\n", TierLabel(t.tier()),
                             HumanBytes(t.used_bytes()), HumanBytes(t.capacity_bytes()),
                             HumanBytes(t.pinned_bytes()), t.blocks());
    }
    out << "\n";
    PrintContexts(*contexts, top.limit, out);
    out.flush();
  }
  return 0;
}

}  // namespace kvtier::ctl
