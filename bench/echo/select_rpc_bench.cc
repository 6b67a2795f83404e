// kvtier_select_rpc_bench: the round-trip cost of kvtierd's Select stream
// against a bare gRPC echo of the same messages, in one run.
//
// Setup: an in-process kvtierd (Unix socket) holding one 128K-token
// document: 8192 blocks of 16 tokens of a 1-layer, 1-KV-head, head_dim-128
// fp16 profile (8 KiB blocks, K and V), whose keys follow
// tests/testutil/synthetic.h (shared mean direction, topic runs, noise).
// 64 contexts are opened over it. Each Select entry asks for 64 blocks
// (0.8% of the context) with the pooled key-key scorer (SCORER_KEY_KEY;
// the daemon's default scorer, mass, is measured in select_v2_bench); its
// anchor is the
// mean of the keys of the 4 blocks before a cursor that moves one block
// every 4 steps, plus noise, so the selection drifts as a decoding
// sequence's would. The arena holds every block, so a block is promoted
// the first time it is chosen.
//
// Anchor: EchoServer (echo_server.h): same socket kind, same server and
// channel settings, a reactor shaped like Select's, and the same message
// types and sizes (its response is a real Select response of the same
// shape). Scenarios (each run for Select and for echo, alternating, over
// --rounds rounds; percentiles pool the rounds):
//   1 stream     x 1 context per request
//   64 streams   x 1 context per request (one channel, 64 client threads)
//   1 stream     x 64 contexts per request (the engine's batched step)
// Also measured in-process: the daemon's work per request without gRPC
// (SelectHandler::Handle) and the selector alone (index::Selector), memory
// per open context and per stored block summary, OpenContext time, and the
// CPU time per round trip (getrusage) of each method and scenario.
//
// Before the scenarios (when 1x64 runs): the cold step, the first Select of
// 64 fresh contexts, whose chosen blocks are all promoted host -> arena
// for the first time (select.inline_promotion_bytes bounds what the
// request copies itself; --set it to compare).
//
// --scorer default leaves the entry's scorer unset (the daemon's default:
// mass, a sliding window on this uncalibrated profile) instead.
//
// Usage: kvtier_select_rpc_bench [--out FILE.md] [--rounds N] [--quick]
//                                [--scorer keykey|default]
//            [--only 1x1|64x1|1x64]... [--set section.key=value]...
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <latch>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client.h"
#include "daemon/config.h"
#include "daemon/select_handler.h"
#include "daemon/server.h"
#include "echo_server.h"
#include "index/kernels/simd.h"
#include "tests/testutil/synthetic.h"

namespace kvtier::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int32_t kDim = 128;
constexpr int32_t kTokens = 16;
constexpr int64_t kBlocks = 8192;  // 128K tokens
constexpr size_t kBlockBytes = size_t{2} * kTokens * kDim * 2;

struct Args {
  std::string out;
  int rounds = 3;
  int single_requests = 1500;
  int parallel_requests = 60;  // per stream
  int batch_requests = 150;
  int warmup = 50;
  int contexts = 64;
  int streams = 64;
  uint32_t budget = 64;
  bool quick = false;
  std::vector<std::string> set;   // extra kvtierd overrides
  std::vector<std::string> only;  // scenarios to run (1x1, 64x1, 1x64)
};

struct Percentiles {
  double p50 = 0, p99 = 0, mean = 0;
  size_t n = 0;
};

Percentiles Summarise(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))]; };
  p.p50 = at(0.50);
  p.p99 = at(0.99);
  double sum = 0;
  for (double x : v) sum += x;
  p.mean = sum / v.size();
  p.n = v.size();
  return p;
}

void Die(const std::string& what, const absl::Status& st) {
  std::fprintf(stderr, "kvtier_select_rpc_bench: %s: %s\n", what.c_str(), st.ToString().c_str());
  std::exit(1);
}

// The keys of block b are v_b plus noise; V is noise.
std::string Payload(const float* v, std::mt19937_64& rng) {
  std::string out(kBlockBytes, '\0');
  std::normal_distribution<float> noise(0.0f, 0.05f);
  auto* h = reinterpret_cast<uint16_t*>(out.data());
  for (int kv = 0; kv < 2; ++kv) {
    for (int t = 0; t < kTokens; ++t) {
      for (int d = 0; d < kDim; ++d) {
        const float x = kv == 0 ? v[d] + noise(rng) : 10.0f * noise(rng);
        *h++ = index::simd::FloatToHalf(x);
      }
    }
  }
  return out;
}

