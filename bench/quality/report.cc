#include "bench/quality/report.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/quality/safetensors.h"

namespace kvtier::quality {
namespace {

bool StartsWith(const std::string& s, absl::string_view prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), std::string(prefix)) == 0;
}

std::string MethodKind(const std::string& m) {
  if (m == "oracle" || m == "oracle_head") return "reference";
  if (StartsWith(m, "mass") || m == "default") return "kvtier (calibrated)";
  if (IsKvtierMethod(m)) return "kvtier (keys)";
  if (m == "quest" || m == "arkvale" || m == "quest_head" || m == "arkvale_head" ||
      m == "meankey_head") {
    return "baseline (query)";
  }
  if (m == "h2o" || m == "snapkv") return "baseline (attention)";
  return "baseline (keys)";
}

constexpr absl::string_view kTunedSuffix = " (tuned)";

// A table row is a method ("raw" runs) or "<method> (tuned)" (its "tuned"
// run, which has no stab/stabrank twins).
const RunResult* Find(const ReplayResult& g, const std::string& row, const std::string& variant,
                      double budget, bool ahead) {
  RunSpec s;
  s.method = row;
  s.variant = variant;
  s.budget = budget;
  s.ahead = ahead;
  if (absl::EndsWith(row, kTunedSuffix)) {
    if (variant != "raw") return nullptr;
    s.method = row.substr(0, row.size() - kTunedSuffix.size());
    s.variant = "tuned";
  }
  auto it = g.runs.find(s.Key());
  return it == g.runs.end() ? nullptr : it->second.get();
}

MetricSummary Sum(const ReplayResult& g, const RunResult& r) {
  return r.metrics.Summarise(g.block_bytes);
}

std::string F3(double v) { return absl::StrFormat("%.3f", v); }

// Table rows: methods with a "raw" run, then "<method> (tuned)" rows.
std::vector<std::string> RawMethods(const ReplayResult& g, bool ahead) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& [key, r] : g.runs) {
    if (r->spec.ahead != ahead) continue;
    std::string row;
    if (r->spec.variant == "raw") {
      row = r->spec.method;
    } else if (r->spec.variant == "tuned") {
      row = absl::StrCat(r->spec.method, kTunedSuffix);
    } else {
      continue;
    }
    if (seen.insert(row).second) out.push_back(row);
  }
  return out;
}

void AppendHeadline(const ReplayResult& g, const ReportOptions& o, bool ahead, std::string* md) {
  std::vector<std::string> methods = RawMethods(g, ahead);
  auto share_at = [&](const std::string& m, const std::string& variant, double b) {
    const RunResult* r = Find(g, m, variant, b, ahead);
    return r == nullptr ? -1.0 : Sum(g, *r).share;
  };
  std::stable_sort(methods.begin(), methods.end(), [&](const std::string& a, const std::string& b) {
    return share_at(a, "raw", o.detail_budget) > share_at(b, "raw", o.detail_budget);
  });
  absl::StrAppend(md,
                  "\n#### Headline: share of the oracle's mass beyond the "
                  "always-kept blocks\n\n");
  absl::StrAppend(md,
                  "Raw ranking (no stability filter); worst = the worst "
                  "(layer, head) at ",
                  BudgetLabel(o.detail_budget), "; stab / stabrank = the same at ",
                  BudgetLabel(o.detail_budget),
                  " through the index's stability filter / the rank-based "
                  "one.\n\n| method | kind |");
  for (double b : o.budgets) absl::StrAppend(md, " ", BudgetLabel(b), " |");
  absl::StrAppend(md, " worst | stab | stabrank |\n|---|---|");
  for (size_t i = 0; i < o.budgets.size(); ++i) absl::StrAppend(md, "---:|");
  absl::StrAppend(md, "---:|---:|---:|\n");
  for (const std::string& m : methods) {
    absl::StrAppend(md, "| ", m, " | ", MethodKind(m), " |");
    for (double b : o.budgets) {
      const double s = share_at(m, "raw", b);
      absl::StrAppend(md, " ", s < 0 ? "-" : F3(s), " |");
    }
    const RunResult* r = Find(g, m, "raw", o.detail_budget, ahead);
    absl::StrAppend(md, " ", r ? F3(Sum(g, *r).share_worst) : "-", " |");
    for (const char* v : {"stab", "stabrank"}) {
      const double st = share_at(m, v, o.detail_budget);
      absl::StrAppend(md, " ", st < 0 ? "-" : F3(st), " |");
    }
    absl::StrAppend(md, "\n");
  }

  // Verdict per budget.
  absl::StrAppend(md,
                  "\nBest kvtier scorer vs the strongest published "
                  "baseline (raw ranking):\n\n");
  for (double b : o.budgets) {
    std::string best_k, best_b;
    double sk = -1, sb = -1;
    for (const std::string& m : methods) {
      const std::string kind = MethodKind(m);
      if (kind == "reference") continue;
      const double s = share_at(m, "raw", b);
      if (IsKvtierMethod(m)) {
        if (s > sk) sk = s, best_k = m;
      } else if (s > sb) {
        sb = s, best_b = m;
      }
    }
    if (best_k.empty() || best_b.empty()) continue;
    const double diff = sk - sb;
    absl::StrAppend(md, "- ", BudgetLabel(b), ": ", best_k, " ", F3(sk), " vs ", best_b, " ",
                    F3(sb), absl::StrFormat(" (%+.3f: ", diff),
                    std::fabs(diff) < 0.005 ? "a tie within 0.005"
                    : diff > 0              ? "kvtier leads"
                                            : "no kvtier scorer beats it",
                    ")\n");
  }
}

