// kvtier_putget_bench: Put/Get throughput of kvtierd against memcpy and
// redis-server in one run, plus the daemon's metadata RAM per block.
//
// For each block size S (--block-sizes) a working set of --total is moved,
// --batch-blocks blocks per message / pipeline, by:
//   memcpy            single-threaded copy source -> destination (the anchor
//                     for the shared-memory path)
//   kvtier_grpc_bytes PutBlocks with bytes in the messages; GetBlocks bytes
//   kvtier_grpc_direct the same RPCs through Client::PutBlockData /
//                     GetBlockData: messages written from and parsed into
//                     the working set in place (no protobuf copies)
//   kvtier_shm        ReserveSlots + memcpy into the slots + PutBlocks
//                     naming them; GetBlocks handles + memcpy out of the
//                     mapped arena + Release
//   redis_tcp/_unix   pipelined SET / GET with hiredis against a
//                     redis-server child (no persistence) over 127.0.0.1
//                     and over its Unix socket
//   server_work       XXH3-64 and the key summary the daemon computes for
//                     every put, in-process on the same blocks, alone and
//                     as a put does them (server_put_floor: copy + hash,
//                     then the summary; server_put_fused: the summary
//                     taken chunk by chunk as the copy lands); explains
//                     the put paths, no goal
// kvtierd runs in-process and listens on a Unix socket. Puts use fresh ids
// every round (the previous set is deleted untimed; Redis is flushed
// untimed); every get is verified byte for byte, untimed. Methods run in
// interleaved rounds (--warmup untimed, then --reps timed); the median is
// reported and ratios are medians of per-round ratios. GB/s = 1e9 B/s.
// Metadata RAM: see metadata_probe.h (two daemon configurations).
//
// Output: a markdown report on stdout and in <out-dir>/results.md, and
// <out-dir>/results.csv and <out-dir>/metadata.csv.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/putget/bench_util.h"
#include "bench/putget/kvtier_paths.h"
#include "bench/putget/metadata_probe.h"
#include "bench/putget/redis_anchor.h"
#include "daemon/config.h"
#include "daemon/convert.h"
#include "daemon/logging.h"
#include "daemon/options.h"
#include "daemon/summarizer.h"
#include "storage/common/checksum.h"

namespace kvtier::bench {
namespace {

struct Args {
  std::vector<std::string> block_sizes = {"256KiB", "2MiB"};
  std::string total = "512MiB";
  uint32_t batch_blocks = 16;
  uint32_t reps = 5;
  uint32_t warmup = 1;
  std::string out_dir = "bench/out/putget";
  std::string data_dir;  // default /tmp/kvtier-putget-<pid>
  std::string redis_server = "/usr/bin/redis-server";
  bool redis_unix = true;
  uint64_t metadata_blocks = 100000;
  std::string host = "2GiB";
  std::string staging = "512MiB";
  std::string device = "256MiB";
  // Method ids to run (see Methods() and "server_work"); empty: all.
  std::vector<std::string> methods;
  // Daemon settings over its embedded defaults (KEY=VALUE).
  std::vector<std::string> daemon_settings;

