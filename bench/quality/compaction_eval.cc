#include "bench/quality/compaction_eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/quality/safetensors.h"
#include "index/kernels/simd.h"

namespace kvtier::quality {
namespace {

using index::Bias;
using index::CompactedHead;
using index::CompactOptions;
using index::Importance;
using index::Merge;

// StreamingLLM's attention sinks: the first tokens always kept.
constexpr int32_t kStreamingSinkTokens = 4;

CompactionMethod Method(const char* name, Importance importance, Merge merge, Bias bias,
                        ObservationQueries queries) {
  CompactionMethod m;
  m.name = name;
  m.options.importance = importance;
  m.options.merge = merge;
  m.options.bias = bias;
  m.queries = queries;
  return m;
}

// exp-weighted partial attention over n (key, value, bias) rows relative to
// its own maximum logit: softmax over a union of parts = Combine of parts.
struct Part {
  double max_logit = -std::numeric_limits<double>::infinity();
  double sum = 0;
  std::vector<double> acc;  // [D]
};

void Attend(const float* q, const float* keys, const float* values, const float* bias, size_t n,
            size_t D, double scale, std::vector<double>* logits, Part* part) {
  part->max_logit = -std::numeric_limits<double>::infinity();
  part->sum = 0;
  part->acc.assign(D, 0.0);
  if (n == 0) return;
  logits->resize(n);
  for (size_t j = 0; j < n; ++j) {
    double s = index::simd::Dot(q, keys + j * D, D) * scale;
    if (bias != nullptr) s += bias[j];
    (*logits)[j] = s;
    part->max_logit = std::max(part->max_logit, s);
  }
  for (size_t j = 0; j < n; ++j) {
    const double p = std::exp((*logits)[j] - part->max_logit);
    part->sum += p;
    const float* v = values + j * D;
    for (size_t d = 0; d < D; ++d) part->acc[d] += p * v[d];
  }
}

// ||softmax output of (a u b) - reference|| / ||reference||.
float RelativeError(const Part& a, const Part& b, const std::vector<double>& reference) {
  const double m = std::max(a.max_logit, b.max_logit);
  const double wa = a.sum > 0 ? std::exp(a.max_logit - m) : 0.0;
  const double wb = b.sum > 0 ? std::exp(b.max_logit - m) : 0.0;
  const double z = wa * a.sum + wb * b.sum;
  double err = 0, ref = 0;
  for (size_t d = 0; d < reference.size(); ++d) {
    const double o = ((a.sum > 0 ? wa * a.acc[d] : 0.0) + (b.sum > 0 ? wb * b.acc[d] : 0.0)) / z;
    err += (o - reference[d]) * (o - reference[d]);
    ref += reference[d] * reference[d];
  }
  return ref > 0 ? static_cast<float>(std::sqrt(err / ref)) : 0.0f;
}

void Output(const Part& a, const Part& b, std::vector<double>* out) {
  const double m = std::max(a.max_logit, b.max_logit);
  const double wa = a.sum > 0 ? std::exp(a.max_logit - m) : 0.0;
  const double wb = b.sum > 0 ? std::exp(b.max_logit - m) : 0.0;
  const double z = wa * a.sum + wb * b.sum;
  out->resize(a.acc.size());
  for (size_t d = 0; d < a.acc.size(); ++d) {
    (*out)[d] = ((a.sum > 0 ? wa * a.acc[d] : 0.0) + (b.sum > 0 ? wb * b.acc[d] : 0.0)) / z;
  }
}

CompactedHead Streaming(const std::vector<float>& keys, const std::vector<float>& values, int32_t T,
                        int32_t D, float rho) {
  const int32_t K = index::KeptSlots(T, rho);
  CompactedHead h;
  for (int32_t i = 0; i < T; ++i) {
    if (i < std::min(kStreamingSinkTokens, K) || i >= T - (K - kStreamingSinkTokens)) {
      h.positions.push_back(i);
    }
  }
  for (int32_t i : h.positions) {
    h.keys.insert(h.keys.end(), keys.begin() + int64_t{i} * D, keys.begin() + int64_t{i + 1} * D);
    h.values.insert(h.values.end(), values.begin() + int64_t{i} * D,
                    values.begin() + int64_t{i + 1} * D);
  }
  h.bias.assign(h.positions.size(), 0.0f);
  h.merged.assign(h.positions.size(), 0);
  return h;
}

double Quantile(const std::vector<float>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

std::string RhoLabel(double rho) { return absl::StrFormat("%g%%", 100 * rho); }

// Errors of (method, rho) over the given dumps; layer -1: every layer.
std::vector<float> Collect(const std::vector<const CompactionDumpResult*>& dumps,
                           const std::string& method, double rho, int32_t layer) {
  std::vector<float> out;
  for (const CompactionDumpResult* d : dumps) {
    for (const CompactionRun& r : d->runs) {
      if (r.method != method || r.rho != rho) continue;
      for (size_t l = 0; l < r.errors.size(); ++l) {
        if (layer >= 0 && static_cast<int32_t>(l) != layer) continue;
        out.insert(out.end(), r.errors[l].begin(), r.errors[l].end());
      }
    }
  }
  return out;
}

// (scope name, dumps) for every dump kind in name order, then "all".
std::vector<std::pair<std::string, std::vector<const CompactionDumpResult*>>> Scopes(
    const std::vector<CompactionDumpResult>& results) {
  std::set<std::string> groups;
  for (const CompactionDumpResult& r : results) groups.insert(r.group);
  std::vector<std::pair<std::string, std::vector<const CompactionDumpResult*>>> out;
  for (const std::string& g : groups) {
    out.push_back({g, {}});
    for (const CompactionDumpResult& r : results) {
      if (r.group == g) out.back().second.push_back(&r);
    }
  }
  if (groups.size() > 1) {
    out.push_back({"all", {}});
    for (const CompactionDumpResult& r : results) out.back().second.push_back(&r);
  }
  return out;
}

// Method names and rhos in run order (the first dump's).
void RunKeys(const std::vector<CompactionDumpResult>& results, std::vector<std::string>* methods,
             std::vector<double>* rhos) {
  if (results.empty()) return;
  for (const CompactionRun& r : results.front().runs) {
    if (std::find(methods->begin(), methods->end(), r.method) == methods->end()) {
      methods->push_back(r.method);
    }
    if (std::find(rhos->begin(), rhos->end(), r.rho) == rhos->end()) rhos->push_back(r.rho);
  }
}

}  // namespace

std::vector<CompactionMethod> DefaultCompactionMethods() {
  using Q = ObservationQueries;
  std::vector<CompactionMethod> m = {
      Method("selkv_keydiff", Importance::kKeyDiff, Merge::kGated, Bias::kAttentionRatio,
             Q::kWindow),
      Method("selkv_snapkv", Importance::kSnapKV, Merge::kGated, Bias::kAttentionRatio, Q::kWindow),
      Method("selkv_h2o", Importance::kH2O, Merge::kGated, Bias::kAttentionRatio, Q::kAll),
      Method("selkv_keydiff_keysonly", Importance::kKeyDiff, Merge::kGated, Bias::kAttentionRatio,
             Q::kNone),
      Method("selkv_keydiff_nobias", Importance::kKeyDiff, Merge::kGated, Bias::kNone, Q::kWindow),
      Method("selkv_snapkv_nobias", Importance::kSnapKV, Merge::kGated, Bias::kNone, Q::kWindow),
      Method("uniform_keydiff", Importance::kKeyDiff, Merge::kUniform, Bias::kAttentionRatio,
             Q::kWindow),
      Method("uniform_snapkv", Importance::kSnapKV, Merge::kUniform, Bias::kAttentionRatio,
             Q::kWindow),
      Method("uniform_keydiff_keysonly", Importance::kKeyDiff, Merge::kUniform,
             Bias::kAttentionRatio, Q::kNone),
      Method("evict_keydiff", Importance::kKeyDiff, Merge::kNone, Bias::kNone, Q::kNone),
      Method("evict_snapkv", Importance::kSnapKV, Merge::kNone, Bias::kNone, Q::kWindow),
      Method("evict_h2o", Importance::kH2O, Merge::kNone, Bias::kNone, Q::kAll),
  };
  CompactionMethod streaming;
  streaming.name = "evict_streamingllm";
  streaming.streaming = true;
  streaming.queries = Q::kNone;
  m.push_back(streaming);
  return m;
}

absl::StatusOr<CompactionDumpResult> EvaluateCompaction(const KvDump& dump,
                                                        const CompactionEvalOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t T = dump.seq_len;
  const int64_t T0 = options.prefix_tokens;
  if (T0 < 1 || T0 >= T) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefix_tokens (", T0, ") must be in [1, seq_len = ", T, ") for dump ", dump.name));
  }
  if (options.window < 1 || options.window > T0) {
    return absl::InvalidArgumentError(
        absl::StrCat("window (", options.window, ") must be in [1, prefix_tokens = ", T0, "]"));
  }
  const int32_t L = dump.num_layers, Hkv = dump.num_kv_heads, Hq = dump.num_q_heads;
  const int32_t G = dump.group_size();
  const size_t D = static_cast<size_t>(dump.head_dim);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const int64_t steps = T - T0;