// Anchors of one decoding sequence: the mean of the 4 blocks before a
// cursor that advances one block every 4 steps, plus noise.
class AnchorWalk {
 public:
  AnchorWalk(const testing::SyntheticContext* ctx, uint64_t seed)
      : ctx_(ctx),
        rng_(seed),
        cursor_(std::uniform_int_distribution<int64_t>(4, kBlocks - 1)(rng_)) {}

  std::vector<float> Next() {
    if (++step_ % 4 == 0) cursor_ = cursor_ + 1 < kBlocks ? cursor_ + 1 : 4;
    std::vector<float> a(kDim, 0.0f);
    std::normal_distribution<float> noise(0.0f, 0.05f);
    for (int64_t b = cursor_ - 4; b < cursor_; ++b) {
      for (int d = 0; d < kDim; ++d) a[d] += ctx_->vectors[b * kDim + d] / 4;
    }
    for (float& x : a) x += noise(rng_);
    return a;
  }

 private:
  const testing::SyntheticContext* ctx_;
  std::mt19937_64 rng_;
  int64_t cursor_;
  int64_t step_ = 0;
};

struct Fixture {
  std::unique_ptr<daemon::Server> server;
  std::unique_ptr<Client> client;
  std::unique_ptr<EchoServer> echo;
  std::unique_ptr<Echo::Stub> echo_stub;
  testing::SyntheticContext data;
  std::vector<uint64_t> contexts;
};

// SCORER_KEY_KEY, or unset (the daemon's default) with --scorer default.
v1::Scorer g_scorer = v1::SCORER_KEY_KEY;

v1::SelectRequest MakeRequest(const Fixture& f, int first_context, int contexts_per_request,
                              std::vector<AnchorWalk>* walks, uint32_t budget, uint64_t id) {
  v1::SelectRequest req;
  req.set_request_id(id);
  for (int j = 0; j < contexts_per_request; ++j) {
    const int c = (first_context + j) % static_cast<int>(f.contexts.size());
    v1::ContextSelect* e = req.add_contexts();
    e->set_context_id(f.contexts[c]);
    std::vector<float> a = (*walks)[j].Next();
    e->mutable_anchor()->Add(a.begin(), a.end());
    if (g_scorer != v1::SCORER_UNSPECIFIED) e->set_scorer(g_scorer);
    e->set_max_blocks(budget);
  }
  return req;
}

// One scenario of one method: `streams` threads, each with its own stream
// and its own contexts, `requests` timed round trips after `warmup`.
template <typename StubT>
std::vector<double> Run(const Fixture& f, StubT* stub, int streams, int contexts_per_request,
                        int requests, int warmup, uint32_t budget, uint64_t seed,
                        v1::SelectResponse* sample) {
  std::vector<std::vector<double>> lat(streams);
  std::latch start(streams);
  std::vector<std::thread> threads;
  std::atomic<int> errors{0};
  for (int t = 0; t < streams; ++t) {
    threads.emplace_back([&, t] {
      std::vector<AnchorWalk> walks;
      for (int j = 0; j < contexts_per_request; ++j) {
        walks.emplace_back(&f.data, seed * 1000003 + t * 1009 + j);
      }
      grpc::ClientContext ctx;
      auto stream = stub->Select(&ctx);
      v1::SelectResponse resp;
      lat[t].reserve(requests);
      start.arrive_and_wait();
      for (int i = 0; i < warmup + requests; ++i) {
        v1::SelectRequest req =
            MakeRequest(f, t * contexts_per_request, contexts_per_request, &walks, budget, i + 1);
        const auto t0 = Clock::now();
        if (!stream->Write(req) || !stream->Read(&resp)) {
          ++errors;
          break;
        }
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
        if (resp.request_id() != req.request_id() || resp.contexts_size() != contexts_per_request) {
          ++errors;
        }
        for (const auto& c : resp.contexts()) errors += c.status().code() != 0;
        if (i >= warmup) lat[t].push_back(us);
        if (t == 0 && i == 0 && sample != nullptr) *sample = resp;
      }
      stream->WritesDone();
      if (!stream->Finish().ok()) ++errors;
    });
  }
  for (auto& th : threads) th.join();
  if (errors.load() > 0) Die("run", absl::InternalError(absl::StrCat(errors.load(), " errors")));
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  return all;
}