void AppendDetail(const ReplayResult& g, const ReportOptions& o, bool ahead, std::string* md) {
  absl::StrAppend(md, "\n#### All metrics at budget ", BudgetLabel(o.detail_budget),
                  "\n\nrecall = attention mass of the chosen blocks; free = without "
                  "sink/local blocks; /oracle = recall over the oracle's; overlap = "
                  "share of the oracle's free blocks chosen; rel-L2 = relative L2 error "
                  "of the attention output (mean, worst (layer, head), mean of the "
                  "worst query head per GQA group); churn = blocks loaded per step "
                  "(raw / stab / stabrank); KiB = bytes loaded per step (raw); us = "
                  "selection latency (raw).\n\n"
                  "| method | blocks | recall | worst | free | /oracle | overlap | "
                  "rel-L2 | worst | GQA worst | churn | KiB | us |\n"
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::vector<std::string> methods = RawMethods(g, ahead);
  auto share_of = [&](const std::string& m) {
    const RunResult* r = Find(g, m, "raw", o.detail_budget, ahead);
    return r == nullptr ? -1.0 : Sum(g, *r).share;
  };
  std::stable_sort(methods.begin(), methods.end(), [&](const std::string& a, const std::string& b) {
    return share_of(a) > share_of(b);
  });
  for (const std::string& m : methods) {
    const RunResult* r = Find(g, m, "raw", o.detail_budget, ahead);
    if (r == nullptr) continue;
    const MetricSummary s = Sum(g, *r);
    std::string churn = absl::StrFormat("%.2f", s.churn_blocks);
    for (const char* v : {"stab", "stabrank"}) {
      const RunResult* st = Find(g, m, v, o.detail_budget, ahead);
      absl::StrAppend(&churn, " / ",
                      st ? absl::StrFormat("%.2f", Sum(g, *st).churn_blocks) : std::string("-"));
    }
    const bool per_head = m == "oracle_head";
    absl::StrAppend(
        md, "| ", m, " | ", absl::StrFormat("%.1f", s.budget_blocks), " | ", F3(s.recall), " | ",
        F3(s.recall_worst), " | ", F3(s.recall_free), " | ", F3(s.oracle_ratio), " | ",
        per_head ? "-" : F3(s.overlap), " | ", F3(s.rel_l2), " | ", F3(s.rel_l2_worst), " | ",
        F3(s.rel_l2_gqa_worst), " | ", per_head ? std::string("-") : churn, " | ",
        per_head ? std::string("-") : absl::StrFormat("%.1f", s.bytes_per_step / 1024.0), " | ",
        per_head ? "-" : absl::StrFormat("%.1f", s.latency_us), " |\n");
  }
}

void AppendSweeps(const ReplayResult& g, bool ahead, std::string* md) {
  std::string sweep, forced;
  for (const auto& [key, r] : g.runs) {
    if (r->spec.ahead != ahead) continue;
    const MetricSummary s = Sum(g, *r);
    if (StartsWith(r->spec.variant, "sweep:")) {
      absl::StrAppend(&sweep, "| ", r->spec.method, " | ", r->spec.variant.substr(6), " | ",
                      BudgetLabel(r->spec.budget), " | ", F3(s.share), " | ", F3(s.recall), " | ",
                      absl::StrFormat("%.2f", s.churn_blocks), " |\n");
    } else if (StartsWith(r->spec.variant, "forced:")) {
      absl::StrAppend(&forced, "| ", r->spec.method, " | ", r->spec.variant.substr(7), " | ",
                      BudgetLabel(r->spec.budget), " | ", absl::StrFormat("%.1f", s.budget_blocks),
                      " | ", F3(s.recall), " | ", F3(s.recall_worst), " | ", F3(s.rel_l2), " | ",
                      F3(s.share), " |\n");
    }
  }
  if (!sweep.empty()) {
    absl::StrAppend(md,
                    "\n#### Stability filter sweep\n\nW = window (steps), w = "
                    "weight of stability in the final rank, theta = "
                    "relevance threshold on the [0,1] affinity.\n\n"
                    "| method | setting | budget | share | recall | churn |\n"
                    "|---|---|---|---:|---:|---:|\n",
                    sweep);
  }
  if (!forced.empty()) {
    absl::StrAppend(md,
                    "\n#### Sink and local blocks\n\nsink/local = "
                    "SelectorOptions sink_blocks/local_blocks (the partial "
                    "block is kept besides); recall includes the forced "
                    "blocks, so settings compare directly.\n\n"
                    "| method | setting | budget | blocks | recall | worst | "
                    "rel-L2 | share |\n"
                    "|---|---|---|---:|---:|---:|---:|---:|\n",
                    forced);
  }
}

void AppendDistance(const ReplayResult& g, std::string* md) {
  double total = 0;
  for (double m : g.distance_mass) total += m;
  if (total <= 0) return;
  absl::StrAppend(md,
                  "\n### Where attention goes\n\nShare of the attention "
                  "mass (mean over steps and query heads) by block distance "
                  "from the query's own block.\n\n|");
  for (int i = 0; i < kDistanceBuckets; ++i) {
    absl::StrAppend(md, " ", DistanceBucketName(i), " |");
  }
  absl::StrAppend(md, "\n|");
  for (int i = 0; i < kDistanceBuckets; ++i) absl::StrAppend(md, "---:|");
  absl::StrAppend(md, "\n|");
  for (int i = 0; i < kDistanceBuckets; ++i) {
    absl::StrAppend(md, " ", F3(g.distance_mass[i] / total), " |");
  }
  absl::StrAppend(md, "\n");
}

void AppendClaims(const ReplayResult& g, std::string* md) {
  if (g.claims == nullptr) return;
  const std::vector<double>& fr = g.claims->fractions();
  absl::StrAppend(md,
                  "\n### Claims per layer\n\nSamKV/CHESS: overlap of the "
                  "top-K keys by cos(anchor, k) with the top-K keys by "
                  "attention, per-head anchor / pooled anchor (chance). "
                  "KeyDiff: Spearman rho of key distinctness vs attention "
                  "received (tokens; tokens after the first block; blocks)."
                  "\n\n| layer |");
  for (double f : fr) absl::StrAppend(md, " overlap ", BudgetLabel(f), " |");
  absl::StrAppend(md, " rho | rho no sink | rho blocks |\n|---|");
  for (size_t i = 0; i < fr.size() + 3; ++i) absl::StrAppend(md, "---:|");
  absl::StrAppend(md, "\n");
  for (const auto& row : g.claims->Rows()) {
    absl::StrAppend(md, "| ", row.layer, " |");
    for (size_t f = 0; f < fr.size(); ++f) {
      absl::StrAppend(md, " ", F3(row.overlap_head[f]), " / ", F3(row.overlap_pooled[f]), " (",
                      F3(row.chance[f]), ") |");
    }
    absl::StrAppend(md, " ", F3(row.keydiff_rho), " | ", F3(row.keydiff_rho_no_sink), " | ",
                    F3(row.keydiff_rho_block), " |\n");
  }
}

}  // namespace