  bool Enabled(const std::string& id) const {
    return methods.empty() || std::find(methods.begin(), methods.end(), id) != methods.end();
  }
};

// Method ids (CSV) and their display names (tables), in report order.
const std::vector<std::pair<std::string, std::string>>& Methods() {
  static const auto* m = new std::vector<std::pair<std::string, std::string>>{
      {"memcpy", "memcpy (1 thread, anchor)"},
      {"kvtier_grpc_bytes", "kvtier gRPC bytes (unix socket)"},
      {"kvtier_grpc_direct", "kvtier gRPC bytes, direct client calls (unix socket)"},
      {"kvtier_shm", "kvtier shm staging put / handles get"},
      {"redis_tcp", "redis-server SET/GET, 127.0.0.1 TCP"},
      {"redis_unix", "redis-server SET/GET, unix socket"},
  };
  return *m;
}

struct Results {
  std::vector<Sample> samples;
  std::map<uint64_t, uint64_t> summary_bytes;  // block size -> stored summary bytes
  std::optional<Sample> Find(uint64_t block_bytes, const std::string& method,
                             const std::string& op) const {
    for (const Sample& s : samples) {
      if (s.block_bytes == block_bytes && s.method == method && s.op == op) return s;
    }
    return std::nullopt;
  }
  double Median(uint64_t block_bytes, const std::string& method, const std::string& op) const {
    auto s = Find(block_bytes, method, op);
    return s ? s->MedianGBps() : 0.0;
  }
};

// Every enabled method at one block size, in interleaved rounds.
absl::Status RunBlockSize(const Args& args, uint64_t block_bytes, uint64_t total_bytes,
                          KvtierPaths* kv, RedisClient* redis_tcp, RedisClient* redis_unix,
                          Results* results) {
  const uint64_t n = total_bytes / block_bytes;
  if (n == 0) return absl::InvalidArgumentError("total: smaller than one block");
  const uint64_t bytes = n * block_bytes;
  const uint32_t k = args.batch_blocks;
  std::fprintf(stderr, "block %s: %llu blocks, batch %u, load %s\n",
               HumanBytes(block_bytes).c_str(), static_cast<unsigned long long>(n), k,
               LoadAverage().c_str());
  auto profile = kv->RegisterBlockSize(block_bytes);
  if (!profile.ok()) return profile.status();
  const uint64_t pid = *profile;
  auto storage_profile = daemon::FromProto(*ProfileForBlockBytes(block_bytes));
  if (!storage_profile.ok()) return storage_profile.status();
  WorkingSet ws(block_bytes, n, block_bytes);
  auto clear = [&ws](uint32_t) {
    ws.ClearDst();
    return absl::OkStatus();
  };
  auto verify = [&ws](const char* what) {
    return [&ws, what](uint32_t) { return ws.VerifyDst(what); };
  };
  std::vector<TimedMethod> methods;

  if (args.Enabled("memcpy")) {
    methods.push_back({"memcpy", "copy", clear,
                       [&](uint32_t) {
                         for (uint64_t i = 0; i < n; ++i) {
                           std::memcpy(ws.dst(i), ws.src(i), block_bytes);
                         }
                         return absl::OkStatus();
                       },
                       verify("memcpy")});
  }

  // What the daemon does per stored block besides copying it, one thread.
  // The summary the daemon computes on its embedded defaults.
  absl::StatusOr<daemon::Config> defaults = daemon::LoadConfig("", {});
  if (!defaults.ok()) return defaults.status();
  daemon::Summarizer summarizer{daemon::SummarizerOptionsOf(*defaults)};
  uint64_t sink = 0;
  if (args.Enabled("server_work")) {
    methods.push_back({"server_xxh3", "compute", nullptr,
                       [&](uint32_t) {
                         for (uint64_t i = 0; i < n; ++i) {
                           sink += BlockChecksum(  // the daemon's
                               {reinterpret_cast<const uint8_t*>(ws.src(i)), block_bytes});
                         }
                         return absl::OkStatus();
                       },
                       nullptr});
    // A put's copy into the host slab: copied and hashed in one pass.
    methods.push_back({"server_copy_xxh3", "compute", nullptr,
                       [&](uint32_t) {
                         for (uint64_t i = 0; i < n; ++i) {
                           sink += CopyWithChecksum(
                               {reinterpret_cast<const uint8_t*>(ws.src(i)), block_bytes},
                               reinterpret_cast<uint8_t*>(ws.dst(i)));
                         }
                         return absl::OkStatus();
                       },
                       nullptr});
    // Everything a staged put of a new block does to the bytes, serially on
    // one core, as the block store does it: the copy into the host slab
    // with its checksum in one pass, then the key summary of that copy. The
    // put path cannot beat this on one core.
    methods.push_back(
        {"server_put_floor", "compute", nullptr,
         [&](uint32_t) -> absl::Status {
           for (uint64_t i = 0; i < n; ++i) {
             auto* dst = reinterpret_cast<uint8_t*>(ws.dst(i));
             sink +=
                 CopyWithChecksum({reinterpret_cast<const uint8_t*>(ws.src(i)), block_bytes}, dst);
             auto summary = summarizer.Summarize(*storage_profile, {dst, block_bytes});
             if (!summary.ok()) return summary.status();
             sink += summary->size();
           }
           return absl::OkStatus();
         },
         nullptr});
    // The same work as a put of a new block does it today: the summary
    // taken chunk by chunk as the copy lands (Summarizer::Begin), while
    // each chunk is still in cache.
    methods.push_back(
        {"server_put_fused", "compute", nullptr,
         [&](uint32_t) -> absl::Status {
           for (uint64_t i = 0; i < n; ++i) {
             auto* dst = reinterpret_cast<uint8_t*>(ws.dst(i));
             const absl::Span<const uint8_t> src(reinterpret_cast<const uint8_t*>(ws.src(i)),
                                                 block_bytes);
             std::unique_ptr<SummaryStream> stream = summarizer.Begin(*storage_profile);
             sink += GatherWithChecksum(absl::MakeConstSpan(&src, 1), dst, [&](size_t written) {
               stream->Advance({dst, written});
             });
             auto summary = stream->Finish({dst, block_bytes});
             if (!summary.ok()) return summary.status();
             sink += summary->size();
           }
           return absl::OkStatus();
         },
         nullptr});
    methods.push_back(
        {"server_summarize", "compute", nullptr,
         [&](uint32_t) -> absl::Status {
           for (uint64_t i = 0; i < n; ++i) {
             auto summary = summarizer.Summarize(
                 *storage_profile,
                 absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(ws.src(i)), block_bytes));
             if (!summary.ok()) return summary.status();
             sink += summary->size();
           }
           return absl::OkStatus();
         },
         nullptr});
  }