// The cold step: the first Select of `contexts` fresh contexts in one
// request, over gRPC, where every chosen block is copied host -> arena for
// the first time (within select.inline_promotion_bytes; the rest come back
// PENDING), then how long the deferred promotions took off the response
// path (the prefetcher's thread).
struct ColdStep {
  double select_ms = 0, deferred_ms = 0;
  int resident = 0, pending = 0;
};

ColdStep MeasureColdStep(const Fixture& f, int contexts, uint32_t budget) {
  std::vector<AnchorWalk> walks;
  for (int j = 0; j < contexts; ++j) walks.emplace_back(&f.data, 77 + j);
  const v1::SelectRequest req = MakeRequest(f, 0, contexts, &walks, budget, 1);
  grpc::ClientContext ctx;
  auto stream = f.client->kvtier_stub()->Select(&ctx);
  v1::SelectResponse resp;
  ColdStep cold;
  const auto t0 = Clock::now();
  if (!stream->Write(req) || !stream->Read(&resp)) Die("cold step", absl::InternalError("stream"));
  const auto t1 = Clock::now();
  f.server->runtime()->prefetcher()->WaitIdle();
  const auto t2 = Clock::now();
  cold.select_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  cold.deferred_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
  for (const auto& c : resp.contexts()) {
    for (const auto& b : c.blocks()) {
      cold.resident += b.residency() == v1::RESIDENCY_RESIDENT;
      cold.pending += b.residency() == v1::RESIDENCY_PENDING;
    }
  }
  stream->WritesDone();
  stream->Finish();
  return cold;
}

// Process CPU time (user + system, all threads) in microseconds.
double CpuMicros() {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e6 + u.ru_utime.tv_usec + u.ru_stime.tv_usec;
}

struct Row {
  std::string scenario;
  Percentiles select, echo;
  double select_cpu_us = 0, echo_cpu_us = 0;  // per round trip, client + server
  size_t request_bytes = 0, response_bytes = 0;
};

Fixture Setup(const Args& args, const std::string& dir) {
  Fixture f;
  std::vector<std::string> overrides = {
      "server.data_dir=" + dir,
      "log.level=warn",
      "tiers.device.capacity_bytes=512MiB",
      "tiers.host.capacity_bytes=256MiB",
      "tiers.host.staging_bytes=1MiB",
      "tiers.nvme.file_count=1",
      "tiers.nvme.file_size_bytes=64MiB",
      "tiers.nvme.io_threads=1",
      "leases.default_ttl_ms=600000",
      absl::StrCat("limits.max_contexts=", std::max(args.contexts, 1) + 8)};
  overrides.insert(overrides.end(), args.set.begin(), args.set.end());
  auto config = daemon::LoadConfig("", overrides);
  if (!config.ok()) Die("config", config.status());
  auto server = daemon::Server::Start(*config);
  if (!server.ok()) Die("start kvtierd", server.status());
  f.server = std::move(*server);
  auto client = Client::Connect(f.server->socket_path());
  if (!client.ok()) Die("connect", client.status());
  f.client = std::move(*client);

  v1::ModelProfile profile;
  profile.set_name("select-rpc-bench");
  profile.set_num_layers(1);
  profile.set_num_kv_heads(1);
  profile.set_head_dim(kDim);
  profile.set_block_size_tokens(kTokens);
  profile.set_dtype(v1::DTYPE_FP16);
  auto registered = f.client->RegisterProfile(profile);
  if (!registered.ok()) Die("register", registered.status());
  const uint64_t pid = registered->profile_id();

  testing::SyntheticContextOptions o;
  o.num_blocks = kBlocks;
  o.dim = kDim;
  o.num_planted = 0;
  o.anchor_topic = 0;
  o.seed = 7;
  f.data = testing::MakeSyntheticContext(o);
  std::mt19937_64 rng(1);
  std::vector<std::string> ids;
  std::vector<v1::PutBlocksRequest> puts;
  for (int64_t b = 0; b < kBlocks; ++b) {
    if (b % 512 == 0) {
      puts.emplace_back();
      puts.back().set_profile_id(pid);
    }
    ids.push_back(absl::StrFormat("doc-block-%08d", b));
    v1::BlockPut* put = puts.back().add_blocks();
    put->set_block_id(ids.back());
    put->set_data(Payload(&f.data.vectors[b * kDim], rng));
  }
  auto put = f.client->PutBlocks(puts);
  if (!put.ok()) Die("put", put.status());
  for (const auto& r : put->results()) {
    if (r.status().code() != 0) Die("put block", absl::InternalError(r.status().message()));
  }
  for (int c = 0; c < args.contexts; ++c) {
    grpc::ClientContext ctx;
    v1::OpenContextRequest req;
    req.set_profile_id(pid);
    req.set_lease_ttl_ms(600000);
    v1::Segment* s = req.add_segments();  // one segment: the whole document
    for (const auto& id : ids) s->add_block_ids(id);
    v1::OpenContextResponse resp;
    grpc::Status st = f.client->kvtier_stub()->OpenContext(&ctx, req, &resp);
    if (!st.ok()) Die("open context", FromGrpcStatus(st));
    f.contexts.push_back(resp.context_id());
  }
  const std::string echo_path = dir + "/echo.sock";
  auto echo = EchoServer::Start(echo_path, config->server.max_message_bytes,
                                config->server.max_concurrent_streams);
  if (!echo.ok()) Die("echo", echo.status());
  f.echo = std::move(*echo);
  // The kvtier client's channel settings (client/client.cc).
  grpc::ChannelArguments channel_args;
  const ClientOptions defaults;
  channel_args.SetMaxReceiveMessageSize(defaults.max_message_bytes);
  channel_args.SetMaxSendMessageSize(defaults.max_message_bytes);
  f.echo_stub = Echo::NewStub(grpc::CreateCustomChannel(
      "unix:" + echo_path, grpc::InsecureChannelCredentials(), channel_args));
  return f;
}

