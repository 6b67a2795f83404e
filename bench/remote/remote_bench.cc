// kvtier_remote_bench: the remote tier against the cluster it sits on, in
// one run, on a Redis Cluster started by the bench (3 masters, no replicas,
// loopback).
//
//  1. Remote get throughput. Daemon A puts --blocks blocks and publishes
//     them. Then, in alternating rounds:
//       raw      --threads threads GET the same values straight from the
//                cluster (the same cluster client kvtierd uses; each value
//                copied out of the reply, as a client must);
//       bytes    a daemon B with nothing local serves them with
//                GetBlocks(BYTES), --batch ids per call, --threads callers
//                (Client::GetBlockData: one copy into a reused buffer; a
//                Client per thread, each on its own connection unless
//                --shared-connection),
//                first fresh (other ids of the same size: its first reads
//                after start), then warm (those deleted, these read);
//       handles  the same with GetBlocks(HANDLES): what an engine uses
//                (the block lands in B's arena; no bytes on the socket).
//     Reported as GB/s of payload and as ratios to raw (goal >= 0.8).
//  2. Shared-prefix hit rate. --requests requests over --prefixes shared
//     prefixes of --prefix-blocks blocks, each with --unique-blocks blocks
//     of its own; the requests of one prefix alternate between daemons A and
//     B. An engine Lookup()s the request's chain, takes handles for the
//     prefix found, and puts the rest (as if it computed them). The hit rate
//     is blocks found / blocks asked for, per daemon, with the remote tier
//     and with two daemons that do not share one.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "daemon/config.h"
#include "daemon/server.h"
#include "storage/remote/redis/redis_cluster.h"
#include "storage/remote/remote_format.h"
#include "tests/testutil/redis_cluster.h"

namespace kvtier::bench {
namespace {

struct Args {
  uint32_t layers = 4;  // 4 x 2 x 8 heads x 16 tokens x 128 x fp16 = 256 KiB
  uint32_t blocks = 256;
  uint32_t threads = 4;
  uint32_t batch = 8;
  uint32_t reps = 3;
  bool own_connections = true;
  uint32_t prefixes = 8, prefix_blocks = 16, unique_blocks = 4, requests = 64;
  std::string out;
};

v1::ModelProfile Profile(const Args& a) {
  v1::ModelProfile p;
  p.set_name("remote-bench");
  p.set_revision("1");
  p.set_num_layers(a.layers);
  p.set_num_kv_heads(8);
  p.set_head_dim(128);
  p.set_block_size_tokens(16);
  p.set_dtype(v1::DTYPE_FP16);
  return p;
}

uint64_t BlockBytes(const Args& a) { return uint64_t{a.layers} * 2 * 8 * 16 * 128 * 2; }

// Finite fp16 payloads (the daemon summarises them).
std::string Block(uint64_t seed, uint64_t bytes) {
  std::string data(bytes, '\0');
  std::mt19937_64 rng(seed * 7919 + 5);
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    uint64_t v = (rng() & 0x83FF83FF83FF83FFull) | 0x3800380038003800ull;
    std::memcpy(&data[i], &v, 8);
  }
  return data;
}

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

[[noreturn]] void Die(const std::string& what, const absl::Status& st) {
  std::cerr << "kvtier_remote_bench: " << what << ": " << st << "\n";
  std::exit(1);
}

struct Daemon {
  std::unique_ptr<daemon::Server> server;
  std::unique_ptr<Client> client;
  uint64_t profile_id = 0;
};

Daemon StartDaemon(const std::string& dir, const std::string& seeds, const Args& a,
                   const std::vector<std::string>& extra = {}) {
  std::filesystem::remove_all(dir);
  std::vector<std::string> o = {
      "server.data_dir=" + dir,         "log.level=error",
      "server.shutdown_grace_ms=200",   "tiers.device.capacity_bytes=1GiB",
      "tiers.host.capacity_bytes=2GiB", "tiers.nvme.file_count=1",
      "tiers.nvme.file_size_bytes=1GiB"};
  if (!seeds.empty()) o.push_back("tiers.remote.redis_cluster=" + seeds);
  o.insert(o.end(), extra.begin(), extra.end());
  auto config = daemon::LoadConfig("", o);
  if (!config.ok()) Die("config", config.status());
  Daemon d;
  auto server = daemon::Server::Start(*config);
  if (!server.ok()) Die("kvtierd", server.status());
  d.server = std::move(*server);
  auto client = Client::Connect(d.server->socket_path());
  if (!client.ok()) Die("connect", client.status());
  d.client = std::move(*client);
  auto profile = d.client->RegisterProfile(Profile(a));
  if (!profile.ok()) Die("profile", profile.status());
  d.profile_id = profile->profile_id();
  return d;
}

void Put(Daemon& d, const std::vector<std::string>& ids, uint64_t bytes) {
  for (size_t i = 0; i < ids.size(); i += 16) {
    v1::PutBlocksRequest req;
    req.set_profile_id(d.profile_id);
    for (size_t j = i; j < std::min(ids.size(), i + 16); ++j) {
      v1::BlockPut* b = req.add_blocks();
      b->set_block_id(ids[j]);
      b->set_data(Block(std::hash<std::string>()(ids[j]), bytes));
    }
    auto put = d.client->PutBlocks({req});
    if (!put.ok()) Die("put", put.status());
  }
}

void WaitPublished(Daemon& d, uint64_t n) {
  for (;;) {
    auto stats = d.client->Stats();
    if (!stats.ok()) Die("stats", stats.status());
    if (stats->remote().published() + stats->remote().publish_failed() +
            stats->remote().publish_dropped() >=
        n) {
      if (stats->remote().published() < n) {
        Die("publish", absl::InternalError(absl::StrCat(stats->remote().published(), " of ", n,
                                                        " blocks published")));
      }
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling a counter
  }
}

// Waits until the daemon reports its memory tiers pre-faulted
// (tiers.host.prefault); returns the seconds waited.
double WaitPrefaulted(Daemon& d) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    auto stats = d.client->Stats();
    if (!stats.ok()) Die("stats", stats.status());
    bool done = true;
    for (const v1::TierStats& t : stats->tiers()) {
      done &= t.prefaulted_bytes() + t.prefault_failed_bytes() >= t.prefault_target_bytes();
    }
    if (done) return Seconds(std::chrono::steady_clock::now() - start);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling a counter
  }
}