  // kvtier: `stored` is the set the last put left; every put deletes it
  // first (untimed), so the host tier never fills and ids are always fresh.
  std::vector<std::string> stored, put_ids;
  auto replace_stored = [&](const std::string& tag, uint32_t rep) -> absl::Status {
    if (!stored.empty()) {
      if (absl::Status d = kv->Delete(pid, stored); !d.ok()) return d;
      stored.clear();
    }
    put_ids = BlockIds(tag, rep, n);
    return absl::OkStatus();
  };
  auto now_stored = [&](uint32_t) {
    stored = put_ids;
    return absl::OkStatus();
  };
  if (args.Enabled("kvtier_grpc_bytes")) {
    methods.push_back({"kvtier_grpc_bytes", "put",
                       [&](uint32_t rep) { return replace_stored("grpcput", rep); },
                       [&](uint32_t) { return kv->PutBytes(pid, ws, put_ids, k); }, now_stored});
    methods.push_back({"kvtier_grpc_bytes", "get", clear,
                       [&](uint32_t) { return kv->GetBytes(pid, &ws, stored, k); },
                       verify("kvtier GetBlocks bytes")});
  }
  if (args.Enabled("kvtier_grpc_direct")) {
    methods.push_back({"kvtier_grpc_direct", "put",
                       [&](uint32_t rep) { return replace_stored("directput", rep); },
                       [&](uint32_t) { return kv->PutDirect(pid, ws, put_ids, k); }, now_stored});
    methods.push_back({"kvtier_grpc_direct", "get", clear,
                       [&](uint32_t) { return kv->GetDirect(pid, &ws, stored, k); },
                       verify("kvtier GetBlockData")});
  }
  if (args.Enabled("kvtier_shm")) {
    methods.push_back({"kvtier_shm", "put",
                       [&](uint32_t rep) { return replace_stored("shmput", rep); },
                       [&](uint32_t) { return kv->PutStaged(pid, ws, put_ids, k); }, now_stored});
    methods.push_back({"kvtier_shm", "get", clear,
                       [&](uint32_t) { return kv->GetHandles(pid, &ws, stored, k); },
                       verify("kvtier GetBlocks handles")});
  }

  // Redis: the same keys each round.
  const std::vector<std::string> keys = BlockIds("redis", 0, n);
  for (const std::pair<const char*, RedisClient*>& anchor :
       {std::pair<const char*, RedisClient*>{"redis_tcp", redis_tcp},
        std::pair<const char*, RedisClient*>{"redis_unix", redis_unix}}) {
    const char* method = anchor.first;
    RedisClient* c = anchor.second;
    if (c == nullptr) continue;
    // Flushed once, before the first round; later rounds overwrite the same
    // keys, so redis-server reuses the memory it freed (FLUSHALL makes it
    // purge its allocator's pages, and every later SET then pays a page
    // fault per 4 KiB, which on some VMs costs more than the copy).
    methods.push_back({method, "put",
                       [c](uint32_t rep) { return rep == 0 ? c->FlushAll() : absl::OkStatus(); },
                       [&, c](uint32_t) { return c->SetBlocks(ws, keys, k); }, nullptr});
    methods.push_back({method, "get", clear,
                       [&, c](uint32_t) { return c->GetBlocks(&ws, keys, k); },
                       verify("redis GET")});
  }

