// Metrics in the Prometheus text exposition format (version 0.0.4).
//
//   Registry registry;
//   CounterFamily* rpcs = registry.AddCounter(
//       "kvtier_rpc_total", "RPCs finished, by method and gRPC code", {"method", "code"});
//   rpcs->With({"Select", "OK"})->Add(1);
//   HistogramFamily* lat = registry.AddHistogram(
//       "kvtier_select_seconds", "Select handling time", {"phase"}, LatencyBuckets());
//   lat->With({"pin"})->Observe(0.0004);
//   registry.AddCollector([&](Writer& w) {   // values read at scrape time
//     w.Gauge("kvtier_tier_used_bytes", "...", {{"tier", "host"}}, used);
//   });
//   std::string text = registry.Render();
//
// Names must match [a-zA-Z_:][a-zA-Z0-9_:]* and label names
// [a-zA-Z_][a-zA-Z0-9_]*: Add* returns nullptr for a bad or repeated name
// (a programming error the daemon's tests catch). Label values are escaped.
// Counters and histograms are cumulative from process start; a series is
// created on first use and never removed (label values must come from a
// bounded set: methods, codes, tiers, phases, tenants).
//
// Thread safety: every method is thread-safe. The children returned by
// With() stay valid as long as the registry; Add/Observe on them are
// lock-free (relaxed atomics). Collectors run during Render, one scrape at a
// time, and must not call back into the registry.
#ifndef KVTIER_DAEMON_METRICS_REGISTRY_H_
#define KVTIER_DAEMON_METRICS_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kvtier::daemon::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Add(double v) {
    double cur = value_.load(std::memory_order_relaxed);
    while (!value_.compare_exchange_weak(cur, cur + v, std::memory_order_relaxed)) {
    }
  }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  explicit Histogram(const std::vector<double>* bounds);
  void Observe(double v);
  // Cumulative counts per bound (the last is +Inf), their sum and count.
  void Snapshot(std::vector<uint64_t>* cumulative, double* sum, uint64_t* count) const;

 private:
  const std::vector<double>* bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_->size() + 1
  Counter sum_;
};

// Upper bounds in seconds from 10 us to 10 s (1-2.5-5 steps).
std::vector<double> LatencyBuckets();

template <typename Child>
class Family {
 public:
  // The child of these label values (as many as the family's label names;
  // nullptr otherwise), created on first use.
  Child* With(const std::vector<std::string>& values);

 private:
  friend class Registry;
  template <typename... Args>
  explicit Family(std::vector<std::string> label_names, Args... args)
      : label_names_(std::move(label_names)),
        make_([args...] { return std::make_unique<Child>(args...); }) {}
  const std::vector<std::string> label_names_;
  const std::function<std::unique_ptr<Child>()> make_;
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<Child>> children_ ABSL_GUARDED_BY(mu_);
};

using CounterFamily = Family<Counter>;
using HistogramFamily = Family<Histogram>;

// What a collector writes: samples read at scrape time.
class Writer {
 public:
  void Gauge(const std::string& name, const std::string& help, const Labels& labels, double v);
  void Counter(const std::string& name, const std::string& help, const Labels& labels, double v);

 private:
  friend class Registry;
  struct Series {
    std::string type, help;
    std::vector<std::pair<Labels, double>> samples;
  };
  void Add(const std::string& name, const char* type, const std::string& help, const Labels& labels,
           double v);
  std::map<std::string, Series> series_;
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  CounterFamily* AddCounter(const std::string& name, const std::string& help,
                            std::vector<std::string> label_names);
  HistogramFamily* AddHistogram(const std::string& name, const std::string& help,
                                std::vector<std::string> label_names, std::vector<double> bounds);
  void AddCollector(std::function<void(Writer&)> collect);

  // Every family and collected series, in name order.
  std::string Render() const;

 private:
  bool ClaimLocked(const std::string& name, const std::vector<std::string>& label_names)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct CounterEntry {
    std::string help;
    std::unique_ptr<CounterFamily> family;
  };
  struct HistogramEntry {
    std::string help;
    std::unique_ptr<std::vector<double>> bounds;
    std::unique_ptr<HistogramFamily> family;
  };
  mutable absl::Mutex mu_;
  mutable absl::Mutex render_mu_;  // one scrape at a time
  std::map<std::string, CounterEntry> counters_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, HistogramEntry> histograms_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(Writer&)>> collectors_ ABSL_GUARDED_BY(mu_);
};

// Label value escaping of the text format (backslash, quote, newline).
std::string EscapeLabelValue(const std::string& v);
bool ValidMetricName(const std::string& name);
bool ValidLabelName(const std::string& name);

// ---- implementation of the template ------------------------------------

template <typename Child>
Child* Family<Child>::With(const std::vector<std::string>& values) {
  if (values.size() != label_names_.size()) return nullptr;
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Child>& child = children_[values];
  if (child == nullptr) child = make_();
  return child.get();
}

}  // namespace kvtier::daemon::metrics

#endif  // KVTIER_DAEMON_METRICS_REGISTRY_H_
