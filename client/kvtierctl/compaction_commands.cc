// kvtierctl compact, versions and drop-version (SelKV compaction).
#include <chrono>
#include <cstdio>
#include <ostream>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "client/kvtierctl/commands.h"
#include "client/kvtierctl/format.h"

namespace kvtier::ctl {
namespace {

bool IsHexId(const std::string& s) {
  if (s.empty() || s.size() % 2 != 0) return false;
  for (char c : s) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

const char* ImportanceLabel(v1::CompactImportance i) {
  switch (i) {
    case v1::COMPACT_IMPORTANCE_KEYDIFF:
      return "keydiff";
    case v1::COMPACT_IMPORTANCE_SNAPKV:
      return "snapkv";
    default:
      return "-";
  }
}
const char* MergeLabel(v1::CompactMerge m) {
  switch (m) {
    case v1::COMPACT_MERGE_GATED:
      return "gated";
    case v1::COMPACT_MERGE_UNIFORM:
      return "uniform";
    case v1::COMPACT_MERGE_NONE:
      return "none";
    default:
      return "-";
  }
}
const char* BiasLabel(v1::CompactBias b) {
  switch (b) {
    case v1::COMPACT_BIAS_ATTENTION_RATIO:
      return "ratio";
    case v1::COMPACT_BIAS_NONE:
      return "none";
    default:
      return "-";
  }
}

void PrintVersionRow(const v1::ContextVersion& v, std::ostream& out) {
  char line[512];
  const std::string key = absl::BytesToHexString(v.context_key());
  if (v.version() == 0) {
    std::snprintf(line, sizeof(line), "%-32s %3u  originals  %8u tokens  %6d blocks  %s\n",
                  key.c_str(), v.version(), v.tokens(), v.block_ids_size(),
                  v.dropped() ? "dropped" : "stored");
  } else {
    std::snprintf(line, sizeof(line), "%-32s %3u  rho %.3f  %8u slots  %6d blocks  %s/%s/%s\n",
                  key.c_str(), v.version(), v.retention(), v.tokens(), v.block_ids_size(),
                  ImportanceLabel(v.importance()), MergeLabel(v.merge()), BiasLabel(v.bias()));
  }
  out << line;
}

}  // namespace

int RunCompact(Client& client, const GlobalOptions& options, const CompactOptions& compact,
               std::ostream& out, std::ostream& err) {
  if (!(compact.retention > 0.0 && compact.retention <= 1.0)) {
    err << "kvtierctl: --retention: " << compact.retention << " is outside (0, 1]\n";
    return 2;
  }
  v1::CompactContextRequest req;
  req.set_retention(static_cast<float>(compact.retention));
  if (compact.importance == "keydiff") req.set_importance(v1::COMPACT_IMPORTANCE_KEYDIFF);
  if (compact.importance == "snapkv") req.set_importance(v1::COMPACT_IMPORTANCE_SNAPKV);
  if (compact.merge == "gated") req.set_merge(v1::COMPACT_MERGE_GATED);
  if (compact.merge == "uniform") req.set_merge(v1::COMPACT_MERGE_UNIFORM);
  if (compact.merge == "none") req.set_merge(v1::COMPACT_MERGE_NONE);
  if (compact.bias == "ratio") req.set_bias(v1::COMPACT_BIAS_ATTENTION_RATIO);
  if (compact.bias == "none") req.set_bias(v1::COMPACT_BIAS_NONE);
  v1::OpenContextRequest open;
  open.set_profile_id(compact.profile_id);
  v1::Segment* segment = open.add_segments();
  for (const std::string& id : compact.block_ids_hex) {
    if (!IsHexId(id)) {
      err << "kvtierctl: block id \"" << id << "\" is not hex (as `kvtierctl ls` prints ids)\n";
      return 2;
    }
    segment->add_block_ids(absl::HexStringToBytes(id));
  }
  err << "opening a context of " << compact.block_ids_hex.size() << " blocks...\n";
  auto opened = client.OpenContext(open);
  if (!opened.ok()) return ReportError(opened.status(), client, err);
  req.set_context_id(opened->context_id());
  err << "compacting to " << compact.retention << " of its tokens...\n";
  const auto started = std::chrono::steady_clock::now();
  auto compacted = client.CompactContext(req);
  // Best effort: the context's lease closes it anyway.
  client.CloseContext(opened->context_id()).IgnoreError();
  if (!compacted.ok()) return ReportError(compacted.status(), client, err);
  const v1::CompactContextResponse& resp = *compacted;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  err << (resp.existed() ? "already stored" : "done") << " in " << seconds << " s\n";
  if (options.json) return PrintJson(resp, out, err);
  out << "context key " << absl::BytesToHexString(resp.context_key()) << "\n";
  PrintVersionRow(resp.version(), out);
  for (const std::string& id : resp.version().block_ids()) {
    out << "  " << absl::BytesToHexString(id) << "\n";
  }
  return 0;
}

int RunVersions(Client& client, const GlobalOptions& options, const VersionsOptions& versions,
                std::ostream& out, std::ostream& err) {
  const uint64_t profile_id = versions.profile_id;
  const std::string& context_key_hex = versions.context_key_hex;
  if (!context_key_hex.empty() && !IsHexId(context_key_hex)) {
    err << "kvtierctl: context key \"" << context_key_hex << "\" is not hex\n";
    return 2;
  }
  v1::ListContextVersionsRequest req;
  req.set_profile_id(profile_id);
  req.set_context_key(absl::HexStringToBytes(context_key_hex));
  auto listed = client.ListContextVersions(req);
  if (!listed.ok()) return ReportError(listed.status(), client, err);
  const v1::ListContextVersionsResponse& resp = *listed;
  if (options.json) return PrintJson(resp, out, err);
  for (const v1::ContextVersion& v : resp.versions()) PrintVersionRow(v, out);
  if (resp.versions().empty()) out << "(no compacted contexts in profile " << profile_id << ")\n";
  return 0;
}

int RunDropVersion(Client& client, const GlobalOptions& options, const DropVersionOptions& drop,
                   std::ostream& out, std::ostream& err) {
  const uint64_t profile_id = drop.profile_id;
  const std::string& context_key_hex = drop.context_key_hex;
  const uint32_t version = drop.version;
  if (!IsHexId(context_key_hex)) {
    err << "kvtierctl: context key \"" << context_key_hex << "\" is not hex\n";
    return 2;
  }
  v1::DropContextVersionRequest req;
  req.set_profile_id(profile_id);
  req.set_context_key(absl::HexStringToBytes(context_key_hex));
  req.set_version(version);
  auto dropped = client.DropContextVersion(req);
  if (!dropped.ok()) return ReportError(dropped.status(), client, err);
  const v1::DropContextVersionResponse& resp = *dropped;
  if (options.json) return PrintJson(resp, out, err);
  out << "version " << version << ": " << resp.blocks_deleted() << " blocks deleted\n";
  return 0;
}

}  // namespace kvtier::ctl
