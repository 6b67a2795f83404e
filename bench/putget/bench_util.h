// Shared pieces of kvtier_putget_bench: the working set every method moves
// (a source buffer of N blocks and a destination buffer of the same size),
// block ids, and the repeat-and-take-the-median timing loop.
//
// Thread safety: none; the benchmark is single-threaded on the client side.
#ifndef KVTIER_BENCH_PUTGET_BENCH_UTIL_H_
#define KVTIER_BENCH_PUTGET_BENCH_UTIL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvtier::bench {

// num_blocks blocks of block_bytes each, stored back to back. The source is
// filled with pseudo-random finite fp16 values (every block differs); both buffers are
// written once at construction so no page fault lands inside a timed run.
class WorkingSet {
 public:
  WorkingSet(uint64_t block_bytes, uint64_t num_blocks, uint64_t seed);

  uint64_t block_bytes() const { return block_bytes_; }
  uint64_t num_blocks() const { return num_blocks_; }
  uint64_t total_bytes() const { return block_bytes_ * num_blocks_; }

  const char* src(uint64_t block) const { return src_.data() + block * block_bytes_; }
  char* dst(uint64_t block) { return dst_.data() + block * block_bytes_; }

  // Zeroes the destination so a get that skips a block cannot pass.
  void ClearDst();
  // OK when dst equals src; otherwise DATA_LOSS naming `what` and the first
  // block that differs.
  absl::Status VerifyDst(const std::string& what) const;

 private:
  const uint64_t block_bytes_;
  const uint64_t num_blocks_;
  std::vector<char> src_;
  std::vector<char> dst_;
};

// kMaxBlockIdBytes-sized ids (an engine's SHA-256 chain hash is 32 bytes):
// an 8-byte tag, the repetition and the block index, zero-padded. Distinct
// for distinct (tag, rep, index).
std::vector<std::string> BlockIds(const std::string& tag, uint32_t rep, uint64_t count);

// One timed method. prepare and check run outside the timed region (e.g.
// delete what the previous repetition stored, verify the bytes read);
// either may be empty. rep counts from 0 across warm-up and measured runs.
struct TimedMethod {
  std::string method;  // e.g. "kvtier gRPC bytes"
  std::string op;      // "put" or "get"
  std::function<absl::Status(uint32_t rep)> prepare;
  std::function<absl::Status(uint32_t rep)> run;
  std::function<absl::Status(uint32_t rep)> check;
};

struct Sample {
  uint64_t block_bytes = 0;
  std::string method;
  std::string op;
  uint64_t bytes = 0;           // moved per repetition
  std::vector<double> seconds;  // one per measured repetition
  double MedianGBps() const;    // GB = 1e9 bytes
  double MinGBps() const;
  double MaxGBps() const;
};

// Runs the methods in rounds: each round runs every method once, in order
// (so a get may rely on the put before it in the same round). warmup
// untimed rounds, then reps timed ones; steady_clock around run only. A
// busy, shared machine then slows every method alike instead of whichever
// happened to run during a burst. The first error from any step is
// returned, prefixed with the method and op. Samples come back in method
// order.
absl::StatusOr<std::vector<Sample>> MeasureRounds(const std::vector<TimedMethod>& methods,
                                                  uint64_t block_bytes, uint64_t bytes,
                                                  uint32_t warmup, uint32_t reps);

// Formatting helpers.
std::string FormatGBps(double gbps);
std::string FormatRatio(double ratio);
std::string HumanBytes(uint64_t bytes);  // "256 KiB", "2 MiB"

// First field of /proc/loadavg, or "?" when unreadable.
std::string LoadAverage();

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_PUTGET_BENCH_UTIL_H_
