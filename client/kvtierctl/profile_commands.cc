// kvtierctl profiles and evict.
#include <cctype>
#include <chrono>
#include <cstdio>
#include <ostream>
#include <string>

#include "absl/strings/escaping.h"
#include "client/kvtierctl/commands.h"
#include "client/kvtierctl/format.h"

namespace kvtier::ctl {
namespace {

const char* DtypeLabel(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FP16:
      return "fp16";
    case v1::DTYPE_BF16:
      return "bf16";
    case v1::DTYPE_FP32:
      return "fp32";
    default:
      return "?";
  }
}

// One cell for a profile's selection calibration: "-" when uncalibrated,
// else its retrieval heads, kept blocks ("sink" a count, or "~" when the
// first block competes with its own mass; "select" = the daemon's
// select.* keys) and the step-to-step terms that are on.
std::string CalibrationLabel(const v1::SelectionCalibration& c) {
  if (c.num_q_heads() == 0) return "-";
  auto kept = [](bool has, uint32_t v) { return has ? std::to_string(v) : std::string("select"); };
  std::string out = "heads=" + std::to_string(c.retrieval_heads_size()) + " sink=" +
                    (c.has_sink_mass() && c.has_sink_blocks() && c.sink_blocks() == 0
                         ? std::string("~")
                         : kept(c.has_sink_blocks(), c.sink_blocks())) +
                    " local=" + kept(c.has_local_blocks(), c.local_blocks());
  char buf[64];
  std::snprintf(buf, sizeof(buf), " gate=%.2f", c.head_min_mass());
  out += buf;
  if (c.has_retrieval_share() && c.retrieval_share() < 1) {
    std::snprintf(buf, sizeof(buf), " share=%.2f", c.retrieval_share());
    out += buf;
  }
  if (c.has_copy_run() && c.copy_run() > 0) {
    std::snprintf(buf, sizeof(buf), " copy=%u/%u", c.copy_run(),
                  c.has_copy_hold() ? c.copy_hold() : 64u);
    out += buf;
  }
  return out;
}

bool IsHex(const std::string& s) {
  if (s.empty() || s.size() % 2 != 0) return false;
  for (char c : s) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

int RunProfiles(Client& client, const GlobalOptions& options, std::ostream& out,
                std::ostream& err) {
  auto listed = client.ListProfiles();
  if (!listed.ok()) return ReportError(listed.status(), client, err);
  const v1::ListProfilesResponse& resp = *listed;
  if (options.json) return PrintJson(resp, out, err);
  char line[512];
  std::snprintf(line, sizeof(line), "%4s %-24s %-10s %-22s %5s %10s %10s %10s  %-8s %s\n", "ID",
                "NAME", "REVISION", "SHAPE L/H/D/T", "DTYPE", "BLOCK", "BLOCKS", "BYTES", "OWNER",
                "SELECTION");
  out << line;
  for (const v1::ProfileInfo& p : resp.profiles()) {
    const v1::ModelProfile& m = p.profile();
    const std::string shape =
        std::to_string(m.num_layers()) + "/" + std::to_string(m.num_kv_heads()) + "/" +
        std::to_string(m.head_dim()) + "/" + std::to_string(m.block_size_tokens());
    std::snprintf(line, sizeof(line), "%4llu %-24s %-10s %-22s %5s %10s %10llu %10s  %-8s %s\n",
                  static_cast<unsigned long long>(p.profile_id()), m.name().c_str(),
                  m.revision().c_str(), shape.c_str(), DtypeLabel(m.dtype()),
                  HumanBytes(p.block_size_bytes()).c_str(),
                  static_cast<unsigned long long>(p.blocks()), HumanBytes(p.bytes()).c_str(),
                  p.owner().c_str(), CalibrationLabel(m.calibration()).c_str());
    out << line;
  }
  if (resp.profiles().empty()) out << "(no profiles registered)\n";
  return 0;
}

int RunEvict(Client& client, const GlobalOptions& options, const EvictOptions& evict,
             std::ostream& out, std::ostream& err) {
  v1::EvictRequest req;
  req.set_tenant(evict.tenant);
  req.set_profile_id(evict.profile_id);
  if (evict.tier == "device") {
    req.set_tier(v1::TIER_DEVICE);
  } else if (evict.tier == "host") {
    req.set_tier(v1::TIER_HOST);
  } else if (evict.tier == "nvme" || evict.tier.empty()) {
    req.set_tier(v1::TIER_NVME);
  } else {
    err << "kvtierctl: --tier: \"" << evict.tier << "\" is not device, host or nvme\n";
    return 2;
  }
  for (const std::string& id : evict.block_ids_hex) {
    if (!IsHex(id)) {
      err << "kvtierctl: block id \"" << id << "\" is not hex (as `kvtierctl ls` prints ids)\n";
      return 2;
    }
    req.add_block_ids(absl::HexStringToBytes(id));
  }
  auto evicted = client.Evict(req);
  if (!evicted.ok()) return ReportError(evicted.status(), client, err);
  const v1::EvictResponse& resp = *evicted;
  int failed = 0;
  for (const v1::ItemStatus& s : resp.statuses()) failed += s.code() != 0;
  if (options.json) {
    const int rc = PrintJson(resp, out, err);
    return rc != 0 ? rc : (failed > 0 ? 1 : 0);
  }
  for (int i = 0; i < resp.statuses_size(); ++i) {
    const v1::ItemStatus& s = resp.statuses(i);
    out << evict.block_ids_hex[i] << ": "
        << (s.code() == 0 ? "evicted"
                          : absl::StatusCodeToString(static_cast<absl::StatusCode>(s.code())) +
                                ": " + s.message())
        << "\n";
  }
  return failed > 0 ? 1 : 0;
}

}  // namespace kvtier::ctl
