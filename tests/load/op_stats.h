// Per-operation measurements of the load test: latency samples and the
// status codes the calls and their items returned.
//
// Each stream thread fills an OpStats of its own (no locking); the test
// merges them after the threads are joined. Latencies are kept as exact
// samples (microseconds, one uint32 each: a 60 s run of 64 streams holds a
// few hundred thousand), so percentiles are exact, not bucketed.
//
// Thread safety: none; one thread per OpStats, Merge after joining.
#ifndef KVTIER_TESTS_LOAD_OP_STATS_H_
#define KVTIER_TESTS_LOAD_OP_STATS_H_

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvtier::load {

// The calls the load times. A "put" is one PutBlocks call (1..4 blocks);
// kReserve is the ReserveSlots before a put through staging slots.
enum class Op {
  kPut,
  kReserve,
  kGet,         // GetBlocks, bytes
  kGetHandles,  // GetBlocks, device handles (the arena reads not included)
  kRelease,
  kDelete,
  kOpen,  // OpenContext
  kAppend,
  kSelect,  // one request/response on a Select stream
  kClose,   // CloseContext
  kStats,   // Admin Stats, by the sampler
  kCount
};
inline constexpr int kNumOps = static_cast<int>(Op::kCount);
const char* OpName(Op op);

struct LatencySummary {
  uint64_t count = 0;
  double p50_us = 0, p99_us = 0, max_us = 0, mean_us = 0;
};

class OpStats {
 public:
  void Record(Op op, std::chrono::steady_clock::duration took);
  // A call-level status (0 for OK) and each item's google.rpc code.
  void CallCode(Op op, int code) { ++calls_[Index(op)][code]; }
  void ItemCode(Op op, int code) { ++items_[Index(op)][code]; }
  void Merge(const OpStats& other);

  // Sorts the samples of op (mutates), then summarises them.
  LatencySummary Summarize(Op op);
  const std::map<int, uint64_t>& calls(Op op) const { return calls_[Index(op)]; }
  const std::map<int, uint64_t>& items(Op op) const { return items_[Index(op)]; }
  uint64_t total_calls() const;

 private:
  static size_t Index(Op op) { return static_cast<size_t>(op); }
  std::array<std::vector<uint32_t>, kNumOps> latency_us_;
  std::array<std::map<int, uint64_t>, kNumOps> calls_;
  std::array<std::map<int, uint64_t>, kNumOps> items_;
};

// Times one call: Record(op, elapsed) when it goes out of scope.
class ScopedTimer {
 public:
  ScopedTimer(OpStats* stats, Op op)
      : stats_(stats), op_(op), start_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() { stats_->Record(op_, std::chrono::steady_clock::now() - start_); }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  OpStats* const stats_;
  const Op op_;
  const std::chrono::steady_clock::time_point start_;
};

}  // namespace kvtier::load

#endif  // KVTIER_TESTS_LOAD_OP_STATS_H_
