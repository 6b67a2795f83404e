#include "bench/putget/bench_util.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvtier::bench {

WorkingSet::WorkingSet(uint64_t block_bytes, uint64_t num_blocks, uint64_t seed)
    : block_bytes_(block_bytes),
      num_blocks_(num_blocks),
      src_(block_bytes * num_blocks),
      dst_(block_bytes * num_blocks) {
  // splitmix64: fast, and no two blocks share their bytes. Every 16-bit
  // word has its top exponent bit cleared: finite fp16/bf16 values, as the
  // daemon summarises the keys of every block it stores and refuses NaN/Inf.
  uint64_t x = seed;
  const size_t words = src_.size() / sizeof(uint64_t);
  for (size_t i = 0; i < words; ++i) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    z &= 0xbfffbfffbfffbfffULL;
    std::memcpy(src_.data() + i * sizeof(uint64_t), &z, sizeof(z));
  }
}

void WorkingSet::ClearDst() { std::memset(dst_.data(), 0, dst_.size()); }

absl::Status WorkingSet::VerifyDst(const std::string& what) const {
  for (uint64_t b = 0; b < num_blocks_; ++b) {
    const uint64_t off = b * block_bytes_;
    if (std::memcmp(src_.data() + off, dst_.data() + off, block_bytes_) != 0) {
      return absl::DataLossError(
          absl::StrCat(what, ": block ", b, " read back differs from the bytes written"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> BlockIds(const std::string& tag, uint32_t rep, uint64_t count) {
  std::vector<std::string> ids;
  ids.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    std::string id(32, '\0');
    std::memcpy(id.data(), tag.data(), std::min<size_t>(tag.size(), 8));
    std::memcpy(id.data() + 8, &rep, sizeof(rep));
    std::memcpy(id.data() + 16, &i, sizeof(i));
    ids.push_back(std::move(id));
  }
  return ids;
}

namespace {

double GBps(uint64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
}

}  // namespace

double Sample::MedianGBps() const {
  if (seconds.empty()) return 0;
  std::vector<double> s = seconds;
  std::sort(s.begin(), s.end());
  const size_t n = s.size();
  const double median = n % 2 == 1 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
  return GBps(bytes, median);
}

double Sample::MinGBps() const {
  if (seconds.empty()) return 0;
  return GBps(bytes, *std::max_element(seconds.begin(), seconds.end()));
}

double Sample::MaxGBps() const {
  if (seconds.empty()) return 0;
  return GBps(bytes, *std::min_element(seconds.begin(), seconds.end()));
}

absl::StatusOr<std::vector<Sample>> MeasureRounds(const std::vector<TimedMethod>& methods,
                                                  uint64_t block_bytes, uint64_t bytes,
                                                  uint32_t warmup, uint32_t reps) {
  std::vector<Sample> samples(methods.size());
  for (size_t i = 0; i < methods.size(); ++i) {
    samples[i].block_bytes = block_bytes;
    samples[i].method = methods[i].method;
    samples[i].op = methods[i].op;
    samples[i].bytes = bytes;
  }
  for (uint32_t rep = 0; rep < warmup + reps; ++rep) {
    for (size_t i = 0; i < methods.size(); ++i) {
      const TimedMethod& m = methods[i];
      auto fail = [&](const char* step, const absl::Status& st) {
        return absl::Status(st.code(), absl::StrCat(m.method, " ", m.op, " (", step, ", round ",
                                                    rep, "): ", st.message()));
      };
      if (m.prepare) {
        if (absl::Status st = m.prepare(rep); !st.ok()) return fail("prepare", st);
      }
      const auto start = std::chrono::steady_clock::now();
      absl::Status st = m.run(rep);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!st.ok()) return fail("run", st);
      if (m.check) {
        if (absl::Status cst = m.check(rep); !cst.ok()) return fail("check", cst);
      }
      if (rep >= warmup) samples[i].seconds.push_back(seconds);
    }
  }
  return samples;
}

std::string FormatGBps(double gbps) { return absl::StrFormat("%.2f", gbps); }

std::string FormatRatio(double ratio) { return absl::StrFormat("%.2f", ratio); }

std::string HumanBytes(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 20) && bytes % (uint64_t{1} << 20) == 0) {
    return absl::StrCat(bytes >> 20, " MiB");
  }
  if (bytes >= 1024 && bytes % 1024 == 0) return absl::StrCat(bytes >> 10, " KiB");
  return absl::StrCat(bytes, " B");
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string first;
  if (!(in >> first)) return "?";
  return first;
}

}  // namespace kvtier::bench
