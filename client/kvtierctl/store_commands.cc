// kvtierctl ls / verify / drain.
#include <cstdio>
#include <ostream>

#include "absl/strings/escaping.h"
#include "client/kvtierctl/commands.h"
#include "client/kvtierctl/format.h"
#include "client/kvtierctl/progress.h"

namespace kvtier::ctl {

namespace {

void PrintQuarantined(const google::protobuf::RepeatedPtrField<v1::BlockInfo>& blocks,
                      std::ostream& out) {
  char line[512];
  std::snprintf(line, sizeof(line), "%-66s %-16s %-10s %-7s %-28s %s\n", "BLOCK_ID", "TENANT",
                "PROFILE", "TIER", "LOCATION", "REASON");
  out << line;
  for (const v1::BlockInfo& b : blocks) {
    std::snprintf(line, sizeof(line), "%-66s %-16s %-10llu %-7s %-28s %s\n",
                  absl::BytesToHexString(b.block_id()).c_str(), b.tenant().c_str(),
                  static_cast<unsigned long long>(b.profile_id()), TierLabel(b.tier()),
                  b.quarantine_location().empty() ? "-" : b.quarantine_location().c_str(),
                  b.quarantine_reason().c_str());
    out << line;
  }
}

}  // namespace

int RunLs(Client& client, const GlobalOptions& options, const LsOptions& ls, std::ostream& out,
          std::ostream& err) {
  v1::ListBlocksRequest req;
  req.set_profile_id(ls.profile_id);
  req.set_quarantined(ls.quarantined);
  if (!ls.tier.empty()) {
    const v1::Tier tier = ls.tier == "device" ? v1::TIER_DEVICE
                          : ls.tier == "host" ? v1::TIER_HOST
                          : ls.tier == "nvme" ? v1::TIER_NVME
                                              : v1::TIER_UNSPECIFIED;
    if (tier == v1::TIER_UNSPECIFIED) {
      err << "kvtierctl: --tier: \"" << ls.tier << "\" is not device, host or nvme\n";
      return 2;
    }
    req.set_tier(tier);
  }
  req.set_limit(ls.quarantined && ls.limit == 0 ? UINT32_MAX : ls.limit);
  auto listed = client.ListBlocks(req);
  if (!listed.ok()) return ReportError(listed.status(), client, err);
  const v1::ListBlocksResponse& resp = *listed;
  if (options.json) return PrintJson(resp, out, err);
  if (ls.quarantined) {
    if (resp.blocks_size() == 0) {
      out << "(no quarantined blocks)\n";
      return 0;
    }
    PrintQuarantined(resp.blocks(), out);
    return 0;
  }
  char line[200];
  std::snprintf(line, sizeof(line), "%-10s %-7s %10s %12s\n", "PROFILE", "TIER", "BLOCKS", "BYTES");
  out << line;
  for (const v1::TierProfileCount& c : resp.counts()) {
    std::snprintf(line, sizeof(line), "%-10llu %-7s %10llu %12s\n",
                  static_cast<unsigned long long>(c.profile_id()), TierLabel(c.tier()),
                  static_cast<unsigned long long>(c.blocks()), HumanBytes(c.bytes()).c_str());
    out << line;
  }
  if (resp.counts_size() == 0) out << "(no blocks)\n";
  if (resp.blocks_size() > 0) {
    out << "\n";
    std::snprintf(line, sizeof(line), "%-66s %-10s %-7s %10s %-8s %-7s %s\n", "BLOCK_ID", "PROFILE",
                  "TIER", "SIZE", "DURABLE", "PINNED", "RETAINED");
    out << line;
    for (const v1::BlockInfo& b : resp.blocks()) {
      std::snprintf(line, sizeof(line), "%-66s %-10llu %-7s %10s %-8s %-7s %s\n",
                    absl::BytesToHexString(b.block_id()).c_str(),
                    static_cast<unsigned long long>(b.profile_id()), TierLabel(b.tier()),
                    HumanBytes(b.size_bytes()).c_str(), b.durable() ? "yes" : "no",
                    b.pinned() ? "yes" : "no", b.retained() ? "yes" : "no");
      out << line;
    }
  }
  return 0;
}

int RunVerify(Client& client, const GlobalOptions& options, const VerifyOptions& verify,
              std::ostream& out, std::ostream& err) {
  v1::VerifyRequest req;
  req.set_profile_id(verify.profile_id);
  ProgressBar bar(err, verify.is_terminal, "blocks");
  uint64_t corrupt = 0;
  std::vector<std::string> corrupt_ids;
  // No deadline: verification takes as long as it takes.
  auto verified = client.Verify(req, [&](const v1::VerifyProgress& progress) {
    corrupt = progress.corrupt_blocks();
    for (const auto& id : progress.corrupt_block_ids()) corrupt_ids.push_back(id);
    if (!options.json) {
      bar.Update(progress.blocks_checked(), progress.blocks_total(),
                 corrupt ? std::to_string(corrupt) + " corrupt" : "");
    }
  });
  bar.Finish();
  if (!verified.ok()) return ReportError(verified.status(), client, err);
  v1::VerifyProgress& last = *verified;
  last.clear_corrupt_block_ids();
  for (const auto& id : corrupt_ids) last.add_corrupt_block_ids(id);
  const int rc = last.quarantined_size() > 0 ? 4 : 0;
  if (options.json) {
    int json_rc = PrintJson(last, out, err);
    return json_rc != 0 ? json_rc : rc;
  }
  out << "verified " << last.blocks_checked() << " blocks (every copy): " << corrupt
      << " corrupt found by this run; " << last.quarantined_size() << " quarantined in all\n";
  if (last.quarantined_size() > 0) PrintQuarantined(last.quarantined(), out);
  return rc;
}

int RunDrain(Client& client, const GlobalOptions& options, const DrainOptions& drain,
             std::ostream& out, std::ostream& err) {
  const std::string& tier = drain.tier;
  v1::DrainRequest req;
  if (tier == "device") {
    req.set_tier(v1::TIER_DEVICE);
  } else if (!tier.empty() && tier != "host" && tier != "nvme") {
    err << "kvtierctl: drain: \"" << tier << "\" is not device, host or nvme\n";
    return 2;
  }
  ProgressBar bar(err, drain.is_terminal, "blocks");
  auto drained = client.Drain(req, [&](const v1::DrainProgress& progress) {
    if (!options.json) bar.Update(progress.blocks_done(), progress.blocks_total());
  });
  bar.Finish();
  if (!drained.ok()) return ReportError(drained.status(), client, err);
  const v1::DrainProgress& last = *drained;
  if (options.json) return PrintJson(last, out, err);
  out << "drained " << last.blocks_done()
      << (req.tier() == v1::TIER_DEVICE ? " blocks out of the device tier\n" : " blocks to nvme\n");
  return 0;
}

}  // namespace kvtier::ctl
