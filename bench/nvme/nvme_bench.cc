// kvtier_nvme_bench: NvmeTier write and read throughput at one block size and
// queue depth. bench/nvme/run.sh runs it beside fio on the same directory and
// reports the ratios.
//
// Write phase: a fresh tier (one preallocated file of --total-bytes) is
// filled with --total-bytes of blocks by --clients threads, each calling
// WriteBatch with --batch blocks at a time, then Sync; the time includes
// the Sync. Read phase: the same blocks are read back with ReadBatch
// (XXH3 verified by the tier). One ring of --queue-depth per I/O thread
// bounds the I/O in flight, as fio's iodepth does.
//
// --buffers=aligned passes 4 KiB-aligned, registered buffers (the in-place
// path); --buffers=unaligned passes misaligned ones (the staging path with
// one memcpy per block).
//
// Output: one line per phase,
//   RESULT kvtier op=write bs=2097152 qd=32 bytes=1073741824 seconds=0.71
//   gibps=1.41 cpu_s_per_gib=0.12 ...
// (cpu_s_per_gib: user + system CPU of the whole process per GiB moved.)
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "storage/env/aligned_buffer.h"
#include "storage/env/env.h"
#include "storage/nvme/nvme_tier.h"

namespace kvtier {
namespace {

struct BenchConfig {
  std::string dir;
  uint64_t block_bytes = 2 << 20;
  uint64_t total_bytes = uint64_t{1} << 30;
  uint32_t queue_depth = 32;
  uint32_t io_threads = 1;
  uint32_t clients = 2;
  uint32_t batch = 0;  // 0: queue_depth
  std::string buffers = "aligned";
  std::string mode = "both";
  bool odirect = true;
};

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// User + system CPU seconds of this process so far.
double CpuSeconds() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  auto sec = [](const timeval& tv) { return tv.tv_sec + tv.tv_usec / 1e6; };
  return sec(usage.ru_utime) + sec(usage.ru_stime);
}

void Report(const char* op, const BenchConfig& c, uint64_t bytes, double seconds,
            double cpu_seconds, const NvmeTierStats& s) {
  const double gib = static_cast<double>(bytes) / (1 << 30);
  std::printf(
      "RESULT kvtier op=%s bs=%llu qd=%u bytes=%llu seconds=%.3f gibps=%.3f "
      "cpu_s_per_gib=%.3f "
      "buffers=%s direct_io=%d registered=%d zero_copy=%llu staged=%llu "
      "fixed=%llu submits=%llu requeued=%llu\n",
      op, static_cast<unsigned long long>(c.block_bytes), c.queue_depth,
      static_cast<unsigned long long>(bytes), seconds, gib / seconds, cpu_seconds / gib,
      c.buffers.c_str(), s.direct_io ? 1 : 0, s.registered_buffers ? 1 : 0,
      static_cast<unsigned long long>(s.zero_copy_ops),
      static_cast<unsigned long long>(s.staged_ops),
      static_cast<unsigned long long>(s.queue.fixed_buffer_ops),
      static_cast<unsigned long long>(s.queue.submit_calls),
      static_cast<unsigned long long>(s.queue.requeued_short + s.queue.requeued_again));
  std::fflush(stdout);
}

// Runs fn(first_block, count) on `clients` threads over [0, blocks) in
// chunks of `batch`, handed out in order.
template <typename Fn>
void RunClients(uint32_t clients, uint64_t blocks, uint32_t batch, Fn fn) {
  std::atomic<uint64_t> next{0};
  std::vector<std::thread> threads;
  for (uint32_t c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      for (;;) {
        const uint64_t first = next.fetch_add(batch);
        if (first >= blocks) return;
        fn(c, first, std::min<uint64_t>(batch, blocks - first));
      }
    });
  }
  for (auto& t : threads) t.join();
}

