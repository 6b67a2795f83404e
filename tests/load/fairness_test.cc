// Fairness between tenants (issue 31, finding 5): tenant b's PutBlocks and
// GetBlocks latency alone, then while tenant a floods the daemon with
// concurrent durable puts, against the real kvtierd (a child process) with
// its shipped I/O settings. Prints b's p50/p99 in both phases and their
// ratio; KVTIER_FAIRNESS_REPORT=path writes them as JSON.
//
// Passes when every one of b's calls succeeded with the right bytes in both
// phases and b's p99 under the flood stays within
// KVTIER_FAIRNESS_MAX_RATIO (default 10) times its p99 alone. The issue's
// goal is 3x; docs/RELIABILITY.md has the measured ratios and why the CI
// bound is looser (the flood and the daemon share two cores there).
//
// Knobs: KVTIER_FAIRNESS_SECONDS (3, each phase), KVTIER_FAIRNESS_FLOODERS
// (32 streams of a), KVTIER_FAIRNESS_SET ("section.key=value;..." for
// kvtierd), KVTIER_FAIRNESS_MAX_RATIO.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "kvtier/v1/kvtier.grpc.pb.h"
#include "proto/auth/token.h"
#include "tests/load/load_block.h"
#include "tests/load/load_daemon.h"
#include "tests/testutil/http_get.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

namespace kvtier::load {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kBlockBytes = 64 << 10;

double EnvDouble(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0' ? fallback : std::atof(v);
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

struct Phase {
  std::vector<double> put_ms, get_ms;
  uint64_t failures = 0;
  std::string first_failure;
  void Fail(const std::string& what) {
    if (failures++ == 0) first_failure = what;
  }
};

class FairnessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream tenants(dir_ + "/tenants.toml");
    for (const char* name : {"a", "b"}) {
      tokens_[name] = auth::NewToken();
      tenants << "[[tenants]]\nname = \"" << name << "\"\nrole = \"data\"\ntoken_sha256 = [\""
              << auth::HashToken(tokens_[name]) << "\"]\n";
    }
  }
  void TearDown() override {
    daemon_.reset();
    if (HasFailure()) tmp_.Keep();  // the daemon's log
  }

