// kvtier_select_v2_bench: what per-layer anchors and head queries cost an
// engine per step, against pooled anchors, on a 7B-class profile.
//
// Setup: an in-process kvtierd (Unix socket, index.summary_per_layer on)
// holding one context of --blocks blocks of a Qwen2.5-7B-shaped profile
// (28 layers, 4 KV heads, 28 query heads, head_dim 128, 16 tokens, bf16:
// 896 KiB blocks) calibrated with --heads retrieval heads (so every block
// also keeps their KV heads' keys in int8). The device arena holds every
// block, so after warm-up a Select measures scoring, pinning and the
// response, not promotion. Keys are uniform noise: this measures cost, not
// quality (docs/QUALITY.md measures quality).
//
// Per request kind (one stream, one context per request, the budget
// --budget blocks, anchors rotating over 8 fixed ones):
//   pooled      SCORER_KEY_KEY, anchor of head_dim floats (the tree)
//   per-layer   SCORER_KEY_KEY, anchor of 28 x head_dim floats
//   mass+heads  SCORER_UNSPECIFIED (the shipped default, mass) with the
//               retrieval heads' queries (R x head_dim floats)
//   mass prior  SCORER_UNSPECIFIED without head queries
// it reports the gRPC round trip (p50, p99), the daemon's own time per
// request (SelectHandler, no gRPC) and its selector share, the request
// size, and the client-side cost of computing the anchor from the last 8
// tokens' keys (client/anchor.h) or gathering the head queries.
//
// With --keys real it runs select_v2_real.h instead: the shipped mass
// Select through kvtierd on real keys, driven as an engine drives it.
//
// Usage: kvtier_select_v2_bench [--out FILE.md] [--blocks N] [--heads R]
//            [--requests N] [--budget B] [--quick]
//        kvtier_select_v2_bench --keys real [--tokens N] [--steps S]
//            [--threads T ...] [--out FILE.md]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/echo/select_v2_real.h"
#include "client/anchor.h"
#include "client/client.h"
#include "daemon/config.h"
#include "daemon/select_handler.h"
#include "daemon/server.h"
#include "index/kernels/simd.h"