// Runs fn(thread, index) for every index in [0, n), split over threads;
// returns the wall time.
template <typename Fn>
double Parallel(uint32_t threads, size_t n, uint32_t step, Fn fn) {
  std::atomic<size_t> next{0};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (uint32_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (size_t i; (i = next.fetch_add(step)) < n;) fn(t, i);
    });
  }
  for (auto& th : pool) th.join();
  return Seconds(std::chrono::steady_clock::now() - start);
}

struct Throughput {
  // GB/s per rep. cold: a fresh daemon's first reads (its arenas' pages
  // are touched for the first time); warm: the same daemon after it read
  // and deleted as many other blocks (slots reused, as in steady state).
  std::vector<double> raw, bytes_cold, bytes, handles_cold, handles;
  // The same reads once the blocks are local to the reader: what the
  // GetBlocks path costs without the remote tier.
  std::vector<double> bytes_local, handles_local;
  std::vector<double> prefault_s;  // a fresh reader's wait for its pre-fault
};

Throughput MeasureGets(const Args& a, const std::string& seeds, const std::string& root) {
  const uint64_t bytes = BlockBytes(a);
  std::vector<std::string> ids;
  std::vector<std::string> warm_ids;
  for (uint32_t i = 0; i < a.blocks; ++i) ids.push_back(absl::StrCat("tp-", i));
  Daemon writer = StartDaemon(root + "/writer", seeds, a);
  Put(writer, ids, bytes);
  WaitPublished(writer, ids.size());

  ModelProfile shape;
  shape.name = "remote-bench";
  shape.revision = "1";
  shape.layers = a.layers;
  shape.kv_heads = 8;
  shape.head_dim = 128;
  shape.block_size_tokens = 16;
  shape.dtype = KvDtype::kFp16;
  const uint64_t fp = remote::ProfileFingerprint(shape);
  std::vector<std::string> keys;
  keys.reserve(ids.size());
  for (const auto& id : ids) keys.push_back(remote::RemoteKey(BlockKey{"default", 0, id}, fp));
  remote::RedisClusterOptions co;
  co.seeds = absl::StrSplit(seeds, ',');
  auto cluster = remote::RedisCluster::Create(co);
  if (!cluster.ok()) Die("cluster client", cluster.status());

  Throughput out;
  const double total_gb = static_cast<double>(bytes) * ids.size() / 1e9;
  for (uint32_t rep = 0; rep < a.reps; ++rep) {
    std::atomic<uint64_t> errors{0};
    absl::Mutex first_mu;
    std::string first_error;
    auto note = [&](const std::string& what) {
      ++errors;
      absl::MutexLock l(&first_mu);
      if (first_error.empty()) first_error = what;
    };
    // raw
    std::vector<std::string> sinks(a.threads);
    std::vector<std::string> dst_bufs(a.threads, std::string(bytes * a.batch, '\0'));
    double s = Parallel(a.threads, keys.size(), 1, [&](uint32_t t, size_t i) {
      auto got = (*cluster)->Get(keys[i], [&](std::string_view v) { sinks[t].assign(v); });
      if (!got.ok())
        note(absl::StrCat("raw GET ", keys[i], ": ", got.status().ToString()));
      else if (!*got)
        note(absl::StrCat("raw GET ", keys[i], ": no such key"));
    });
    out.raw.push_back(total_gb / s);
    // bytes / handles from a fresh daemon each
    for (int mode = 0; mode < 2; ++mode) {
      Daemon reader = StartDaemon(absl::StrCat(root, "/reader-", rep, "-", mode), seeds, a);
      // Cold: the blocks this round measures are first written (under other
      // ids), read by the fresh reader, then deleted everywhere.
      std::vector<std::string> round_warm;
      for (uint32_t i = 0; i < a.blocks; ++i) {
        round_warm.push_back(absl::StrCat("warm-", rep, "-", mode, "-", i));
      }
      Put(writer, round_warm, bytes);
      WaitPublished(writer, ids.size() + warm_ids.size() + round_warm.size());
      warm_ids.insert(warm_ids.end(), round_warm.begin(), round_warm.end());
      // Fresh: reads start once the daemon reports its arenas pre-faulted,
      // as an engine would start after a readiness check.
      out.prefault_s.push_back(WaitPrefaulted(reader));
      // BYTES readers: a Client per thread, each with its own connection
      // (several threads' large responses on one shared connection run at
      // a fraction of one thread's rate on this VM: docs/BENCHMARKS.md).
      std::vector<std::unique_ptr<Client>> readers;
      for (uint32_t t = 0; t < a.threads; ++t) {
        ClientOptions co;
        co.own_connection = a.own_connections;
        auto c = Client::Connect(reader.server->socket_path(), co);
        if (!c.ok()) Die("connect", c.status());
        readers.push_back(std::move(*c));
      }
      for (int pass = 0; pass < 3; ++pass) {
        const std::vector<std::string>& read = pass == 0 ? round_warm : ids;
        s = Parallel(a.threads, read.size(), a.batch, [&](uint32_t t, size_t i) {
          const size_t end = std::min(read.size(), i + a.batch);
          if (mode == 0) {
            // BYTES as a client reads them: GetBlockData copies each block
            // once, from the received slices into the caller's buffer
            // (reused, as the raw GET's sink is).
            std::vector<BlockDestination> dst;
            for (size_t j = i; j < end; ++j) {
              dst.push_back({read[j], absl::MakeSpan(reinterpret_cast<uint8_t*>(dst_bufs[t].data() +
                                                                                (j - i) * bytes),
                                                     bytes)});
            }
            auto r = readers[t]->GetBlockData(reader.profile_id, dst, a.batch);
            if (!r.ok()) {
              note(absl::StrCat("GetBlockData: ", r.status().ToString()));
              return;
            }
            for (const BlockDataResult& b : *r) {
              // A fresh reader holds nothing: every block comes from the cluster.
              const v1::Tier want = pass == 2 ? b.tier : v1::TIER_REMOTE;
              if (!b.status.ok() || b.tier != want) {
                note(absl::StrCat("GetBlockData: ", b.status.ToString(), ", tier ",
                                  v1::Tier_Name(b.tier)));
              }
            }
            return;
          }
          v1::GetBlocksRequest get;
          get.set_profile_id(reader.profile_id);
          for (size_t j = i; j < end; ++j) get.add_block_ids(read[j]);
          get.set_mode(v1::RETURN_MODE_HANDLES);
          uint64_t lease = 0;
          auto r = reader.client->GetBlocks(get, &lease);
          if (!r.ok()) {
            note(absl::StrCat("GetBlocks: ", r.status().ToString()));
            return;
          }
          for (const auto& b : *r) {
            // A handle points at the device copy made from the cluster's.
            if (b.status().code() != 0 || b.tier() != v1::TIER_DEVICE) {
              note(absl::StrCat("GetBlocks HANDLES: code ", b.status().code(), " ",
                                b.status().message(), ", tier ", v1::Tier_Name(b.tier())));
            }
          }
          if (lease != 0) {
            v1::ReleaseRequest rel;
            rel.set_lease_id(lease);
            reader.client->Release(rel).IgnoreError();
          }
        });
        if (pass == 0) {
          (mode == 0 ? out.bytes_cold : out.handles_cold).push_back(total_gb / s);
          for (size_t i = 0; i < round_warm.size(); i += a.batch) {
            v1::DeleteBlocksRequest del;
            del.set_profile_id(reader.profile_id);
            for (size_t j = i; j < std::min(round_warm.size(), i + a.batch); ++j) {
              del.add_block_ids(round_warm[j]);
            }
            auto d = reader.client->DeleteBlocks(del);
            if (!d.ok()) note(absl::StrCat("DeleteBlocks: ", d.status().ToString()));
          }
        } else if (pass == 1) {
          (mode == 0 ? out.bytes : out.handles).push_back(total_gb / s);
        } else {
          (mode == 0 ? out.bytes_local : out.handles_local).push_back(total_gb / s);
        }
      }
    }
    if (errors != 0) {
      Die("gets",
          absl::InternalError(absl::StrCat(errors.load(), " reads failed; first: ", first_error)));
    }
  }
  return out;
}

