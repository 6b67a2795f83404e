#include "daemon/metrics/registry.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvtier::daemon::metrics {
namespace {

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::abs(v) < 1e15) return absl::StrFormat("%.0f", v);
  return absl::StrFormat("%.9g", v);
}

// Backslash and newline escaped; quotes too in label values (not in HELP).
std::string Escape(const std::string& v, bool quotes) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quotes && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

void AppendLabels(const Labels& labels, std::string* out) {
  if (labels.empty()) return;
  out->push_back('{');
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i > 0) out->push_back(',');
    absl::StrAppend(out, labels[i].first, "=\"", EscapeLabelValue(labels[i].second), "\"");
  }
  out->push_back('}');
}

Labels Zip(const std::vector<std::string>& names, const std::vector<std::string>& values) {
  Labels labels;
  for (size_t i = 0; i < names.size(); ++i) labels.emplace_back(names[i], values[i]);
  return labels;
}

void AppendHeader(const std::string& name, const std::string& help, const char* type,
                  std::string* out) {
  absl::StrAppend(out, "# HELP ", name, " ", Escape(help, /*quotes=*/false), "\n# TYPE ", name, " ",
                  type, "\n");
}

}  // namespace

bool ValidMetricName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
                    (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

bool ValidLabelName(const std::string& name) {
  if (name.empty() || name.rfind("__", 0) == 0) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                    (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

std::string EscapeLabelValue(const std::string& v) { return Escape(v, /*quotes=*/true); }

std::vector<double> LatencyBuckets() {
  std::vector<double> b;
  for (double decade = 1e-5; decade < 10; decade *= 10) {
    for (double m : {1.0, 2.5, 5.0}) b.push_back(m * decade);
  }
  b.push_back(10);
  return b;
}

Histogram::Histogram(const std::vector<double>* bounds)
    : bounds_(bounds), buckets_(new std::atomic<uint64_t>[bounds->size() + 1]) {
  for (size_t i = 0; i <= bounds_->size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double v) {
  const size_t i =
      static_cast<size_t>(std::lower_bound(bounds_->begin(), bounds_->end(), v) - bounds_->begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.Add(v);
}

void Histogram::Snapshot(std::vector<uint64_t>* cumulative, double* sum, uint64_t* count) const {
  cumulative->resize(bounds_->size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_->size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    (*cumulative)[i] = total;
  }
  *sum = sum_.value();
  *count = total;
}

void Writer::Gauge(const std::string& name, const std::string& help, const Labels& labels,
                   double v) {
  Add(name, "gauge", help, labels, v);
}

void Writer::Counter(const std::string& name, const std::string& help, const Labels& labels,
                     double v) {
  Add(name, "counter", help, labels, v);
}

void Writer::Add(const std::string& name, const char* type, const std::string& help,
                 const Labels& labels, double v) {
  Series& s = series_[name];
  if (s.type.empty()) {
    s.type = type;
    s.help = help;
  }
  s.samples.emplace_back(labels, v);
}

bool Registry::ClaimLocked(const std::string& name, const std::vector<std::string>& label_names) {
  mu_.AssertHeld();
  if (!ValidMetricName(name) || counters_.count(name) || histograms_.count(name)) return false;
  std::set<std::string> seen;
  for (const std::string& l : label_names) {
    if (!ValidLabelName(l) || l == "le" || !seen.insert(l).second) return false;
  }
  return true;
}

CounterFamily* Registry::AddCounter(const std::string& name, const std::string& help,
                                    std::vector<std::string> label_names) {
  absl::MutexLock lock(&mu_);
  if (!ClaimLocked(name, label_names)) return nullptr;
  CounterEntry& e = counters_[name];
  e.help = help;
  e.family.reset(new CounterFamily(std::move(label_names)));
  return e.family.get();
}

HistogramFamily* Registry::AddHistogram(const std::string& name, const std::string& help,
                                        std::vector<std::string> label_names,
                                        std::vector<double> bounds) {
  if (bounds.empty() || !std::is_sorted(bounds.begin(), bounds.end()) ||
      std::adjacent_find(bounds.begin(), bounds.end()) != bounds.end()) {
    return nullptr;
  }
  absl::MutexLock lock(&mu_);
  if (!ClaimLocked(name, label_names)) return nullptr;
  HistogramEntry& e = histograms_[name];
  e.help = help;
  e.bounds = std::make_unique<std::vector<double>>(std::move(bounds));
  e.family.reset(new HistogramFamily(std::move(label_names), e.bounds.get()));
  return e.family.get();
}

void Registry::AddCollector(std::function<void(Writer&)> collect) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collect));
}

std::string Registry::Render() const {
  absl::MutexLock render_lock(&render_mu_);
  std::vector<std::function<void(Writer&)>> collectors;
  {
    absl::MutexLock lock(&mu_);
    collectors = collectors_;
  }
  Writer collected;
  for (const auto& collect : collectors) collect(collected);

  // name -> rendered block, so that the output is in name order overall.
  std::map<std::string, std::string> blocks;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, e] : counters_) {
      std::string& out = blocks[name];
      AppendHeader(name, e.help, "counter", &out);
      absl::MutexLock family_lock(&e.family->mu_);
      for (const auto& [values, child] : e.family->children_) {
        out += name;
        AppendLabels(Zip(e.family->label_names_, values), &out);
        absl::StrAppend(&out, " ", FormatValue(child->value()), "\n");
      }
    }
    for (const auto& [name, e] : histograms_) {
      std::string& out = blocks[name];
      AppendHeader(name, e.help, "histogram", &out);
      absl::MutexLock family_lock(&e.family->mu_);
      std::vector<uint64_t> cumulative;
      for (const auto& [values, child] : e.family->children_) {
        double sum = 0;
        uint64_t count = 0;
        child->Snapshot(&cumulative, &sum, &count);
        const Labels base = Zip(e.family->label_names_, values);
        for (size_t i = 0; i < cumulative.size(); ++i) {
          Labels labels = base;
          labels.emplace_back("le", i < e.bounds->size() ? FormatValue((*e.bounds)[i]) : "+Inf");
          absl::StrAppend(&out, name, "_bucket");
          AppendLabels(labels, &out);
          absl::StrAppend(&out, " ", cumulative[i], "\n");
        }
        absl::StrAppend(&out, name, "_sum");
        AppendLabels(base, &out);
        absl::StrAppend(&out, " ", FormatValue(sum), "\n", name, "_count");
        AppendLabels(base, &out);
        absl::StrAppend(&out, " ", count, "\n");
      }
    }
  }
  for (const auto& [name, s] : collected.series_) {
    if (blocks.count(name) || !ValidMetricName(name)) continue;  // registered names win
    std::string& out = blocks[name];
    AppendHeader(name, s.help, s.type.c_str(), &out);
    for (const auto& [labels, v] : s.samples) {
      out += name;
      AppendLabels(labels, &out);
      absl::StrAppend(&out, " ", FormatValue(v), "\n");
    }
  }
  std::string text;
  for (const auto& [name, block] : blocks) text += block;
  return text;
}

}  // namespace kvtier::daemon::metrics
