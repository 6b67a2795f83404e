#include "tests/load/report.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace kvtier::load {
namespace {

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string Codes(const std::map<int, uint64_t>& codes) {
  std::vector<std::string> parts;
  for (const auto& [code, n] : codes) parts.push_back(absl::StrCat("\"", code, "\": ", n));
  return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
}

std::vector<std::pair<const char*, uint64_t>> CounterList(const StreamCounters& c) {
  return {{"blocks_put", c.blocks_put},
          {"durable_puts", c.durable_puts},
          {"slot_puts", c.slot_puts},
          {"full_refusals", c.full_refusals},
          {"staging_full", c.staging_full},
          {"blocks_read", c.blocks_read},
          {"handles_read", c.handles_read},
          {"read_misses", c.read_misses},
          {"handles_refused", c.handles_refused},
          {"deletes", c.deletes},
          {"deletes_pinned", c.deletes_pinned},
          {"selects", c.selects},
          {"selected_resident", c.selected_resident},
          {"selected_pending", c.selected_pending},
          {"selected_absent", c.selected_absent},
          {"contexts_opened", c.contexts_opened},
          {"appends", c.appends},
          {"contexts_evicted", c.contexts_evicted},
          {"mismatches", c.mismatches},
          {"failures", c.failures}};
}

std::string SampleJson(const ResourceSample& s) {
  return absl::StrFormat(
      "{\"t_s\": %.3f, \"proc_ok\": %s, \"stats_ok\": %s, \"cpu_s\": %.2f, \"rss_bytes\": %d, "
      "\"rss_anon_bytes\": %d, \"rss_shmem_bytes\": %d, \"fds\": %d, \"threads\": %d, "
      "\"pinned_bytes\": %d, \"device_pinned_bytes\": %d, \"device_used_bytes\": %d, "
      "\"host_used_bytes\": %d, \"nvme_used_bytes\": %d, \"device_blocks\": %d, "
      "\"host_blocks\": %d, \"nvme_blocks\": %d, \"active_leases\": %d, \"open_contexts\": %d, "
      "\"staging_slots\": %d, \"evicted_blocks\": %d}",
      s.t_s, s.proc_ok ? "true" : "false", s.stats_ok ? "true" : "false", s.cpu_s, s.rss_bytes,
      s.rss_anon_bytes, s.rss_shmem_bytes, s.fds, s.threads, s.pinned_bytes, s.device_pinned_bytes,
      s.device_used_bytes, s.host_used_bytes, s.nvme_used_bytes, s.device_blocks, s.host_blocks,
      s.nvme_blocks, s.active_leases, s.open_contexts, s.staging_slots, s.evicted_blocks);
}

double MiB(double bytes) { return bytes / (1 << 20); }

}  // namespace

std::string ReportJson(LoadReport& r) {
  std::string out = "{\n  \"settings\": {";
  std::vector<std::string> parts;
  for (const auto& [k, v] : r.settings) parts.push_back(absl::StrCat(Quote(k), ": ", Quote(v)));
  absl::StrAppend(&out, absl::StrJoin(parts, ", "), "},\n");
  absl::StrAppendFormat(&out, "  \"wall_s\": %.3f,\n  \"calls\": %d,\n  \"calls_per_s\": %.1f,\n",
                        r.wall_s, r.calls, r.wall_s > 0 ? r.calls / r.wall_s : 0.0);
  parts.clear();
  for (int i = 0; i < kNumOps; ++i) {
    const Op op = static_cast<Op>(i);
    const LatencySummary s = r.ops.Summarize(op);
    if (s.count == 0 && r.ops.calls(op).empty()) continue;
    parts.push_back(absl::StrFormat(
        "    \"%s\": {\"count\": %d, \"p50_us\": %.0f, \"p99_us\": %.0f, \"max_us\": %.0f, "
        "\"mean_us\": %.1f, \"calls\": %s, \"items\": %s}",
        OpName(op), s.count, s.p50_us, s.p99_us, s.max_us, s.mean_us, Codes(r.ops.calls(op)),
        Codes(r.ops.items(op))));
  }
  absl::StrAppend(&out, "  \"ops\": {\n", absl::StrJoin(parts, ",\n"), "\n  },\n");
  parts.clear();
  for (const auto& [name, n] : CounterList(r.counters)) {
    parts.push_back(absl::StrCat("\"", name, "\": ", n));
  }
  absl::StrAppend(&out, "  \"counters\": {", absl::StrJoin(parts, ", "), "},\n");
  absl::StrAppend(&out, "  \"evicted_blocks\": ", r.evicted_blocks, ",\n  \"samples\": [\n");
  parts.clear();
  for (const ResourceSample& s : r.samples) parts.push_back("    " + SampleJson(s));
  absl::StrAppend(&out, absl::StrJoin(parts, ",\n"), "\n  ],\n");
  absl::StrAppend(&out, "  \"after\": ", SampleJson(r.after), ",\n  \"flat\": [");
  parts.clear();
  for (const FlatCheck& c : r.flat) {
    parts.push_back(absl::StrFormat(
        "{\"what\": \"%s\", \"start\": %.0f, \"end\": %.0f, \"limit\": %.0f, \"ok\": %s}", c.what,
        c.start, c.end, c.limit, c.ok ? "true" : "false"));
  }
  absl::StrAppend(&out, absl::StrJoin(parts, ", "), "],\n  \"failures\": [");
  parts.clear();
  for (const std::string& f : r.failures) parts.push_back(Quote(f));
  absl::StrAppend(&out, absl::StrJoin(parts, ", "),
                  "],\n  \"passed\": ", r.passed ? "true" : "false", "\n}\n");
  return out;
}