int Run(const BenchConfig& c) {
  const uint32_t batch = c.batch != 0 ? c.batch : c.queue_depth;
  const uint64_t blocks = c.total_bytes / c.block_bytes;
  const bool aligned = c.buffers == "aligned";
  // Offset of each client buffer from alignment: 0, or 64 bytes to force the
  // staging path.
  const uint64_t skew = aligned ? 0 : 64;
  const uint64_t slot_bytes = RoundUpToDirectIo(c.block_bytes + skew);
  constexpr uint64_t kSourceBlocks = 32;

  // Source payloads (random, so XXH3 does real work) and read targets.
  auto sources = AlignedBuffer::Allocate(kSourceBlocks * slot_bytes);
  auto targets = AlignedBuffer::Allocate(uint64_t{c.clients} * batch * slot_bytes);
  if (!sources.ok() || !targets.ok()) {
    std::fprintf(stderr, "buffer allocation failed\n");
    return 1;
  }
  std::mt19937_64 rng(42);
  for (uint64_t i = 0; i < sources->size(); i += 8) {
    const uint64_t word = rng();
    std::memcpy(sources->data() + i, &word, 8);
  }
  std::vector<absl::Span<const uint8_t>> payloads;
  std::vector<uint64_t> checksums;
  for (uint64_t i = 0; i < kSourceBlocks; ++i) {
    payloads.emplace_back(sources->data() + i * slot_bytes + skew, c.block_bytes);
    checksums.push_back(NvmeChecksum(payloads.back()));
  }

  const std::string tier_dir = c.dir + "/kvtier";
  NvmeTierOptions options;
  options.directory = tier_dir;
  options.num_files = 1;
  options.file_size_bytes = RoundUpToDirectIo(blocks * RoundUpToDirectIo(c.block_bytes));
  options.queue_depth = c.queue_depth;
  options.io_threads = c.io_threads;
  options.use_odirect = c.odirect;
  options.max_block_bytes = c.block_bytes;
  // Enough staging for every ring to be full on the staging path.
  options.staging_bytes = std::max<uint64_t>(
      uint64_t{64} << 20, 2 * RoundUpToDirectIo(c.block_bytes) * c.queue_depth * c.io_threads);
  options.registered_regions = {sources->span(), targets->span()};

  // A fresh file each run, as fio lays out a fresh one.
  Env* env = Env::Default();
  env->DeleteFile(tier_dir + "/" + NvmeTier::FileName(0)).IgnoreError();
  auto tier_or = NvmeTier::Open(options);
  if (!tier_or.ok()) {
    std::fprintf(stderr, "open: %s\n", tier_or.status().ToString().c_str());
    return 1;
  }
  NvmeTier& tier = **tier_or;

  std::vector<NvmeLocation> locations(blocks);
  std::atomic<uint64_t> errors{0};
  double cpu_start = CpuSeconds();
  auto write_start = std::chrono::steady_clock::now();
  RunClients(c.clients, blocks, batch, [&](uint32_t, uint64_t first, uint64_t count) {
    std::vector<absl::Span<const uint8_t>> spans;
    for (uint64_t b = first; b < first + count; ++b) {
      spans.push_back(payloads[b % kSourceBlocks]);
    }
    auto results = tier.WriteBatch(spans);
    for (uint64_t i = 0; i < count; ++i) {
      if (!results[i].ok()) {
        if (errors.fetch_add(1) == 0) {
          std::fprintf(stderr, "write: %s\n", results[i].status().ToString().c_str());
        }
        continue;
      }
      locations[first + i] = *results[i];
    }
  });
  absl::Status synced = tier.Sync();
  const double write_seconds = Seconds(write_start);
  const double write_cpu_seconds = CpuSeconds() - cpu_start;
  if (!synced.ok() || errors.load() != 0) {
    std::fprintf(stderr, "write phase failed: %s, %llu errors\n", synced.ToString().c_str(),
                 static_cast<unsigned long long>(errors.load()));
    return 1;
  }
  const uint64_t bytes = blocks * c.block_bytes;
  if (c.mode != "read") Report("write", c, bytes, write_seconds, write_cpu_seconds, tier.stats());
  if (c.mode == "write") return 0;

  const NvmeTierStats before = tier.stats();
  cpu_start = CpuSeconds();
  auto read_start = std::chrono::steady_clock::now();
  RunClients(c.clients, blocks, batch, [&](uint32_t client, uint64_t first, uint64_t count) {
    std::vector<NvmeReadRequest> reads;
    for (uint64_t i = 0; i < count; ++i) {
      uint8_t* out = targets->data() + (uint64_t{client} * batch + i) * slot_bytes + skew;
      reads.push_back({locations[first + i], checksums[(first + i) % kSourceBlocks],
                       absl::MakeSpan(out, c.block_bytes)});
    }
    for (const absl::Status& s : tier.ReadBatch(reads)) {
      if (!s.ok() && errors.fetch_add(1) == 0) {
        std::fprintf(stderr, "read: %s\n", s.ToString().c_str());
      }
    }
  });
  const double read_seconds = Seconds(read_start);
  const double read_cpu_seconds = CpuSeconds() - cpu_start;
  if (errors.load() != 0) return 1;
  NvmeTierStats after = tier.stats();
  after.zero_copy_ops -= before.zero_copy_ops;
  after.staged_ops -= before.staged_ops;
  after.queue.fixed_buffer_ops -= before.queue.fixed_buffer_ops;
  after.queue.submit_calls -= before.queue.submit_calls;
  Report("read", c, bytes, read_seconds, read_cpu_seconds, after);
  return 0;
}

}  // namespace
}  // namespace kvtier

int main(int argc, char** argv) {
  kvtier::BenchConfig c;
  CLI::App app{"NvmeTier throughput (write then read back)"};
  app.add_option("--dir", c.dir, "Directory for the tier's file")->required();
  app.add_option("--block-size", c.block_bytes, "Block size (e.g. 256K, 2M)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--total-bytes", c.total_bytes, "Bytes written and read")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--queue-depth", c.queue_depth, "io_uring depth per I/O thread");
  app.add_option("--io-threads", c.io_threads, "I/O threads (rings)");
  app.add_option("--clients", c.clients, "Caller threads");
  app.add_option("--batch", c.batch, "Blocks per WriteBatch/ReadBatch (0: qd)");
  app.add_option("--buffers", c.buffers, "aligned (in place) or unaligned (staged)")
      ->check(CLI::IsMember({"aligned", "unaligned"}));
  app.add_option("--mode", c.mode, "write, read or both")
      ->check(CLI::IsMember({"write", "read", "both"}));
  app.add_option("--odirect", c.odirect, "Use O_DIRECT");
  CLI11_PARSE(app, argc, argv);
  if (c.block_bytes == 0 || c.total_bytes < c.block_bytes || c.clients == 0) {
    std::fprintf(stderr,
                 "need block-size > 0, total-bytes >= block-size, "
                 "clients > 0\n");
    return 2;
  }
  return kvtier::Run(c);
}