  auto samples = MeasureRounds(methods, block_bytes, bytes, args.warmup, args.reps);
  if (!samples.ok()) return samples.status();
  if (sink == 42) std::fputc(' ', stderr);  // keeps the hashing observable
  for (Sample& s : *samples) {
    std::fprintf(stderr, "  %-18s %-7s %6.2f GB/s (min %.2f, max %.2f)\n", s.method.c_str(),
                 s.op.c_str(), s.MedianGBps(), s.MinGBps(), s.MaxGBps());
    results->samples.push_back(std::move(s));
  }
  if (!stored.empty()) {
    auto summary_bytes = kv->SummaryBytes(pid, stored[0]);
    if (!summary_bytes.ok()) return summary_bytes.status();
    results->summary_bytes[block_bytes] = *summary_bytes;
    if (absl::Status d = kv->Delete(pid, stored); !d.ok()) return d;
  }
  for (RedisClient* c : {redis_tcp, redis_unix}) {
    if (c == nullptr) continue;
    if (absl::Status f = c->FlushAll(); !f.ok()) return f;
  }
  return absl::OkStatus();
}

std::string Verdict(double value, double goal, bool at_most = false) {
  const bool met = at_most ? value <= goal : value >= goal;
  return met ? "yes" : "**no**";
}

std::string Cell(double gbps) { return gbps > 0 ? FormatGBps(gbps) : "n/a"; }

// Throughput of a over throughput of b: the median over rounds of the
// per-round ratio (both ran in the same round, under the same load).
std::string RatioCell(const std::optional<Sample>& a, const std::optional<Sample>& b, double goal) {
  if (!a || !b || a->seconds.size() != b->seconds.size() || a->seconds.empty()) return "n/a";
  std::vector<double> ratios;
  for (size_t i = 0; i < a->seconds.size(); ++i) {
    const double a_gbps = a->bytes / a->seconds[i];
    const double b_gbps = b->bytes / b->seconds[i];
    ratios.push_back(a_gbps / b_gbps);
  }
  std::sort(ratios.begin(), ratios.end());
  const size_t n = ratios.size();
  const double r = n % 2 == 1 ? ratios[n / 2] : (ratios[n / 2 - 1] + ratios[n / 2]) / 2;
  return goal > 0 ? absl::StrCat(FormatRatio(r), " ", Verdict(r, goal)) : FormatRatio(r);
}

std::string Report(const Args& args, const std::vector<uint64_t>& sizes, uint64_t total_bytes,
                   const Results& results, const std::vector<MetadataResult>& meta,
                   const std::string& redis_version, const std::string& load_before) {
  std::string md;
  absl::StrAppend(&md, "Working set ", HumanBytes(total_bytes), " per block size, batch ",
                  args.batch_blocks, " blocks per message / pipeline, median of ", args.reps,
                  " repetitions after ", args.warmup, " warm-up; GB/s = 1e9 B/s. ",
                  std::thread::hardware_concurrency(), " CPUs shared by client, kvtierd and ",
                  "redis-server ", redis_version, "; load average ", load_before, " at start, ",
                  LoadAverage(), " at end.\n\n");
  absl::StrAppend(&md, "| block | method | put GB/s | get GB/s |\n|---|---|---|---|\n");
  for (uint64_t s : sizes) {
    for (const auto& [id, name] : Methods()) {
      if (id == "memcpy") {
        if (!results.Find(s, id, "copy")) continue;
        const std::string v = Cell(results.Median(s, id, "copy"));
        absl::StrAppend(&md, "| ", HumanBytes(s), " | ", name, " | ", v, " | ", v, " |\n");
        continue;
      }
      if (!results.Find(s, id, "put")) continue;
      absl::StrAppend(&md, "| ", HumanBytes(s), " | ", name, " | ",
                      Cell(results.Median(s, id, "put")), " | ", Cell(results.Median(s, id, "get")),
                      " |\n");
    }
  }
  absl::StrAppend(&md,
                  "\nRatios: median over rounds of the ratio within each round.\n"
                  "\n| block | shm put / memcpy (goal >= 0.7) | shm get / memcpy | "
                  "gRPC put / redis SET tcp (goal >= 2) | gRPC put / redis SET unix (goal >= 2) | "
                  "gRPC get / redis GET tcp (goal >= 2) | gRPC get / redis GET unix (goal >= 2) "
                  "|\n|---|---|---|---|---|---|---|\n");
  for (uint64_t s : sizes) {
    auto m = [&](const char* id, const char* op) { return results.Find(s, id, op); };
    const auto mc = m("memcpy", "copy");
    absl::StrAppend(&md, "| ", HumanBytes(s), " | ", RatioCell(m("kvtier_shm", "put"), mc, 0.7),
                    " | ", RatioCell(m("kvtier_shm", "get"), mc, 0), " | ",
                    RatioCell(m("kvtier_grpc_bytes", "put"), m("redis_tcp", "put"), 2), " | ",
                    RatioCell(m("kvtier_grpc_bytes", "put"), m("redis_unix", "put"), 2), " | ",
                    RatioCell(m("kvtier_grpc_bytes", "get"), m("redis_tcp", "get"), 2), " | ",
                    RatioCell(m("kvtier_grpc_bytes", "get"), m("redis_unix", "get"), 2), " |\n");
  }
  if (results.Find(sizes.front(), "kvtier_grpc_direct", "put")) {
    absl::StrAppend(&md,
                    "\nDirect client calls (Client::PutBlockData / GetBlockData; no protobuf "
                    "copies on the client):\n\n| block | direct put / redis SET unix (goal >= 2) "
                    "| direct get / redis GET unix (goal >= 2) | direct put / protobuf put | "
                    "direct get / protobuf get |\n|---|---|---|---|---|\n");
    for (uint64_t s : sizes) {
      auto m = [&](const char* id, const char* op) { return results.Find(s, id, op); };
      absl::StrAppend(
          &md, "| ", HumanBytes(s), " | ",
          RatioCell(m("kvtier_grpc_direct", "put"), m("redis_unix", "put"), 2), " | ",
          RatioCell(m("kvtier_grpc_direct", "get"), m("redis_unix", "get"), 2), " | ",
          RatioCell(m("kvtier_grpc_direct", "put"), m("kvtier_grpc_bytes", "put"), 0), " | ",
          RatioCell(m("kvtier_grpc_direct", "get"), m("kvtier_grpc_bytes", "get"), 0), " |\n");
    }
  }
  absl::StrAppend(
      &md,
      "\nWork kvtierd does on every put besides copying (one thread, in-process, "
      "same blocks):\n\n| block | memcpy GB/s | XXH3-64 GB/s | copy + XXH3 fused GB/s | "
      "key summary GB/s | copy + XXH3, then the summary GB/s (ratio to memcpy) | "
      "the same fused, as a put does it GB/s (ratio to memcpy) | "
      "summary bytes kept in RAM per block |\n|---|---|---|---|---|---|---|---|\n");
  for (uint64_t s : sizes) {
    auto it = results.summary_bytes.find(s);
    absl::StrAppend(
        &md, "| ", HumanBytes(s), " | ", Cell(results.Median(s, "memcpy", "copy")), " | ",
        Cell(results.Median(s, "server_xxh3", "compute")), " | ",
        Cell(results.Median(s, "server_copy_xxh3", "compute")), " | ",
        Cell(results.Median(s, "server_summarize", "compute")), " | ",
        Cell(results.Median(s, "server_put_floor", "compute")), " (",
        RatioCell(results.Find(s, "server_put_floor", "compute"), results.Find(s, "memcpy", "copy"),
                  0),
        ") | ", Cell(results.Median(s, "server_put_fused", "compute")), " (",
        RatioCell(results.Find(s, "server_put_fused", "compute"), results.Find(s, "memcpy", "copy"),
                  0),
        ") | ", it == results.summary_bytes.end() ? std::string("n/a") : absl::StrCat(it->second),
        " |\n");
  }
  absl::StrAppend(
      &md,
      "\nMetadata RAM per block (4 KiB blocks, head_dim 128, 1 layer; goal <= 600 B of heap):"
      "\n\n| daemon settings | blocks | heap B/block (mallinfo2) | summary bytes per block "
      "| heap minus summary bytes | anon RSS B/block | "
      "Stats() estimate | goal met |\n|---|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < meta.size(); ++i) {
    const MetadataResult& m = meta[i];
    // RSS only grows for the first probe: later ones reuse the pages the
    // earlier daemons freed.
    const std::string rss =
        i == 0 ? absl::StrFormat("%.0f", m.anon_rss_bytes_per_block) : std::string("n/a");
    absl::StrAppend(&md, "| ", m.label, " | ", m.blocks, " | ",
                    absl::StrFormat("%.0f", m.heap_bytes_per_block), " | ", m.summary_bytes, " | ",
                    absl::StrFormat("%.0f", m.heap_bytes_per_block - m.summary_bytes), " | ", rss,
                    " | ", m.estimate_bytes_per_block, " | ",
                    Verdict(m.heap_bytes_per_block, 600, true), " |\n");
  }
  return md;
}

absl::Status WriteFiles(const std::string& out_dir, const std::string& md, const Results& results,
                        const std::vector<MetadataResult>& meta) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("out-dir ", out_dir, ": ", ec.message()));
  std::ofstream(out_dir + "/results.md") << md;
  std::ofstream csv(out_dir + "/results.csv");
  csv << "block_bytes,method,op,bytes_per_rep,reps,median_gbps,min_gbps,max_gbps\n";
  for (const Sample& s : results.samples) {
    csv << absl::StrFormat("%d,%s,%s,%d,%d,%.4f,%.4f,%.4f\n", s.block_bytes, s.method, s.op,
                           s.bytes, s.seconds.size(), s.MedianGBps(), s.MinGBps(), s.MaxGBps());
  }
  std::ofstream mcsv(out_dir + "/metadata.csv");
  mcsv << "settings,blocks,block_bytes,heap_bytes_per_block,summary_bytes,"
          "anon_rss_bytes_per_block,estimate_bytes_per_block,put_seconds\n";
  for (const MetadataResult& m : meta) {
    mcsv << absl::StrFormat("\"%s\",%d,%d,%.1f,%d,%.1f,%d,%.3f\n", m.label, m.blocks, m.block_bytes,
                            m.heap_bytes_per_block, m.summary_bytes, m.anon_rss_bytes_per_block,
                            m.estimate_bytes_per_block, m.put_seconds);
  }
  if (!csv || !mcsv) return absl::InternalError(absl::StrCat("cannot write into ", out_dir));
  return absl::OkStatus();
}