std::string ReportTable(LoadReport& r) {
  std::string out;
  absl::StrAppendFormat(&out, "load: %.1f s, %d calls (%.0f/s)\n", r.wall_s, r.calls,
                        r.wall_s > 0 ? r.calls / r.wall_s : 0.0);
  absl::StrAppendFormat(&out, "  %-14s %9s %9s %9s %9s  %s\n", "op", "count", "p50_ms", "p99_ms",
                        "max_ms", "codes (call | item)");
  for (int i = 0; i < kNumOps; ++i) {
    const Op op = static_cast<Op>(i);
    const LatencySummary s = r.ops.Summarize(op);
    if (s.count == 0) continue;
    absl::StrAppendFormat(&out, "  %-14s %9d %9.2f %9.2f %9.2f  %s | %s\n", OpName(op), s.count,
                          s.p50_us / 1000, s.p99_us / 1000, s.max_us / 1000, Codes(r.ops.calls(op)),
                          Codes(r.ops.items(op)));
  }
  std::vector<std::string> parts;
  for (const auto& [name, n] : CounterList(r.counters)) parts.push_back(absl::StrCat(name, "=", n));
  absl::StrAppend(&out, "  counters: ", absl::StrJoin(parts, " "), "\n");
  absl::StrAppend(&out, "  evicted_blocks during the run: ", r.evicted_blocks, "\n");
  if (!r.samples.empty()) {
    const ResourceSample& a = r.samples.front();
    const ResourceSample& b = r.samples.back();
    absl::StrAppendFormat(&out,
                          "  samples %d: rss %.1f -> %.1f MiB (anon %.1f -> %.1f), fds %d -> %d, "
                          "threads %d -> %d, pinned %.2f -> %.2f MiB, daemon cpu %.1f s\n",
                          r.samples.size(), MiB(a.rss_bytes), MiB(b.rss_bytes),
                          MiB(a.rss_anon_bytes), MiB(b.rss_anon_bytes), a.fds, b.fds, a.threads,
                          b.threads, MiB(a.pinned_bytes), MiB(b.pinned_bytes), b.cpu_s - a.cpu_s);
  }
  absl::StrAppendFormat(&out,
                        "  after the run: pinned %d B, leases %d, contexts %d, staging slots %d, "
                        "rss %.1f MiB, fds %d\n",
                        r.after.pinned_bytes, r.after.active_leases, r.after.open_contexts,
                        r.after.staging_slots, MiB(r.after.rss_bytes), r.after.fds);
  for (const FlatCheck& c : r.flat) {
    absl::StrAppendFormat(&out, "  flat %-20s start %.0f end %.0f limit %.0f %s\n", c.what, c.start,
                          c.end, c.limit, c.ok ? "ok" : "GREW");
  }
  for (const std::string& f : r.failures) absl::StrAppend(&out, "  failure: ", f, "\n");
  return out;
}

}  // namespace kvtier::load