struct HitRate {
  uint64_t asked[2] = {0, 0}, found[2] = {0, 0};
};

// Block ids start with `tag`: runs on one cluster do not see each other's.
HitRate SharedPrefix(const Args& a, const std::string& seeds, const std::string& root,
                     const std::string& tag, const std::vector<std::string>& extra = {}) {
  const uint64_t bytes = BlockBytes(a);
  Daemon d[2] = {StartDaemon(root + "/a", seeds, a, extra),
                 StartDaemon(root + "/b", seeds, a, extra)};
  HitRate h;
  for (uint32_t r = 0; r < a.requests; ++r) {
    const uint32_t prefix = r % a.prefixes;
    const int which = static_cast<int>((r / a.prefixes) % 2);
    std::vector<std::string> chain;
    for (uint32_t i = 0; i < a.prefix_blocks; ++i)
      chain.push_back(absl::StrCat(tag, "p", prefix, "-", i));
    for (uint32_t i = 0; i < a.unique_blocks; ++i) {
      chain.push_back(absl::StrCat(tag, "r", r, "-", i));
    }
    v1::LookupRequest lookup;
    lookup.set_profile_id(d[which].profile_id);
    for (const auto& id : chain) lookup.add_block_ids(id);
    auto found = d[which].client->Lookup(lookup);
    if (!found.ok()) Die("lookup", found.status());
    uint32_t hit = 0;
    if (found->prefix_blocks() > 0) {
      v1::GetBlocksRequest get;
      get.set_profile_id(d[which].profile_id);
      for (uint32_t i = 0; i < found->prefix_blocks(); ++i) get.add_block_ids(chain[i]);
      get.set_mode(v1::RETURN_MODE_HANDLES);
      uint64_t lease = 0;
      auto got = d[which].client->GetBlocks(get, &lease);
      if (!got.ok()) Die("get", got.status());
      while (hit < got->size() && (*got)[hit].status().code() == 0) ++hit;
      v1::ReleaseRequest rel;
      rel.set_lease_id(lease);
      if (lease != 0) d[which].client->Release(rel).IgnoreError();
    }
    h.asked[which] += chain.size();
    h.found[which] += hit;
    Put(d[which], std::vector<std::string>(chain.begin() + hit, chain.end()), bytes);
    if (!seeds.empty()) WaitPublished(d[which], 0);  // nothing to wait for; keeps order simple
  }
  return h;
}