namespace kvtier::bench {
namespace {

using Clock = std::chrono::steady_clock;

// The profile's shape (--shape 7b or small); set once in main.
uint32_t kLayers = 28, kKvHeads = 4, kQHeads = 28, kDim = 128, kTokens = 16;
size_t kBlockBytes = 0;
std::string kShapeName;

struct Args {
  std::string out;
  int blocks = 1024;
  int heads = 8;
  int requests = 400;
  int warmup = 40;
  uint32_t budget = 64;
  bool quick = false;
  std::string shape = "7b";
};

void Die(const std::string& what, const absl::Status& st) {
  std::fprintf(stderr, "kvtier_select_v2_bench: %s: %s\n", what.c_str(), st.ToString().c_str());
  std::exit(1);
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

// Uniform bf16 noise in [-1, 1) (cheap to generate, like keys in scale).
std::string Block(uint64_t seed) {
  std::string out(kBlockBytes, '\0');
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  auto* p = reinterpret_cast<uint16_t*>(out.data());
  for (size_t i = 0; i < kBlockBytes / 2; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const float f = static_cast<float>(static_cast<int32_t>(x >> 40) - (1 << 23)) / (1 << 23);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    p[i] = static_cast<uint16_t>(bits >> 16);
  }
  return out;
}

v1::ModelProfile Profile(int heads) {
  v1::ModelProfile p;
  p.set_name("qwen2.5-7b-shape");
  p.set_revision(absl::StrCat("bench-", heads));
  p.set_num_layers(kLayers);
  p.set_num_kv_heads(kKvHeads);
  p.set_head_dim(kDim);
  p.set_block_size_tokens(kTokens);
  p.set_dtype(v1::DTYPE_BF16);
  v1::SelectionCalibration* c = p.mutable_calibration();
  c->set_num_q_heads(kQHeads);
  for (int i = 0; i < heads; ++i) {
    v1::HeadRef* h = c->add_retrieval_heads();
    h->set_layer(kLayers - 1 - (i % std::min<uint32_t>(8, kLayers)));
    h->set_q_head((i * 5 + i / kLayers) % kQHeads);
  }
  for (int d = 0; d < 64; ++d) {
    c->add_prior(4.0f / (d + 1));
    c->add_prior_all(5.0f / (d + 1));
  }
  // The gate the committed calibrations use (bench/quality/calibration):
  // with it the mass scorer takes its sparse path on long contexts.
  c->set_head_min_mass(0.4f);
  return p;
}

struct Kind {
  std::string name;
  v1::Scorer scorer;
  size_t anchor_floats;
  bool head_queries;
};

struct Result {
  std::string name;
  size_t request_bytes = 0;
  double p50 = 0, p99 = 0, handler_us = 0, select_us = 0, client_us = 0;
};

}  // namespace
}  // namespace kvtier::bench

int main(int argc, char** argv) {
  using namespace kvtier;
  using namespace kvtier::bench;
  Args args;
  CLI::App app{"per-layer anchors and head queries against pooled anchors, 7B-class profile"};
  app.add_option("--out", args.out, "also write the markdown report here");
  app.add_option("--blocks", args.blocks, "blocks in the context")->capture_default_str();
  app.add_option("--heads", args.heads, "calibrated retrieval heads")->capture_default_str();
  app.add_option("--requests", args.requests, "timed Selects per kind")->capture_default_str();
  app.add_option("--budget", args.budget, "blocks per Select")->capture_default_str();
  app.add_flag("--quick", args.quick, "256 blocks, 60 requests (smoke run)");
  app.add_option("--shape", args.shape,
                 "7b: 28 layers, 4 KV / 28 query heads, head_dim 128; small: the shared "
                 "models' 4 layers, 2 KV / 4 query heads, head_dim 64")
      ->capture_default_str();
  std::string keys = "noise";
  RealKeysOptions real;
  app.add_option("--keys", keys, "noise: uniform bf16 noise; real: select_v2_real.h")
      ->check(CLI::IsMember({"noise", "real"}))
      ->capture_default_str();
  app.add_option("--tokens", real.tokens, "--keys real: context tokens")->capture_default_str();
  app.add_option("--steps", real.steps, "--keys real: decode steps")->capture_default_str();
  app.add_option("--threads", real.threads, "--keys real: select.batch_threads values");
  CLI11_PARSE(app, argc, argv);
  if (keys == "real") {
    real.out = args.out;
    real.dumps_dir = KVTIER_REALKV_DIR;
    real.calibration_dir = KVTIER_CALIBRATION_DIR;
    return RunRealKeys(real);
  }
  if (args.shape == "small") {
    kLayers = 4, kKvHeads = 2, kQHeads = 4, kDim = 64;
    kShapeName =
        "the shared models' shape (4 layers, 2 KV heads, 4 query heads, head_dim 64, "
        "16 tokens, bf16)";
  } else if (args.shape == "7b") {
    kShapeName = "a 7B-class profile (28 layers, 4 KV heads, head_dim 128, 16 tokens, bf16)";
  } else {
    std::fprintf(stderr, "--shape must be 7b or small\n");
    return 2;
  }
  kBlockBytes = size_t{kLayers} * 2 * kKvHeads * kTokens * kDim * 2;
  if (args.quick) {
    args.blocks = 256;
    args.requests = 60;
    args.warmup = 10;
  }
  const std::string dir = "/tmp/kvtier-selv2-bench-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const uint64_t arena = uint64_t(args.blocks + 64) * kBlockBytes;
  auto config = daemon::LoadConfig(
      "", {"server.data_dir=" + dir, "log.level=warn", "index.summary_per_layer=true",
           absl::StrCat("tiers.device.capacity_bytes=", arena),
           absl::StrCat("tiers.host.capacity_bytes=", arena), "tiers.host.staging_bytes=1MiB",
           "tiers.nvme.file_count=1", "tiers.nvme.file_size_bytes=64MiB", "tiers.nvme.io_threads=1",
           "leases.default_ttl_ms=600000"});
  if (!config.ok()) Die("config", config.status());
  auto server = daemon::Server::Start(*config);
  if (!server.ok()) Die("start", server.status());
  auto client = Client::Connect((*server)->socket_path());
  if (!client.ok()) Die("connect", client.status());
  const v1::ModelProfile profile = Profile(args.heads);
  auto reg = (*client)->RegisterProfile(profile);
  if (!reg.ok()) Die("register", reg.status());

  std::printf("putting %d blocks of %zu KiB...\n", args.blocks, kBlockBytes / 1024);
  std::vector<std::string> ids;
  std::string last_block, previous_block;
  const auto put0 = Clock::now();
  for (int b = 0; b < args.blocks; ++b) {
    v1::PutBlocksRequest put;
    put.set_profile_id(reg->profile_id());
    v1::BlockPut* p = put.add_blocks();
    ids.push_back(absl::StrFormat("blk-%06d", b));
    p->set_block_id(ids.back());
    std::string data = Block(b + 1);
    if (b == args.blocks - 2) previous_block = data;
    if (b == args.blocks - 1) last_block = data;
    p->set_data(std::move(data));
    auto r = (*client)->PutBlocks({put});
    if (!r.ok() || r->results(0).status().code() != 0) Die("put", absl::InternalError(ids.back()));
  }
  const double put_s = std::chrono::duration<double>(Clock::now() - put0).count();
  grpc::ClientContext octx;
  v1::OpenContextRequest open;
  open.set_profile_id(reg->profile_id());
  open.set_lease_ttl_ms(600000);
  v1::Segment* seg = open.add_segments();
  for (const auto& id : ids) seg->add_block_ids(id);
  v1::OpenContextResponse opened;
  if (grpc::Status st = (*client)->kvtier_stub()->OpenContext(&octx, open, &opened); !st.ok()) {
    Die("open", absl::InternalError(st.error_message()));
  }

  const std::vector<Kind> kinds = {
      {"pooled anchor (key-key, tree)", v1::SCORER_KEY_KEY, kDim, false},
      {"per-layer anchor (key-key)", v1::SCORER_KEY_KEY, size_t{kLayers} * kDim, false},
      {"mass + head queries (default)", v1::SCORER_UNSPECIFIED, 0, true},
      {"mass, prior only (default)", v1::SCORER_UNSPECIFIED, 0, false},
  };
  std::mt19937_64 rng(3);
  std::normal_distribution<float> n(0.0f, 1.0f);
  auto handler = daemon::SelectHandler::Create((*server)->runtime(), "default");
  if (!handler.ok()) Die("handler", handler.status());
  std::vector<Result> results;
  uint64_t step = 0;
  for (const Kind& kind : kinds) {
    std::vector<v1::SelectRequest> reqs(8);
    for (int i = 0; i < 8; ++i) {
      v1::ContextSelect* e = reqs[i].add_contexts();
      e->set_context_id(opened.context_id());
      e->set_scorer(kind.scorer);
      e->set_max_blocks(args.budget);
      for (size_t j = 0; j < kind.anchor_floats; ++j) e->add_anchor(n(rng));
      if (kind.head_queries) {
        for (int j = 0; j < args.heads * static_cast<int>(kDim); ++j) e->add_head_queries(n(rng));
      }
    }
    Result res;
    res.name = kind.name;
    res.request_bytes = reqs[0].ByteSizeLong();
    grpc::ClientContext ctx;
    auto stream = (*client)->kvtier_stub()->Select(&ctx);
    std::vector<double> lat;
    v1::SelectResponse resp;
    for (int i = 0; i < args.warmup + args.requests; ++i) {
      v1::SelectRequest& req = reqs[i % 8];
      req.set_request_id(i + 1);
      req.mutable_contexts(0)->set_step(++step);
      const auto t0 = Clock::now();
      if (!stream->Write(req) || !stream->Read(&resp)) Die("select", absl::InternalError("stream"));
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      if (resp.contexts(0).status().code() != 0) {
        Die("select", absl::InternalError(resp.contexts(0).status().message()));
      }
      if (i >= args.warmup) lat.push_back(us);
    }
    stream->WritesDone();
    stream->Finish().IgnoreError();
    res.p50 = Percentile(lat, 0.5);
    res.p99 = Percentile(lat, 0.99);
    // The daemon's work without gRPC, and the selector's part of it.
    std::vector<double> handler_us, select_us;
    v1::SelectResponse out;
    for (int i = 0; i < args.requests; ++i) {
      v1::SelectRequest& req = reqs[i % 8];
      req.mutable_contexts(0)->set_step(++step);
      const auto t0 = Clock::now();
      (*handler)->Handle(req, &out);
      handler_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      select_us.push_back((*handler)->last_timings().select_us);
    }
    res.handler_us = Percentile(handler_us, 0.5);
    res.select_us = Percentile(select_us, 0.5);
    // What the engine computes before sending.
    std::vector<double> client_us;
    std::vector<float> queries(size_t{kLayers} * kQHeads * kDim, 0.5f);
    for (int i = 0; i < 200; ++i) {
      const auto t0 = Clock::now();
      if (kind.anchor_floats > 0) {
        AnchorBuilder b(profile);
        b.AddTokens(previous_block, kTokens - 4, 4).IgnoreError();
        b.AddTokens(last_block, 0, 4).IgnoreError();
        auto a =
            b.Finish(kind.anchor_floats == kDim ? AnchorLayout::kPooled : AnchorLayout::kPerLayer);
        if (!a.ok()) Die("anchor", a.status());
      } else if (kind.head_queries) {
        auto q = GatherHeadQueries(queries, kLayers, kQHeads, kDim, profile.calibration());
        if (!q.ok()) Die("head queries", q.status());
      }
      client_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    res.client_us = Percentile(client_us, 0.5);
    results.push_back(res);
    std::printf(
        "%-32s %6zu B  p50 %8.1f us  p99 %8.1f us  daemon %8.1f us (selector %8.1f)"
        "  client %6.1f us\n",
        res.name.c_str(), res.request_bytes, res.p50, res.p99, res.handler_us, res.select_us,
        res.client_us);
  }

  std::string md = absl::StrFormat(
      "# Select v2 cost (kvtier_select_v2_bench)\n\nOne context of %d blocks of %s with %d "
      "calibrated retrieval heads, budget %u blocks, one stream, one context per request, every "
      "block resident; ISA %s; puts of the %d blocks took %.1f s. p50/p99: gRPC round trip; "
      "daemon: SelectHandler "
      "per request without gRPC (p50), of which selector; client: computing the anchor from the "
      "last 8 tokens' keys (client/anchor.h) or gathering the head queries (p50).\n\n"
      "| request | bytes | p50 us | p99 us | vs pooled (p50) | daemon us | selector us | client "
      "us |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
      args.blocks, kShapeName, args.heads, args.budget, std::string(index::simd::ActiveIsa()),
      args.blocks, put_s);
  for (const Result& r : results) {
    absl::StrAppendFormat(&md, "| %s | %zu | %.1f | %.1f | %.2f | %.1f | %.1f | %.1f |\n", r.name,
                          r.request_bytes, r.p50, r.p99, r.p50 / results[0].p50, r.handler_us,
                          r.select_us, r.client_us);
  }
  std::printf("\n%s", md.c_str());
  if (!args.out.empty()) std::ofstream(args.out) << md;
  handler->reset();
  client->reset();
  server->reset();
  std::filesystem::remove_all(dir);
  return 0;
}