absl::Status Run(const Args& args) {
  std::vector<uint64_t> sizes;
  for (const std::string& s : args.block_sizes) {
    auto v = daemon::ParseSize(s);
    if (!v.ok())
      return absl::InvalidArgumentError(absl::StrCat("block-sizes: ", v.status().message()));
    sizes.push_back(*v);
  }
  auto total = daemon::ParseSize(args.total);
  auto host = daemon::ParseSize(args.host);
  auto staging = daemon::ParseSize(args.staging);
  auto device = daemon::ParseSize(args.device);
  for (const auto* v : {&total, &host, &staging, &device}) {
    if (!v->ok()) return v->status();
  }
  if (*total > *host || *total > *staging) {
    return absl::InvalidArgumentError("total: the working set must fit the host and staging tiers");
  }
  if (args.batch_blocks == 0 || args.reps == 0) {
    return absl::InvalidArgumentError("batch-blocks and reps must be > 0");
  }
  const std::string base =
      args.data_dir.empty() ? absl::StrCat("/tmp/kvtier-putget-", ::getpid()) : args.data_dir;
  std::error_code ec;
  std::filesystem::create_directories(base, ec);
  if (ec) return absl::InternalError(absl::StrCat("data-dir ", base, ": ", ec.message()));
  // Destroyed last: after the daemon and redis-server below have stopped.
  struct RemoveOnExit {
    std::string dir;
    ~RemoveOnExit() {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  } remove_on_exit{base};
  const std::string load_before = LoadAverage();

  std::vector<MetadataResult> meta;
  const std::vector<std::pair<std::string, std::vector<std::string>>> probes = {
      {"daemon defaults", {}},
      {"tiers.placement=lru, index.summary_bounds=false, index.summary_per_layer=false",
       {"tiers.placement=lru", "index.summary_bounds=false", "index.summary_per_layer=false"}}};
  for (const auto& [label, overrides] : probes) {
    std::fprintf(stderr, "metadata probe (%s): %llu blocks of 4 KiB\n", label.c_str(),
                 static_cast<unsigned long long>(args.metadata_blocks));
    auto m = MeasureMetadata(base + "/metadata", args.metadata_blocks, label, overrides);
    if (!m.ok()) return m.status();
    std::fprintf(
        stderr, "  heap %.0f B/block (summary %llu B), anon RSS %.0f B/block, estimate %llu\n",
        m->heap_bytes_per_block, static_cast<unsigned long long>(m->summary_bytes),
        m->anon_rss_bytes_per_block, static_cast<unsigned long long>(m->estimate_bytes_per_block));
    meta.push_back(*m);
  }

  std::unique_ptr<RedisServer> redis;
  std::unique_ptr<RedisClient> redis_tcp, redis_unix;
  if (args.Enabled("redis_tcp") || (args.redis_unix && args.Enabled("redis_unix"))) {
    std::filesystem::create_directories(base + "/redis", ec);
    auto server = RedisServer::Start(args.redis_server, base + "/redis", std::chrono::seconds(10));
    if (!server.ok()) return server.status();
    redis = std::move(*server);
  }
  if (redis != nullptr && args.Enabled("redis_tcp")) {
    auto c = RedisClient::ConnectTcp(redis->port());
    if (!c.ok()) return c.status();
    redis_tcp = std::move(*c);
  }
  if (redis != nullptr && args.redis_unix && args.Enabled("redis_unix")) {
    auto c = RedisClient::ConnectUnix(redis->unix_socket());
    if (!c.ok()) return c.status();
    redis_unix = std::move(*c);
  }

  KvtierOptions options;
  options.data_dir = base + "/kvtier";
  options.host_bytes = *host;
  options.staging_bytes = *staging;
  options.device_bytes = *device;
  options.extra_overrides = args.daemon_settings;
  auto kv = KvtierPaths::Start(options);
  if (!kv.ok()) return kv.status();

  Results results;
  for (uint64_t s : sizes) {
    absl::Status st =
        RunBlockSize(args, s, *total, kv->get(), redis_tcp.get(), redis_unix.get(), &results);
    if (!st.ok()) return st;
  }
  kv->reset();
  redis_tcp.reset();
  redis_unix.reset();
  std::string version = "(not run)";
  if (redis != nullptr) {
    version = redis->version();
    if (absl::Status st = redis->Stop(); !st.ok()) return st;
  }

  const std::string md = Report(args, sizes, *total, results, meta, version, load_before);
  std::fputs(md.c_str(), stdout);
  return WriteFiles(args.out_dir, md, results, meta);
}

int Main(int argc, char** argv) {
  kvtier::bench::Args args;
  CLI::App app{"kvtierd Put/Get throughput vs memcpy and redis-server, and metadata RAM/block"};
  app.add_option("--block-sizes", args.block_sizes, "block sizes, e.g. 256KiB 2MiB")
      ->delimiter(',');
  app.add_option("--total", args.total, "working set per block size (fits host and staging)");
  app.add_option("--batch-blocks", args.batch_blocks, "blocks per message / pipeline");
  app.add_option("--reps", args.reps, "timed repetitions (median reported)");
  app.add_option("--warmup", args.warmup, "untimed repetitions first");
  app.add_option("--out-dir", args.out_dir, "where results.md/.csv and metadata.csv go");
  app.add_option("--data-dir", args.data_dir, "scratch directory (removed at the end)");
  app.add_option("--redis-server", args.redis_server, "redis-server binary");
  app.add_flag("--redis-unix,!--no-redis-unix", args.redis_unix,
               "also measure Redis over its Unix socket");
  app.add_option("--metadata-blocks", args.metadata_blocks, "blocks stored by the metadata probe");
  app.add_option("--host", args.host, "kvtierd host tier capacity");
  app.add_option("--staging", args.staging, "kvtierd staging area");
  app.add_option("--device", args.device, "kvtierd device (shm arena) capacity");
  app.add_option("--set", args.daemon_settings,
                 "daemon setting over its embedded defaults, KEY=VALUE (repeatable), e.g. "
                 "server.put_parallelism=1");
  app.add_option(
         "--methods", args.methods,
         "only these: "
         "memcpy,server_work,kvtier_grpc_bytes,kvtier_grpc_direct,kvtier_shm,redis_tcp,redis_unix")
      ->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  kvtier::daemon::InitLogging("warn", kvtier::daemon::LogFormat::kText);
  absl::Status st = kvtier::bench::Run(args);
  if (!st.ok()) {
    std::fprintf(stderr, "kvtier_putget_bench: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace kvtier::bench

int main(int argc, char** argv) {
  try {
    return kvtier::bench::Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvtier_putget_bench: %s\n", e.what());
    return 1;
  }
}