  CompactionDumpResult result;
  result.dump = dump.name;
  result.group = dump.kind;
  result.num_layers = L;
  for (const CompactionMethod& m : options.methods) {
    for (double rho : options.rhos) {
      CompactionRun r;
      r.method = m.name;
      r.rho = rho;
      r.errors.assign(static_cast<size_t>(L), std::vector<float>(steps * Hq, 0.0f));
      r.kept_tokens = index::KeptSlots(static_cast<int32_t>(T0), static_cast<float>(rho));
      result.runs.push_back(std::move(r));
    }
  }

  std::vector<float> keys(T0 * D), values(T0 * D);
  std::vector<float> window_q, all_q;
  std::vector<int32_t> window_pos, all_pos;
  std::vector<CompactedHead> compacted(result.runs.size());
  std::vector<double> logits, full;
  Part prefix, suffix, slots;
  for (int32_t l = 0; l < L; ++l) {
    for (int32_t kvh = 0; kvh < Hkv; ++kvh) {
      std::copy_n(dump.K(l, kvh, 0), T0 * D, keys.begin());
      std::copy_n(dump.V(l, kvh, 0), T0 * D, values.begin());
      window_q.clear();
      window_pos.clear();
      all_q.clear();
      all_pos.clear();
      for (int32_t h = kvh * G; h < (kvh + 1) * G; ++h) {
        for (int64_t t = 0; t < T0; ++t) {
          const float* q = dump.Q(l, h, t);
          all_q.insert(all_q.end(), q, q + D);
          all_pos.push_back(static_cast<int32_t>(t));
          if (t >= T0 - options.window) {
            window_q.insert(window_q.end(), q, q + D);
            window_pos.push_back(static_cast<int32_t>(t));
          }
        }
      }
      size_t run = 0;
      for (const CompactionMethod& m : options.methods) {
        for (double rho : options.rhos) {
          if (m.streaming) {
            compacted[run++] = Streaming(keys, values, static_cast<int32_t>(T0),
                                         static_cast<int32_t>(D), static_cast<float>(rho));
            continue;
          }
          index::HeadKv head;
          head.num_tokens = static_cast<int32_t>(T0);
          head.head_dim = static_cast<int32_t>(D);
          head.keys = keys;
          head.values = values;
          if (m.queries == ObservationQueries::kWindow) {
            head.queries = window_q;
            head.query_positions = window_pos;
          } else if (m.queries == ObservationQueries::kAll) {
            head.queries = all_q;
            head.query_positions = all_pos;
          }
          CompactOptions o = m.options;
          o.rho = static_cast<float>(rho);
          absl::StatusOr<CompactedHead> c = index::CompactHead(head, o);
          if (!c.ok()) {
            return absl::Status(c.status().code(),
                                absl::StrCat(dump.name, " layer ", l, " kv head ", kvh, " ", m.name,
                                             ": ", c.status().message()));
          }
          compacted[run++] = *std::move(c);
        }
      }

      for (int32_t h = kvh * G; h < (kvh + 1) * G; ++h) {
        for (int64_t t = T0; t < T; ++t) {
          const float* q = dump.Q(l, h, t);
          Attend(q, dump.K(l, kvh, T0), dump.V(l, kvh, T0), nullptr,
                 static_cast<size_t>(t - T0 + 1), D, scale, &logits, &suffix);
          Attend(q, keys.data(), values.data(), nullptr, static_cast<size_t>(T0), D, scale, &logits,
                 &prefix);
          Output(prefix, suffix, &full);
          for (size_t r = 0; r < compacted.size(); ++r) {
            const CompactedHead& c = compacted[r];
            Attend(q, c.keys.data(), c.values.data(), c.bias.data(), c.positions.size(), D, scale,
                   &logits, &slots);
            result.runs[r].errors[static_cast<size_t>(l)][(t - T0) * Hq + h] =
                RelativeError(slots, suffix, full);
          }
        }
      }
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

ErrorSummary SummariseErrors(std::vector<float> errors) {
  ErrorSummary s;
  s.count = static_cast<int64_t>(errors.size());
  if (errors.empty()) return s;
  std::sort(errors.begin(), errors.end());
  double sum = 0;
  for (float e : errors) sum += e;
  s.mean = sum / static_cast<double>(errors.size());
  s.median = Quantile(errors, 0.5);
  s.p90 = Quantile(errors, 0.9);
  return s;
}

std::string CompactionCsv(const std::vector<CompactionDumpResult>& results) {
  std::string csv = "scope,method,rho,layer,kept_tokens,count,mean,median,p90\n";
  std::vector<std::string> methods;
  std::vector<double> rhos;
  RunKeys(results, &methods, &rhos);
  const int32_t L = results.empty() ? 0 : results.front().num_layers;
  auto rows = [&](const std::string& scope, const std::vector<const CompactionDumpResult*>& ds) {
    for (const std::string& m : methods) {
      for (double rho : rhos) {
        int64_t kept = 0;
        for (const CompactionRun& r : ds.front()->runs) {
          if (r.method == m && r.rho == rho) kept = r.kept_tokens;
        }
        for (int32_t l = -1; l < L; ++l) {
          const ErrorSummary s = SummariseErrors(Collect(ds, m, rho, l));
          absl::StrAppend(&csv, scope, ",", m, ",", rho, ",", l, ",", kept, ",", s.count, ",",
                          absl::StrFormat("%.6f,%.6f,%.6f\n", s.mean, s.median, s.p90));
        }
      }
    }
  };
  for (const CompactionDumpResult& r : results) rows(r.dump, {&r});
  for (const auto& [scope, ds] : Scopes(results)) rows(scope, ds);
  return csv;
}

std::string CompactionMarkdown(const std::vector<CompactionDumpResult>& results,
                               const CompactionEvalOptions& options, const std::string& command) {
  std::vector<std::string> methods;
  std::vector<double> rhos;
  RunKeys(results, &methods, &rhos);
  const int32_t L = results.empty() ? 0 : results.front().num_layers;
  std::string md = absl::StrCat(
      "# SelKV compaction quality\n\n`", command, "`\n\n", results.size(), " dumps; prefix [0, ",
      options.prefix_tokens, ") compacted per (layer, KV head); ", "observation window = the ",
      options.window,
      " queries before it (causal); every later query position and query head scored: ",
      "relative L2 error of the attention output (compacted prefix + exact suffix) against "
      "full attention. mean / median / p90 over queries, heads, layers and dumps.\n");
  for (const auto& [scope, ds] : Scopes(results)) {
    absl::StrAppend(&md, "\n## ", scope, " (", ds.size(), " dumps)\n\n| method |");
    for (double rho : rhos) {
      absl::StrAppend(&md, " rho ", RhoLabel(rho), " mean | median | p90 |");
    }
    absl::StrAppend(&md, "\n|---|");
    for (size_t i = 0; i < rhos.size(); ++i) absl::StrAppend(&md, "---:|---:|---:|");
    absl::StrAppend(&md, "\n");
    for (const std::string& m : methods) {
      absl::StrAppend(&md, "| ", m, " |");
      for (double rho : rhos) {
        const ErrorSummary s = SummariseErrors(Collect(ds, m, rho, -1));
        absl::StrAppend(&md, absl::StrFormat(" %.4f | %.4f | %.4f |", s.mean, s.median, s.p90));
      }
      absl::StrAppend(&md, "\n");
    }
    absl::StrAppend(&md, "\nMean error per layer:\n\n| method | rho |");
    for (int32_t l = 0; l < L; ++l) absl::StrAppend(&md, " L", l, " |");
    absl::StrAppend(&md, "\n|---|---:|");
    for (int32_t l = 0; l < L; ++l) absl::StrAppend(&md, "---:|");
    absl::StrAppend(&md, "\n");
    for (double rho : rhos) {
      for (const std::string& m : methods) {
        absl::StrAppend(&md, "| ", m, " | ", RhoLabel(rho), " |");
        for (int32_t l = 0; l < L; ++l) {
          absl::StrAppend(&md,
                          absl::StrFormat(" %.4f |", SummariseErrors(Collect(ds, m, rho, l)).mean));
        }
        absl::StrAppend(&md, "\n");
      }
    }
  }
  return md;
}

absl::Status WriteCompactionReport(const std::string& out_dir,
                                   const std::vector<CompactionDumpResult>& results,
                                   const CompactionEvalOptions& options,
                                   const std::string& command) {
  if (absl::Status s = WriteFile(out_dir + "/compaction.csv", CompactionCsv(results)); !s.ok()) {
    return s;
  }
  return WriteFile(out_dir + "/compaction.md", CompactionMarkdown(results, options, command));
}

}  // namespace kvtier::quality