std::string Range(const std::vector<double>& v) {
  return absl::StrFormat("%.2f-%.2f", *std::min_element(v.begin(), v.end()),
                         *std::max_element(v.begin(), v.end()));
}
std::vector<double> Ratio(const std::vector<double>& x, const std::vector<double>& raw) {
  std::vector<double> r;
  for (size_t i = 0; i < x.size(); ++i) r.push_back(x[i] / raw[i]);
  return r;
}

int Main(int argc, char** argv) {
  Args a;
  CLI::App app{"kvtier remote tier vs raw Redis Cluster GET, and shared-prefix hit rate"};
  app.add_option("--layers", a.layers, "profile layers (block = layers x 64 KiB)");
  app.add_option("--blocks", a.blocks, "blocks read per round");
  app.add_option("--threads", a.threads, "concurrent readers");
  app.add_option("--batch", a.batch, "ids per GetBlocks call");
  app.add_option("--reps", a.reps, "alternating rounds");
  app.add_flag("!--shared-connection", a.own_connections,
               "BYTES readers share one connection (gRPC's default)");
  app.add_option("--requests", a.requests, "shared-prefix requests");
  app.add_option("--prefixes", a.prefixes, "distinct shared prefixes");
  app.add_option("--prefix-blocks", a.prefix_blocks, "blocks per prefix");
  app.add_option("--unique-blocks", a.unique_blocks, "blocks of each request's own");
  app.add_option("--out", a.out, "also write the markdown report here");
  CLI11_PARSE(app, argc, argv);

  const std::string root = "/tmp/kvtier-remote-bench-" + std::to_string(::getpid());
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root + "/redis");
  testing::RedisClusterFixtureOptions fo;
  fo.dir = root + "/redis";
  fo.masters = 3;
  fo.replicas_per_master = 0;
  auto cluster = testing::RedisClusterFixture::Start(fo);
  if (!cluster.ok()) Die("redis cluster", cluster.status());
  const std::string seeds = absl::StrJoin((*cluster)->Seeds(), ",");

  const Throughput t = MeasureGets(a, seeds, root + "/tp");
  const HitRate shared = SharedPrefix(a, seeds, root + "/shared", "through-");
  const HitRate alone = SharedPrefix(a, "", root + "/alone", "alone-");
  // Write-back with a host tier that holds a quarter of the blocks put:
  // what leaves it is published, the rest stays private.
  const uint64_t blocks_put =
      uint64_t{a.prefixes} * a.prefix_blocks + uint64_t{a.requests} * a.unique_blocks;
  const HitRate back =
      SharedPrefix(a, seeds, root + "/back", "back-",
                   {"tiers.remote.publish_policy=write-back",
                    absl::StrCat("tiers.host.capacity_bytes=", blocks_put / 4 * BlockBytes(a)),
                    absl::StrCat("tiers.device.capacity_bytes=", blocks_put / 8 * BlockBytes(a))});

  std::string md = absl::StrFormat(
      "## Remote tier (Redis Cluster, 3 masters, loopback)\n\n"
      "%u blocks of %s KiB, %u threads, %u ids per GetBlocks, %u rounds; GB/s of payload "
      "(range over rounds). A fresh daemon's reads start once it reports its memory tiers "
      "pre-faulted (host, staging and arena: %ss after start).\n\n"
      "| path | GB/s | / raw GET (goal >= 0.8) |\n|---|---|---|\n"
      "| raw GET through the cluster client | %s | 1 |\n"
      "| kvtier GetBlocks BYTES, remote only, warm daemon | %s | %s |\n"
      "| kvtier GetBlocks HANDLES, remote only, warm daemon | %s | %s |\n"
      "| kvtier GetBlocks BYTES, remote only, fresh daemon | %s | %s |\n"
      "| kvtier GetBlocks HANDLES, remote only, fresh daemon | %s | %s |\n"
      "| (same blocks once local to B) GetBlocks BYTES | %s | %s |\n"
      "| (same blocks once local to B) GetBlocks HANDLES | %s | %s |\n\n",
      a.blocks, std::to_string(BlockBytes(a) >> 10), a.threads, a.batch, a.reps,
      Range(t.prefault_s), Range(t.raw), Range(t.bytes), Range(Ratio(t.bytes, t.raw)),
      Range(t.handles), Range(Ratio(t.handles, t.raw)), Range(t.bytes_cold),
      Range(Ratio(t.bytes_cold, t.raw)), Range(t.handles_cold), Range(Ratio(t.handles_cold, t.raw)),
      Range(t.bytes_local), Range(Ratio(t.bytes_local, t.raw)), Range(t.handles_local),
      Range(Ratio(t.handles_local, t.raw)));
  auto rate = [](const HitRate& h, int i) {
    return absl::StrFormat("%.3f (%u/%u)", h.asked[i] ? double(h.found[i]) / h.asked[i] : 0.0,
                           h.found[i], h.asked[i]);
  };
  md += absl::StrFormat(
      "Shared prefixes: %u requests, %u prefixes x %u blocks + %u own blocks each; a prefix's "
      "requests alternate between daemons A and B.\n\n"
      "| setup | hit rate A | hit rate B |\n|---|---|---|\n"
      "| A and B share the remote tier (write-through, the default) | %s | %s |\n"
      "| A and B share the remote tier (write-back, host tier = 1/4 of the blocks) | %s | %s |\n"
      "| A and B without a remote tier | %s | %s |\n",
      a.requests, a.prefixes, a.prefix_blocks, a.unique_blocks, rate(shared, 0), rate(shared, 1),
      rate(back, 0), rate(back, 1), rate(alone, 0), rate(alone, 1));
  std::cout << md;
  if (!a.out.empty()) std::ofstream(a.out) << md;
  std::filesystem::remove_all(root);
  return 0;
}

}  // namespace
}  // namespace kvtier::bench

int main(int argc, char** argv) {
  try {
    return kvtier::bench::Main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "kvtier_remote_bench: " << e.what() << "\n";
    return 1;
  }
}