// Milliseconds to open one context over the whole document.
double TimeOpen(Fixture& f) {
  auto ctx0 = f.server->runtime()->contexts()->Find("default", f.contexts[0]);
  uint64_t pid = (*ctx0)->profile().profile_id;
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&(*ctx0)->mu);
    for (int64_t b = 0; b < (*ctx0)->num_blocks(); ++b) ids.emplace_back((*ctx0)->block_id(b));
  }
  std::vector<double> ms;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    auto opened = f.server->runtime()->contexts()->Open("default", pid, {ids}, 0);
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    if (!opened.ok()) Die("open", opened.status());
    f.server->runtime()->contexts()->Close("default", opened->context_id).IgnoreError();
  }
  return Summarise(ms).p50;
}

}  // namespace
}  // namespace kvtier::bench

int main(int argc, char** argv) {
  using namespace kvtier;
  using namespace kvtier::bench;
  Args args;
  CLI::App app{"kvtierd Select round trips vs a bare gRPC echo of the same messages"};
  app.add_option("--out", args.out, "also write the markdown report here");
  app.add_option("--rounds", args.rounds, "alternating Select/echo rounds");
  app.add_flag("--quick", args.quick, "fewer requests (smoke run)");
  app.add_option("--set", args.set, "kvtierd override section.key=value (repeatable)");
  app.add_option("--only", args.only, "scenarios to run: 1x1, 64x1, 1x64 (default all)");
  std::string scorer = "keykey";
  app.add_option("--scorer", scorer, "keykey (SCORER_KEY_KEY) or default (unset: the daemon's)")
      ->check(CLI::IsMember({"keykey", "default"}));
  CLI11_PARSE(app, argc, argv);
  if (scorer == "default") g_scorer = v1::SCORER_UNSPECIFIED;
  if (args.quick) {
    args.rounds = 1;
    args.single_requests = 200;
    args.parallel_requests = 10;
    args.batch_requests = 20;
    args.warmup = 10;
  }
  const std::string dir = "/tmp/kvtier-selrpc-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  Fixture f = Setup(args, dir);

  struct Scenario {
    std::string key, name;
    int streams, per_request, requests;
  };
  const std::vector<Scenario> scenarios = {
      {"1x1", "1 stream x 1 context", 1, 1, args.single_requests},
      {"64x1", absl::StrCat(args.streams, " streams x 1 context"), args.streams, 1,
       args.parallel_requests},
      {"1x64", absl::StrCat("1 stream x ", args.contexts, " contexts"), 1, args.contexts,
       args.batch_requests},
  };
  std::vector<Row> rows;
  ColdStep cold;
  const bool batch_scenario =
      args.only.empty() || std::find(args.only.begin(), args.only.end(), "1x64") != args.only.end();
  if (batch_scenario) {
    cold = MeasureColdStep(f, args.contexts, args.budget);
    std::printf(
        "cold step (%d contexts, first Select): %.2f ms, %d resident, %d pending; "
        "deferred promotions done %.2f ms later\n",
        args.contexts, cold.select_ms, cold.resident, cold.pending, cold.deferred_ms);
  }
  for (const Scenario& s : scenarios) {
    if (!args.only.empty() &&
        std::find(args.only.begin(), args.only.end(), s.key) == args.only.end()) {
      continue;
    }
    Row row;
    row.scenario = s.name;
    std::vector<double> sel, echo;
    double select_cpu = 0, echo_cpu = 0;
    int64_t select_trips = 0, echo_trips = 0;
    for (int r = 0; r < args.rounds; ++r) {
      v1::SelectResponse sample;
      auto run_select = [&] {
        const double cpu = CpuMicros();
        auto v = Run(f, f.client->kvtier_stub(), s.streams, s.per_request, s.requests, args.warmup,
                     args.budget, r + 1, &sample);
        select_cpu += CpuMicros() - cpu;
        select_trips += s.streams * (s.requests + args.warmup);
        sel.insert(sel.end(), v.begin(), v.end());
      };
      auto run_echo = [&] {
        const double cpu = CpuMicros();
        auto v = Run(f, f.echo_stub.get(), s.streams, s.per_request, s.requests, args.warmup,
                     args.budget, r + 1, nullptr);
        echo_cpu += CpuMicros() - cpu;
        echo_trips += s.streams * (s.requests + args.warmup);
        echo.insert(echo.end(), v.begin(), v.end());
      };
      // The echo answers with a real Select response of this shape.
      if (r == 0) {
        run_select();
        f.echo->SetResponse(sample);
        row.response_bytes = sample.ByteSizeLong();
        std::vector<AnchorWalk> walks;
        for (int j = 0; j < s.per_request; ++j) walks.emplace_back(&f.data, j);
        row.request_bytes = MakeRequest(f, 0, s.per_request, &walks, args.budget, 1).ByteSizeLong();
        run_echo();
      } else if (r % 2 == 1) {
        run_echo();
        run_select();
      } else {
        run_select();
        run_echo();
      }
    }
    row.select = Summarise(sel);
    row.echo = Summarise(echo);
    row.select_cpu_us = select_cpu / std::max<int64_t>(select_trips, 1);
    row.echo_cpu_us = echo_cpu / std::max<int64_t>(echo_trips, 1);
    rows.push_back(row);
    std::fprintf(stderr, "%s: select p50 %.1f us p99 %.1f us | echo p50 %.1f us p99 %.1f us\n",
                 s.name.c_str(), row.select.p50, row.select.p99, row.echo.p50, row.echo.p99);
  }

  // The daemon's work per request without gRPC, one thread, and the
  // selector alone.
  std::vector<double> handle_1, handle_batch, selector_only, selector_batch;
  daemon::SelectHandler::Timings parts_1, parts_batch;  // sums
  {
    auto handler = daemon::SelectHandler::Create(f.server->runtime(), "default");
    if (!handler.ok()) Die("handler", handler.status());
    std::vector<AnchorWalk> walks;
    for (int j = 0; j < args.contexts; ++j) walks.emplace_back(&f.data, 99 + j);
    v1::SelectResponse resp;
    const int n = args.quick ? 100 : 1000;
    auto add = [](daemon::SelectHandler::Timings* sum, const daemon::SelectHandler::Timings& t) {
      sum->check_us += t.check_us;
      sum->select_us += t.select_us;
      sum->pin_us += t.pin_us;
      sum->build_us += t.build_us;
    };
    for (int i = 0; i < n + args.warmup; ++i) {
      v1::SelectRequest req = MakeRequest(f, 0, 1, &walks, args.budget, i + 1);
      const auto t0 = Clock::now();
      (*handler)->Handle(req, &resp);
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      if (i >= args.warmup) {
        handle_1.push_back(us);
        add(&parts_1, (*handler)->last_timings());
      }
    }
    for (int i = 0; i < n / 10 + 5; ++i) {
      v1::SelectRequest req = MakeRequest(f, 0, args.contexts, &walks, args.budget, i + 1);
      const auto t0 = Clock::now();
      (*handler)->Handle(req, &resp);
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      if (i >= 5) {
        handle_batch.push_back(us);
        add(&parts_batch, (*handler)->last_timings());
      }
    }
    // The selector alone: one context, then all contexts in one batch.
    std::vector<std::shared_ptr<daemon::Context>> ctxs;
    for (uint64_t id : f.contexts)
      ctxs.push_back(*f.server->runtime()->contexts()->Find("default", id));
    auto selector = index::Selector::Create(f.server->runtime()->selector_options());
    // Locked in increasing id, the order Select handlers use (context ids
    // are random, so not the order they were opened in).
    std::sort(ctxs.begin(), ctxs.end(),
              [](const auto& a, const auto& b) { return a->id() < b->id(); });
    for (auto& c : ctxs) c->mu.Lock();
    std::vector<index::SelectResult> results(ctxs.size());
    int64_t step = 1'000'000;
    for (int i = 0; i < n + args.warmup; ++i) {
      std::vector<float> a = walks[0].Next();
      index::SelectRequest r;
      r.context = &ctxs[0]->index();
      r.anchor = a;
      r.budget_blocks = args.budget;
      r.step = ++step;
      const auto t0 = Clock::now();
      absl::Status st = (*selector)->Select(r, &results[0]);
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      if (!st.ok()) Die("selector", st);
      if (i >= args.warmup) selector_only.push_back(us);
    }
    for (int i = 0; i < n / 10 + 5; ++i) {
      std::vector<std::vector<float>> anchors;
      std::vector<index::SelectRequest> requests;
      ++step;
      for (size_t c = 0; c < ctxs.size(); ++c) anchors.push_back(walks[c].Next());
      for (size_t c = 0; c < ctxs.size(); ++c) {
        index::SelectRequest r;
        r.context = &ctxs[c]->index();
        r.anchor = anchors[c];
        r.budget_blocks = args.budget;
        r.step = step;
        requests.push_back(r);
      }
      const auto t0 = Clock::now();
      absl::Status st = (*selector)->SelectBatch(requests, absl::MakeSpan(results));
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      if (!st.ok()) Die("selector batch", st);
      if (i >= 5) selector_batch.push_back(us);
    }
    for (auto& c : ctxs) c->mu.Unlock();
  }

  // Memory.
  size_t context_bytes = 0, index_bytes = 0;
  {
    auto ctx = f.server->runtime()->contexts()->Find("default", f.contexts[0]);
    absl::MutexLock lock(&(*ctx)->mu);
    context_bytes = (*ctx)->MemoryBytes();
    index_bytes = (*ctx)->index().MemoryBytes();
  }
  std::vector<BlockKey> missing;
  auto blobs = f.server->runtime()->store()->GetSummaries(
      {BlockKey{
          "default",
          (*f.server->runtime()->contexts()->Find("default", f.contexts[0]))->profile().profile_id,
          "doc-block-00000000"}},
      &missing);
  const size_t summary_bytes = blobs.empty() ? 0 : blobs[0].size();
  const double open_ms = TimeOpen(f);

  std::string md;
  absl::StrAppend(&md,
                  "| scenario | request B | response B | Select p50 us | Select p99 us | echo p50 "
                  "us | echo p99 us | p50 ratio (goal <= 2) | p99 ratio (goal <= 3) | samples |\n");
  absl::StrAppend(&md, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const Row& r : rows) {
    absl::StrAppend(
        &md, absl::StrFormat("| %s | %d | %d | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f | %d |\n",
                             r.scenario, r.request_bytes, r.response_bytes, r.select.p50,
                             r.select.p99, r.echo.p50, r.echo.p99, r.select.p50 / r.echo.p50,
                             r.select.p99 / r.echo.p99, r.select.n));
  }
  const Percentiles h1 = Summarise(handle_1), hb = Summarise(handle_batch),
                    so = Summarise(selector_only), sb = Summarise(selector_batch);
  absl::StrAppend(&md,
                  "\n| scenario | CPU us per round trip, Select | CPU us per round trip, echo | "
                  "difference |\n| --- | ---: | ---: | ---: |\n");
  for (const Row& r : rows) {
    absl::StrAppend(&md,
                    absl::StrFormat("| %s | %.1f | %.1f | %.1f |\n", r.scenario, r.select_cpu_us,
                                    r.echo_cpu_us, r.select_cpu_us - r.echo_cpu_us));
  }
  absl::StrAppend(
      &md,
      "\n| daemon work without gRPC (one thread) | p50 us | p99 us |\n| --- | ---: | ---: |\n");
  absl::StrAppend(&md, absl::StrFormat("| index::Selector::Select, 1 context | %.1f | %.1f |\n",
                                       so.p50, so.p99));
  absl::StrAppend(&md,
                  absl::StrFormat("| index::Selector::SelectBatch, %d contexts | %.1f | %.1f |\n",
                                  args.contexts, sb.p50, sb.p99));
  absl::StrAppend(
      &md, absl::StrFormat("| SelectHandler::Handle, 1 context | %.1f | %.1f |\n", h1.p50, h1.p99));
  absl::StrAppend(&md, absl::StrFormat("| SelectHandler::Handle, %d contexts | %.1f | %.1f |\n",
                                       args.contexts, hb.p50, hb.p99));
  auto parts = [&](const char* what, const daemon::SelectHandler::Timings& t, size_t n) {
    absl::StrAppend(&md,
                    absl::StrFormat("| %s | %.1f | %.1f | %.1f | %.1f |\n", what, t.check_us / n,
                                    t.select_us / n, t.pin_us / n, t.build_us / n));
  };
  absl::StrAppend(&md,
                  "\n| Handle, mean us per request | checks + locks | SelectBatch | pin "
                  "(AcquireHandles + release) | response |\n| --- | ---: | ---: | ---: | ---: |\n");
  parts("1 context", parts_1, std::max<size_t>(handle_1.size(), 1));
  parts(absl::StrCat(args.contexts, " contexts").c_str(), parts_batch,
        std::max<size_t>(handle_batch.size(), 1));
  // Engine view: the decode step of an 8B-class model at batch 64 on an
  // H200 is ~10 ms (kEngineStepUs); one Select request carries all of the
  // batch's contexts.
  constexpr double kEngineStepUs = 10000.0;
  absl::StrAppend(&md,
                  "\n| engine view: share of a 10 ms decode step (8B-class model, batch "
                  "64, H200) | us | share |\n| --- | ---: | ---: |\n");
  absl::StrAppend(&md,
                  absl::StrFormat("| Handle, %d contexts, one thread (p50) | %.0f | %.0f%% |\n",
                                  args.contexts, hb.p50, 100.0 * hb.p50 / kEngineStepUs));
  absl::StrAppend(
      &md, absl::StrFormat("| of which per context | %.1f | %.2f%% |\n", hb.p50 / args.contexts,
                           100.0 * hb.p50 / args.contexts / kEngineStepUs));
  for (const Row& r : rows) {
    if (r.scenario.find("x 64 contexts") == std::string::npos) continue;
    absl::StrAppend(
        &md, absl::StrFormat("| %s over gRPC, select.batch_threads as set (p50) | "
                             "%.0f | %.0f%% |\n",
                             r.scenario, r.select.p50, 100.0 * r.select.p50 / kEngineStepUs));
  }
  if (batch_scenario) {
    absl::StrAppend(
        &md, absl::StrFormat("\nCold step (the first Select of %d fresh contexts in one request, "
                             "select.inline_promotion_bytes as set): %.2f ms over gRPC, %d blocks "
                             "RESIDENT, %d PENDING; the deferred promotions finished %.2f ms "
                             "after the response.\n",
                             args.contexts, cold.select_ms, cold.resident, cold.pending,
                             cold.deferred_ms));
  }
  absl::StrAppend(&md, "\n| memory | bytes |\n| --- | ---: |\n");
  absl::StrAppend(
      &md, absl::StrFormat("| open context of %d blocks (Context::MemoryBytes) | %d |\n", kBlocks,
                           context_bytes));
  absl::StrAppend(&md,
                  absl::StrFormat("| of which ContextIndex::MemoryBytes | %d |\n", index_bytes));
  absl::StrAppend(&md, absl::StrFormat("| per block of the context | %.1f |\n",
                                       static_cast<double>(context_bytes) / kBlocks));
  absl::StrAppend(
      &md,
      absl::StrFormat("| stored summary per block (encoded; in memory and in the catalog) | %d |\n",
                      summary_bytes));
  absl::StrAppend(
      &md, absl::StrFormat("\nOpenContext of %d blocks (in-process, p50 of 5): %.1f ms\n", kBlocks,
                           open_ms));
  std::printf("%s", md.c_str());
  if (!args.out.empty()) std::ofstream(args.out) << md;
  f.echo.reset();
  f.client.reset();
  f.server.reset();
  std::filesystem::remove_all(dir);
  return 0;
}
