#include "tests/load/op_stats.h"

#include <algorithm>
#include <limits>

namespace kvtier::load {

const char* OpName(Op op) {
  switch (op) {
    case Op::kPut:
      return "put";
    case Op::kReserve:
      return "reserve_slots";
    case Op::kGet:
      return "get";
    case Op::kGetHandles:
      return "get_handles";
    case Op::kRelease:
      return "release";
    case Op::kDelete:
      return "delete";
    case Op::kOpen:
      return "open_context";
    case Op::kAppend:
      return "append";
    case Op::kSelect:
      return "select";
    case Op::kClose:
      return "close_context";
    case Op::kStats:
      return "stats";
    case Op::kCount:
      break;
  }
  return "?";
}

void OpStats::Record(Op op, std::chrono::steady_clock::duration took) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(took).count();
  const auto clamped = std::clamp<int64_t>(us, 0, std::numeric_limits<uint32_t>::max());
  latency_us_[Index(op)].push_back(static_cast<uint32_t>(clamped));
}

void OpStats::Merge(const OpStats& other) {
  for (size_t i = 0; i < kNumOps; ++i) {
    latency_us_[i].insert(latency_us_[i].end(), other.latency_us_[i].begin(),
                          other.latency_us_[i].end());
    for (const auto& [code, n] : other.calls_[i]) calls_[i][code] += n;
    for (const auto& [code, n] : other.items_[i]) items_[i][code] += n;
  }
}

LatencySummary OpStats::Summarize(Op op) {
  std::vector<uint32_t>& v = latency_us_[Index(op)];
  LatencySummary s;
  s.count = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  // Nearest rank: the smallest sample with at least p of the samples at
  // or below it.
  auto rank = [&](double p) {
    size_t k = static_cast<size_t>(p * static_cast<double>(v.size()) + 0.999999);
    return static_cast<double>(v[std::clamp<size_t>(k, 1, v.size()) - 1]);
  };
  s.p50_us = rank(0.50);
  s.p99_us = rank(0.99);
  s.max_us = v.back();
  double sum = 0;
  for (uint32_t x : v) sum += x;
  s.mean_us = sum / static_cast<double>(v.size());
  return s;
}

uint64_t OpStats::total_calls() const {
  uint64_t n = 0;
  for (const auto& v : latency_us_) n += v.size();
  return n;
}

}  // namespace kvtier::load