std::string BudgetLabel(double f) {
  const double inv = 1.0 / f;
  if (std::fabs(inv - std::round(inv)) < 1e-6) {
    return absl::StrCat("1/", static_cast<int64_t>(std::round(inv)));
  }
  return absl::StrFormat("%.3g", f);
}

bool IsKvtierMethod(const std::string& m) {
  if (StartsWith(m, "keykey") || StartsWith(m, "mass") || m == "default") return true;
  return m.find("+") != std::string::npos && m.find("keykey") != std::string::npos &&
         m.find("h2o") == std::string::npos && m.find("snapkv") == std::string::npos;
}

std::string ResultsCsv(const std::vector<const ReplayResult*>& groups) {
  std::string csv =
      "group,method,variant,budget,timing,dumps,steps,budget_blocks,share,"
      "share_worst,recall,recall_worst,recall_free,recall_free_worst,"
      "oracle_ratio,oracle_ratio_worst,overlap,rel_l2,rel_l2_worst,"
      "rel_l2_gqa_worst,churn_blocks,bytes_per_step,latency_us,e2e_steps,"
      "e2e_mismatches\n";
  for (const ReplayResult* g : groups) {
    for (const auto& [key, r] : g->runs) {
      const MetricSummary s = Sum(*g, *r);
      absl::StrAppend(
          &csv, g->group, ",", r->spec.method, ",\"", r->spec.variant, "\",",
          absl::StrFormat("%.6g", r->spec.budget), ",", r->spec.ahead ? "ahead" : "at", ",",
          g->dumps, ",", s.steps, ",",
          absl::StrFormat("%.4f,%.5f,%.5f,%.5f,%.5f,%.5f,%.5f,%.5f,%.5f,"
                          "%.5f,%.5f,%.5f,%.5f,%.4f,%.1f,%.3f",
                          s.budget_blocks, s.share, s.share_worst, s.recall, s.recall_worst,
                          s.recall_free, s.recall_free_worst, s.oracle_ratio, s.oracle_ratio_worst,
                          s.overlap, s.rel_l2, s.rel_l2_worst, s.rel_l2_gqa_worst, s.churn_blocks,
                          s.bytes_per_step, s.latency_us),
          ",", r->e2e_steps, ",", r->e2e_mismatches, "\n");
    }
  }
  return csv;
}