  std::unique_ptr<Client> As(const std::string& tenant) {
    ClientOptions options;
    options.token = tokens_[tenant];
    auto c = Client::Connect(daemon_->socket_path(), options);
    EXPECT_OK(c) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // b's loop: put one durable block, read it back, until `until`.
  static void Victim(Client* c, uint64_t profile, Clock::time_point until, uint64_t* seq,
                     Phase* out) {
    while (Clock::now() < until) {
      const std::string id = BlockId(1, (*seq)++);
      v1::PutBlocksRequest put;
      put.set_profile_id(profile);
      put.set_durable(true);
      v1::BlockPut* b = put.add_blocks();
      b->set_block_id(id);
      b->set_data(Payload(id, kBlockBytes));
      auto t0 = Clock::now();
      auto stored = c->PutBlocks({put});
      auto t1 = Clock::now();
      if (!stored.ok() || stored->results_size() != 1 || stored->results(0).status().code() != 0) {
        out->Fail(stored.ok() ? stored->DebugString() : stored.status().ToString());
        continue;
      }
      out->put_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      v1::GetBlocksRequest get;
      get.set_profile_id(profile);
      get.add_block_ids(id);
      t0 = Clock::now();
      auto got = c->GetBlocks(get);
      t1 = Clock::now();
      if (!got.ok() || got->size() != 1 ||
          !ComparePayload(id, kBlockBytes, (*got)[0].data().data(), (*got)[0].data().size())
               .empty()) {
        out->Fail(got.ok() ? "wrong bytes or count" : got.status().ToString());
        continue;
      }
      out->get_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
  }

  // The shipped settings with small tiers in this test's folders.
  std::vector<std::string> Settings() const {
    std::vector<std::string> settings = {"log.level=warn",
                                         "server.shutdown_grace_ms=2000",
                                         "tiers.device.backend=shm",
                                         "tiers.device.shm_dir=" + shm_dir_,
                                         "tiers.host.shm_dir=" + shm_dir_,
                                         "tiers.device.capacity_bytes=16MiB",
                                         "tiers.host.capacity_bytes=128MiB",
                                         "tiers.nvme.file_count=2",
                                         "tiers.nvme.file_size_bytes=1GiB",
                                         "auth.tenants_file=" + dir_ + "/tenants.toml",
                                         "auth.tenant_arena_bytes=4MiB",
                                         "auth.tenant_staging_bytes=1MiB"};
    const char* extra = std::getenv("KVTIER_FAIRNESS_SET");
    for (absl::string_view s : absl::StrSplit(extra ? extra : "", ';', absl::SkipWhitespace())) {
      settings.emplace_back(s);
    }
    return settings;
  }

  ::kvtier::testing::ScopedTempDir tmp_{"fair"}, shm_{"fair", "/dev/shm"};
  const std::string dir_ = tmp_.path(), shm_dir_ = shm_.path();
  std::map<std::string, std::string> tokens_;
  std::unique_ptr<LoadDaemon> daemon_;
};

TEST_F(FairnessTest, OneTenantsFloodOfDurablePutsDoesNotStarveAnother) {
  const auto phase = std::chrono::milliseconds(
      static_cast<int64_t>(EnvDouble("KVTIER_FAIRNESS_SECONDS", 3) * 1000));
  const int flooders = static_cast<int>(EnvDouble("KVTIER_FAIRNESS_FLOODERS", 32));
  const double max_ratio = EnvDouble("KVTIER_FAIRNESS_MAX_RATIO", 10);
  daemon_ = std::make_unique<LoadDaemon>(KVTIERD_PATH, dir_, Settings());
  std::string error;
  ASSERT_TRUE(daemon_->Start(std::chrono::seconds(60), &error)) << error;

  auto b = As("b");
  auto profile_b = b->RegisterProfile(LoadProfile(kBlockBytes));
  ASSERT_OK(profile_b) << profile_b.status();
  uint64_t seq = 0;
  Phase warm, alone, flooded;
  Victim(b.get(), profile_b->profile_id(), Clock::now() + std::chrono::milliseconds(300), &seq,
         &warm);
  Victim(b.get(), profile_b->profile_id(), Clock::now() + phase, &seq, &alone);

  // a: `flooders` streams, each putting 4 new durable blocks per message
  // and deleting what it put 64 messages ago (the tiers stay within size).
  auto a_setup = As("a");
  auto profile_a = a_setup->RegisterProfile(LoadProfile(kBlockBytes));
  ASSERT_OK(profile_a) << profile_a.status();
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> a_puts{0}, a_refused{0};
  absl::Mutex refusal_mu;
  std::string first_refusal;
  std::vector<std::thread> flood;
  flood.reserve(flooders);
  for (int f = 0; f < flooders; ++f) {
    flood.emplace_back([&, f] {
      auto a = As("a");
      if (a == nullptr) return;
      for (uint64_t n = 0; !stop.load(); ++n) {
        v1::PutBlocksRequest put;
        put.set_profile_id(profile_a->profile_id());
        put.set_durable(true);
        for (uint64_t i = 0; i < 4; ++i) {
          v1::BlockPut* blk = put.add_blocks();
          blk->set_block_id(BlockId(100 + f, n * 4 + i));
          blk->set_data(Payload(blk->block_id(), kBlockBytes));
        }
        auto r = a->PutBlocks({put});
        (r.ok() ? a_puts : a_refused).fetch_add(1);
        if (!r.ok()) {
          absl::MutexLock lock(&refusal_mu);
          if (first_refusal.empty()) first_refusal = r.status().ToString();
        }
        if (n >= 64) {
          v1::DeleteBlocksRequest del;
          del.set_profile_id(profile_a->profile_id());
          for (uint64_t i = 0; i < 4; ++i) del.add_block_ids(BlockId(100 + f, (n - 64) * 4 + i));
          a->DeleteBlocks(del).IgnoreError();
        }
      }
    });
  }
  // The flood runs for a while before b measures.
  while (a_puts.load() < static_cast<uint64_t>(flooders) * 4 && a_refused.load() == 0) {
    std::this_thread::yield();
  }
  Victim(b.get(), profile_b->profile_id(), Clock::now() + phase, &seq, &flooded);
  stop = true;
  for (std::thread& t : flood) t.join();

  const double put_alone = Quantile(alone.put_ms, 0.99), put_flood = Quantile(flooded.put_ms, 0.99);
  const double get_alone = Quantile(alone.get_ms, 0.99), get_flood = Quantile(flooded.get_ms, 0.99);
  std::cout << absl::StrCat(
                   "fairness: b alone: ", alone.put_ms.size(), " puts p50 ",
                   Quantile(alone.put_ms, 0.5), " ms p99 ", put_alone, " ms; gets p50 ",
                   Quantile(alone.get_ms, 0.5), " ms p99 ", get_alone,
                   " ms\nfairness: b under a's flood (", flooders, " streams, ", a_puts.load(),
                   " durable puts of 4 blocks, ", a_refused.load(),
                   " refused): ", flooded.put_ms.size(), " puts p50 ",
                   Quantile(flooded.put_ms, 0.5), " ms p99 ", put_flood, " ms; gets p50 ",
                   Quantile(flooded.get_ms, 0.5), " ms p99 ", get_flood,
                   " ms\nfairness: p99 ratio put ", put_flood / put_alone, " get ",
                   get_flood / get_alone,
                   first_refusal.empty() ? "" : "\nfairness: a's first refusal: " + first_refusal)
            << std::endl;
  if (const char* path = std::getenv("KVTIER_FAIRNESS_REPORT")) {
    std::ofstream(path) << absl::StrCat(
        "{\"flooders\": ", flooders, ", \"a_puts\": ", a_puts.load(),
        ", \"b_put_p99_alone_ms\": ", put_alone, ", \"b_put_p99_flood_ms\": ", put_flood,
        ", \"b_get_p99_alone_ms\": ", get_alone, ", \"b_get_p99_flood_ms\": ", get_flood, "}\n");
  }
  EXPECT_EQ(alone.failures, 0u) << alone.first_failure;
  EXPECT_EQ(flooded.failures, 0u) << flooded.first_failure;
  ASSERT_GT(alone.put_ms.size(), 10u);
  ASSERT_GT(flooded.put_ms.size(), 10u) << "b was starved";
  EXPECT_GT(a_puts.load(), 0u) << "the flood did not run";
  EXPECT_LE(put_flood, max_ratio * put_alone);
  EXPECT_LE(get_flood, max_ratio * get_alone);
  EXPECT_EQ(daemon_->Stop(std::chrono::seconds(30)), std::optional<int>(0));
}

// One value of the metrics endpoint's text (0 when absent).
double Metric(int port, const std::string& name) {
  const testing::HttpResponse r = testing::HttpRaw(
      port, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  for (absl::string_view line : absl::StrSplit(r.body, '\n')) {
    if (absl::StartsWith(line, name + " "))
      return std::atof(std::string(line.substr(name.size() + 1)).c_str());
  }
  return 0;
}

// Issue 46, finding 2: tenant a's GetBlocks readers stop reading at a's
// queued-bytes cap; tenant b's single-block reads must not wait behind
// them (one queue across tenants made them wait until a's streams were
// cancelled, 30 s later). b's read p99 alone, then with a's stalled
// readers, each phase KVTIER_FAIRNESS_SECONDS; the bound is
// KVTIER_FAIRNESS_MAX_RATIO (10; the goal is 3x, docs/RELIABILITY.md
// has the measured ratio).
TEST_F(FairnessTest, StalledReadersOfOneTenantDoNotDelayAnothersReads) {
  const auto phase = std::chrono::milliseconds(
      static_cast<int64_t>(EnvDouble("KVTIER_FAIRNESS_SECONDS", 3) * 1000));
  const double max_ratio = EnvDouble("KVTIER_FAIRNESS_MAX_RATIO", 10);
  const int readers = static_cast<int>(EnvDouble("KVTIER_FAIRNESS_READERS", 8));
  std::vector<std::string> settings = Settings();
  settings.push_back("log.level=info");  // the metrics port is logged
  settings.push_back("metrics.listen_address=:0");
  settings.push_back("server.max_queued_bytes_per_tenant=1MiB");
  daemon_ = std::make_unique<LoadDaemon>(KVTIERD_PATH, dir_, settings);
  std::string error;
  ASSERT_TRUE(daemon_->Start(std::chrono::seconds(60), &error)) << error;
  int port = 0;
  {
    std::ifstream log(daemon_->log_path());
    std::string line;
    const std::string key = "metrics at http://127.0.0.1:";
    while (std::getline(log, line) && port == 0) {
      const size_t at = line.find(key);
      if (at != std::string::npos) port = std::atoi(line.c_str() + at + key.size());
    }
  }
  ASSERT_GT(port, 0) << "no metrics port in " << daemon_->log_path();

  // a: 32 blocks of 64 KiB (2 MiB, twice its queued-bytes cap); b: one.
  auto a = As("a");
  auto profile_a = a->RegisterProfile(LoadProfile(kBlockBytes));
  ASSERT_OK(profile_a) << profile_a.status();
  v1::PutBlocksRequest put_a;
  put_a.set_profile_id(profile_a->profile_id());
  for (uint64_t i = 0; i < 32; ++i) {
    v1::BlockPut* blk = put_a.add_blocks();
    blk->set_block_id(BlockId(7, i));
    blk->set_data(Payload(blk->block_id(), kBlockBytes));
  }
  ASSERT_OK(a->PutBlocks({put_a}));
  auto b = As("b");
  auto profile_b = b->RegisterProfile(LoadProfile(kBlockBytes));
  ASSERT_OK(profile_b) << profile_b.status();
  const std::string id_b = BlockId(9, 0);
  v1::PutBlocksRequest put_b;
  put_b.set_profile_id(profile_b->profile_id());
  v1::BlockPut* blk_b = put_b.add_blocks();
  blk_b->set_block_id(id_b);
  blk_b->set_data(Payload(id_b, kBlockBytes));
  ASSERT_OK(b->PutBlocks({put_b}));
  auto read_b = [&](Clock::time_point until, Phase* out) {
    v1::GetBlocksRequest get;
    get.set_profile_id(profile_b->profile_id());
    get.add_block_ids(id_b);
    while (Clock::now() < until) {
      const auto t0 = Clock::now();
      auto got = b->GetBlocks(get);
      const auto t1 = Clock::now();
      if (!got.ok() || got->size() != 1 ||
          !ComparePayload(id_b, kBlockBytes, (*got)[0].data().data(), (*got)[0].data().size())
               .empty()) {
        out->Fail(got.ok() ? "wrong bytes or count" : got.status().ToString());
        continue;
      }
      out->get_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
  };
  Phase warm, alone, stalled;
  read_b(Clock::now() + std::chrono::milliseconds(300), &warm);
  read_b(Clock::now() + phase, &alone);

  // a's readers: each asks for all 32 blocks on a channel of its own with
  // small flow-control windows and never reads.
  struct Reader {
    std::unique_ptr<v1::KvTier::Stub> stub;
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<v1::GetBlocksResponse>> stream;
  };
  std::vector<std::unique_ptr<Reader>> stuck;
  for (int i = 0; i < readers; ++i) {
    auto r = std::make_unique<Reader>();
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 10);
    args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 << 20);
    r->stub = v1::KvTier::NewStub(grpc::CreateCustomChannel(
        "unix:" + daemon_->socket_path(), grpc::InsecureChannelCredentials(), args));
    r->ctx.AddMetadata("authorization", "Bearer " + tokens_["a"]);
    v1::GetBlocksRequest req;
    req.set_profile_id(profile_a->profile_id());
    for (uint64_t k = 0; k < 32; ++k) req.add_block_ids(BlockId(7, k));
    r->stream = r->stub->GetBlocks(&r->ctx, req);
    stuck.push_back(std::move(r));
  }
  // Until a's readers wait at its cap (polled, bounded).
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Metric(port, "kvtier_stream_waiting") < 1 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double waiting = Metric(port, "kvtier_stream_waiting");
  const double queued = Metric(port, "kvtier_stream_queued_bytes");
  ASSERT_GE(waiting, 1) << "a's readers never reached its cap";
  read_b(Clock::now() + phase, &stalled);
  for (auto& r : stuck) r->ctx.TryCancel();
  for (auto& r : stuck) (void)r->stream->Finish();

  const double p99_alone = Quantile(alone.get_ms, 0.99);
  const double p99_stalled = Quantile(stalled.get_ms, 0.99);
  std::cout << absl::StrCat("fairness: b's reads alone: ", alone.get_ms.size(), " p50 ",
                            Quantile(alone.get_ms, 0.5), " ms p99 ", p99_alone,
                            " ms\nfairness: b's reads with ", readers, " stalled readers of a (",
                            waiting, " waiting, ", queued,
                            " bytes queued): ", stalled.get_ms.size(), " p50 ",
                            Quantile(stalled.get_ms, 0.5), " ms p99 ", p99_stalled,
                            " ms\nfairness: p99 ratio ", p99_stalled / p99_alone)
            << std::endl;
  EXPECT_EQ(alone.failures, 0u) << alone.first_failure;
  EXPECT_EQ(stalled.failures, 0u) << stalled.first_failure;
  ASSERT_GT(alone.get_ms.size(), 10u);
  ASSERT_GT(stalled.get_ms.size(), 10u) << "b's reads waited behind a's readers";
  EXPECT_LE(p99_stalled, max_ratio * p99_alone);
  EXPECT_EQ(daemon_->Stop(std::chrono::seconds(30)), std::optional<int>(0));
}

// Issue 46, finding 4: tenant a floods Select (KVTIER_FAIRNESS_SELECTORS
// streams, 16 by default, each request naming 32 contexts of 2,048 blocks
// scored key-key); tenant b selects one context of 256 blocks, alone and
// then under the flood. Shipped select.* settings: the Select pool's
// deficit round robin, one thread left for others. b's p50 must stay
// within KVTIER_FAIRNESS_MAX_RATIO (10) of alone, and its p99 within that
// ratio or KVTIER_FAIRNESS_SELECT_FLOOR_MS (5 ms), whichever is larger: on
// a 2-core VM the flood, its 16 client threads and b share the cores, so
// b's p99 is bounded below by the scheduler's time slices, not by the
// daemon (docs/RELIABILITY.md has the figures; answered on gRPC's threads,
// first come first served, b's p50 was 8 ms and its p99 11 ms).
TEST_F(FairnessTest, OneTenantsSelectFloodDoesNotStarveAnothersSelects) {
  const auto phase = std::chrono::milliseconds(
      static_cast<int64_t>(EnvDouble("KVTIER_FAIRNESS_SECONDS", 3) * 1000));
  const double max_ratio = EnvDouble("KVTIER_FAIRNESS_MAX_RATIO", 10);
  const int selectors = static_cast<int>(EnvDouble("KVTIER_FAIRNESS_SELECTORS", 16));
  const double floor_ms = EnvDouble("KVTIER_FAIRNESS_SELECT_FLOOR_MS", 5);
  daemon_ = std::make_unique<LoadDaemon>(KVTIERD_PATH, dir_, Settings());
  std::string error;
  ASSERT_TRUE(daemon_->Start(std::chrono::seconds(60), &error)) << error;
  // Blocks of one layer (16 KiB); contexts over them: a's 32 share 2,048
  // blocks, b's one holds 256.
  auto open = [&](Client* c, uint32_t stream, uint64_t blocks, int contexts,
                  std::vector<uint64_t>* ids) {
    auto profile = c->RegisterProfile(LoadProfile(kBytesPerLayer));
    ASSERT_OK(profile.status());
    for (uint64_t first = 0; first < blocks; first += 128) {
      v1::PutBlocksRequest put;
      put.set_profile_id(profile->profile_id());
      for (uint64_t i = first; i < std::min(blocks, first + 128); ++i) {
        v1::BlockPut* blk = put.add_blocks();
        blk->set_block_id(BlockId(stream, i));
        blk->set_data(Payload(blk->block_id(), kBytesPerLayer));
      }
      ASSERT_OK(c->PutBlocks({put}));
    }
    for (int k = 0; k < contexts; ++k) {
      v1::OpenContextRequest req;
      req.set_profile_id(profile->profile_id());
      v1::Segment* seg = req.add_segments();
      for (uint64_t i = 0; i < blocks; ++i) seg->add_block_ids(BlockId(stream, i));
      auto opened = c->OpenContext(req);
      ASSERT_OK(opened.status());
      ASSERT_EQ(opened->num_blocks(), blocks);
      ids->push_back(opened->context_id());
    }
  };
  auto a = As("a");
  auto b = As("b");
  std::vector<uint64_t> a_contexts, b_contexts;
  ASSERT_NO_FATAL_FAILURE(open(a.get(), 20, 2048, 32, &a_contexts));
  ASSERT_NO_FATAL_FAILURE(open(b.get(), 21, 256, 1, &b_contexts));
  const std::vector<float> anchor(kHeadDim, 0.125f);
  auto request = [&](const std::vector<uint64_t>& contexts, uint64_t id) {
    v1::SelectRequest req;
    req.set_request_id(id);
    for (uint64_t c : contexts) {
      v1::ContextSelect* e = req.add_contexts();
      e->set_context_id(c);
      e->set_scorer(v1::SCORER_KEY_KEY);
      e->set_max_blocks(8);
      for (float x : anchor) e->add_anchor(x);
    }
    return req;
  };
  // b's loop: one request at a time on one stream, until `until`.
  auto select_b = [&](Clock::time_point until, Phase* out) {
    grpc::ClientContext ctx;
    auto stream = b->kvtier_stub()->Select(&ctx);
    for (uint64_t id = 1; Clock::now() < until; ++id) {
      const v1::SelectRequest req = request(b_contexts, id);
      v1::SelectResponse resp;
      const auto t0 = Clock::now();
      if (!stream->Write(req) || !stream->Read(&resp)) {
        out->Fail("b's Select stream broke");
        break;
      }
      const auto t1 = Clock::now();
      if (resp.contexts_size() != 1 || resp.contexts(0).status().code() != 0 ||
          resp.contexts(0).blocks_size() != 8) {
        out->Fail(resp.ShortDebugString().substr(0, 300));
        continue;
      }
      out->get_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    stream->WritesDone();
    const grpc::Status st = stream->Finish();
    if (!st.ok()) out->Fail("b's Select stream: " + st.error_message());
  };
  Phase warm, alone, flooded;
  select_b(Clock::now() + std::chrono::milliseconds(300), &warm);
  select_b(Clock::now() + phase, &alone);

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> a_selects{0}, a_failed{0};
  std::vector<std::thread> flood;
  flood.reserve(selectors);
  for (int f = 0; f < selectors; ++f) {
    flood.emplace_back([&] {
      auto c = As("a");
      if (c == nullptr) return;
      grpc::ClientContext ctx;
      auto stream = c->kvtier_stub()->Select(&ctx);
      for (uint64_t id = 1; !stop.load(); ++id) {
        v1::SelectResponse resp;
        if (!stream->Write(request(a_contexts, id)) || !stream->Read(&resp)) {
          a_failed.fetch_add(1);
          break;
        }
        a_selects.fetch_add(1);
      }
      stream->WritesDone();
      (void)stream->Finish();
    });
  }
  while (a_selects.load() < static_cast<uint64_t>(selectors) && a_failed.load() == 0) {
    std::this_thread::yield();
  }
  select_b(Clock::now() + phase, &flooded);
  stop = true;
  for (std::thread& t : flood) t.join();

  const double p99_alone = Quantile(alone.get_ms, 0.99);
  const double p99_flood = Quantile(flooded.get_ms, 0.99);
  std::cout << absl::StrCat("fairness: b's Selects alone: ", alone.get_ms.size(), " p50 ",
                            Quantile(alone.get_ms, 0.5), " ms p99 ", p99_alone,
                            " ms\nfairness: b's Selects under a's flood (", selectors, " streams, ",
                            a_selects.load(), " requests of 32 x 2048 blocks, ", a_failed.load(),
                            " failed): ", flooded.get_ms.size(), " p50 ",
                            Quantile(flooded.get_ms, 0.5), " ms p99 ", p99_flood,
                            " ms\nfairness: Select p99 ratio ", p99_flood / p99_alone)
            << std::endl;
  if (const char* path = std::getenv("KVTIER_FAIRNESS_REPORT")) {
    std::ofstream(path) << absl::StrCat("{\"selectors\": ", selectors,
                                        ", \"a_selects\": ", a_selects.load(),
                                        ", \"b_select_p99_alone_ms\": ", p99_alone,
                                        ", \"b_select_p99_flood_ms\": ", p99_flood, "}\n");
  }
  EXPECT_EQ(alone.failures, 0u) << alone.first_failure;
  EXPECT_EQ(flooded.failures, 0u) << flooded.first_failure;
  EXPECT_EQ(a_failed.load(), 0u);
  ASSERT_GT(alone.get_ms.size(), 10u);
  ASSERT_GT(flooded.get_ms.size(), 10u) << "b's Selects were starved";
  EXPECT_GT(a_selects.load(), static_cast<uint64_t>(selectors)) << "the flood did not run";
  EXPECT_LE(Quantile(flooded.get_ms, 0.5), max_ratio * Quantile(alone.get_ms, 0.5));
  EXPECT_LE(p99_flood, std::max(max_ratio * p99_alone, floor_ms));
  EXPECT_EQ(daemon_->Stop(std::chrono::seconds(30)), std::optional<int>(0));
}

}  // namespace
}  // namespace kvtier::load
