// Writes the results of the replays to a folder:
//   results.csv  one row per (group, run): every metric of metrics.h
//   claims.csv   one row per (group, layer, fraction): claims.h
//   quality.md   per group: the headline table (share of the oracle's mass
//                beyond the always-kept blocks, raw ranking, per budget),
//                detail tables, the best kvtier scorer against the best
//                published baseline, the stability and forced-block sweeps,
//                the claims per layer
// plot.py turns results.csv into PNGs.
//
// Thread safety: pure functions (file writes aside).
#ifndef KVTIER_BENCH_QUALITY_REPORT_H_
#define KVTIER_BENCH_QUALITY_REPORT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/quality/replay.h"

namespace kvtier::quality {

struct ReportOptions {
  std::vector<double> budgets;   // headline columns, ascending
  double detail_budget = 0.125;  // budget of the detail and sweep tables
  std::string command;           // the command line, quoted in quality.md
  std::string notes;             // extra lines for the header
};

// "1/16" for 0.0625, "0.3" otherwise.
std::string BudgetLabel(double fraction);

// kvtier's own scorers: key-only (anchor-based) methods and their mixes.
bool IsKvtierMethod(const std::string& method);

std::string ResultsCsv(const std::vector<const ReplayResult*>& groups);
std::string ClaimsCsv(const std::vector<const ReplayResult*>& groups);
std::string QualityMarkdown(const std::vector<const ReplayResult*>& groups,
                            const ReportOptions& options);

// Writes the three files into out_dir (which must exist).
absl::Status WriteReport(const std::string& out_dir, const std::vector<const ReplayResult*>& groups,
                         const ReportOptions& options);

}  // namespace kvtier::quality

#endif  // KVTIER_BENCH_QUALITY_REPORT_H_