std::string ClaimsCsv(const std::vector<const ReplayResult*>& groups) {
  std::string csv =
      "group,layer,fraction,overlap_head,overlap_pooled,chance,keydiff_rho,"
      "keydiff_rho_no_sink,keydiff_rho_block,samples\n";
  for (const ReplayResult* g : groups) {
    if (g->claims == nullptr) continue;
    const std::vector<double>& fr = g->claims->fractions();
    for (const auto& row : g->claims->Rows()) {
      for (size_t f = 0; f < fr.size(); ++f) {
        absl::StrAppend(
            &csv, g->group, ",", row.layer, ",",
            absl::StrFormat("%.6g,%.5f,%.5f,%.5f,%.5f,%.5f,%.5f", fr[f], row.overlap_head[f],
                            row.overlap_pooled[f], row.chance[f], row.keydiff_rho,
                            row.keydiff_rho_no_sink, row.keydiff_rho_block),
            ",", row.samples, "\n");
      }
    }
  }
  return csv;
}

std::string QualityMarkdown(const std::vector<const ReplayResult*>& groups,
                            const ReportOptions& o) {
  std::string md = "# kvtier-eval results\n\n";
  if (!o.command.empty()) absl::StrAppend(&md, "Command: `", o.command, "`\n\n");
  if (!o.notes.empty()) absl::StrAppend(&md, o.notes, "\n");
  for (const ReplayResult* g : groups) {
    absl::StrAppend(&md, "\n## ", g->group, " (", g->dumps, " dumps, ", g->steps, " steps, ",
                    absl::StrFormat("%.1f", g->seconds), " s)\n");
    AppendDistance(*g, &md);
    for (bool ahead : {true, false}) {
      bool any = false;
      for (const auto& [key, r] : g->runs) any |= r->spec.ahead == ahead;
      if (!any) continue;
      absl::StrAppend(&md, "\n### ",
                      ahead ? "One step ahead (chosen at t - 1, used at t)"
                            : "At step t (chosen and used at t)",
                      "\n");
      AppendHeadline(*g, o, ahead, &md);
      AppendDetail(*g, o, ahead, &md);
      AppendSweeps(*g, ahead, &md);
    }
    AppendClaims(*g, &md);
    int64_t e2e_steps = 0, e2e_bad = 0;
    for (const auto& [key, r] : g->runs) {
      e2e_steps += r->e2e_steps;
      e2e_bad += r->e2e_mismatches;
    }
    if (e2e_steps > 0) {
      absl::StrAppend(&md, "\nEnd-to-end: ", e2e_steps, " daemon selections compared, ", e2e_bad,
                      " differed from the in-process ones.\n");
    }
  }
  return md;
}

absl::Status WriteReport(const std::string& out_dir, const std::vector<const ReplayResult*>& groups,
                         const ReportOptions& o) {
  if (absl::Status s = WriteFile(out_dir + "/results.csv", ResultsCsv(groups)); !s.ok()) {
    return s;
  }
  if (absl::Status s = WriteFile(out_dir + "/claims.csv", ClaimsCsv(groups)); !s.ok()) {
    return s;
  }
  return WriteFile(out_dir + "/quality.md", QualityMarkdown(groups, o));
}

}  // namespace kvtier::quality
