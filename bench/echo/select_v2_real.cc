#include "bench/echo/select_v2_real.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/quality/daemon_backend.h"
#include "bench/quality/long_context.h"
#include "bench/quality/long_inputs.h"
#include "client/anchor.h"
#include "client/client.h"
#include "daemon/config.h"
#include "daemon/server.h"
#include "index/kernels/int8_dot.h"
#include "index/kernels/simd.h"

namespace kvtier::bench {
namespace {

using Clock = std::chrono::steady_clock;
using SelectStream = grpc::ClientReaderWriter<v1::SelectRequest, v1::SelectResponse>;

constexpr int32_t kT = 16, kLayers = 4, kDim = 128;
constexpr size_t kBlockBytes = size_t{kLayers} * 2 * kT * kDim * 2;
constexpr int32_t kAnchorTokens = 8;

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

std::string BlockId(int64_t page) { return absl::StrFormat("real-%08d", page); }

// Page p's payload: every layer's keys in fp16 ([layer][k|v][head][token]
// [dim] with one KV head), the values zero.
std::string Payload(const quality::LongContext& lc, int64_t page) {
  std::string out(kBlockBytes, '\0');
  std::vector<float> keys(size_t{kT} * kDim);
  auto* half = reinterpret_cast<uint16_t*>(out.data());
  for (int32_t l = 0; l < kLayers; ++l) {
    lc.Keys(l, 0, page * kT, kT, keys.data());
    index::simd::FloatToHalfN(keys.data(), half + size_t{2} * l * kT * kDim, keys.size());
  }
  return out;
}

v1::ModelProfile Profile(const index::SelectionCalibration& c) {
  v1::ModelProfile p;
  p.set_name("realkv-copy-paired");
  p.set_revision("1");
  p.set_num_layers(kLayers);
  p.set_num_kv_heads(1);
  p.set_head_dim(kDim);
  p.set_block_size_tokens(kT);
  p.set_dtype(v1::DTYPE_FP16);
  *p.mutable_calibration() = quality::CalibrationToProto(c);
  return p;
}

// The value of the sample `name` (labels included) in Prometheus text; 0
// when absent.
double Sample(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t at = ("\n" + text).find(key);
  if (at == std::string::npos) return 0;
  return std::strtod(text.c_str() + at + key.size() - 1, nullptr);
}

struct Method {
  std::vector<double> us;
  std::vector<std::vector<int64_t>> chosen;  // per step: the positions chosen
  double attention = 0;                      // over steps: the heads' mean attention share chosen
  int64_t targets = 0;                       // (head, step) pairs with a target page
  int64_t kept = 0;                          // of which the choice held the target
};

// The retrieval heads' exact attention over the blocks of a step, in
// float from the context's own keys: what a choice is judged by.
class Attention {
 public:
  Attention(const quality::LongContext& lc, const index::SelectionCalibration& cal)
      : lc_(lc), cal_(cal), keys_(kLayers) {
    for (int32_t l = 0; l < kLayers; ++l) {
      keys_[l].resize(static_cast<size_t>(lc.tokens()) * kDim);
      lc.Keys(l, 0, 0, lc.tokens(), keys_[l].data());
    }
  }

  // Per retrieval head, each of the first `pages` blocks' share of its
  // attention at step s: [R][pages].
  void Step(int32_t s, int64_t pages) {
    const std::vector<float> q = lc_.HeadQueries(s, cal_);
    const size_t R = cal_.retrieval_heads.size();
    const int64_t n = pages * kT;
    share_.assign(R, std::vector<double>(pages, 0.0));
    std::vector<float> logit(n);
    for (size_t i = 0; i < R; ++i) {
      const float* k = keys_[cal_.retrieval_heads[i].layer].data();
      const float* qi = &q[i * kDim];
      float top = -INFINITY;
      for (int64_t t = 0; t < n; ++t) {
        float dot = 0;
        for (int32_t d = 0; d < kDim; ++d) dot += qi[d] * k[t * kDim + d];
        logit[t] = dot * cal_.softmax_scale;
        top = std::max(top, logit[t]);
      }
      double z = 0;
      for (int64_t t = 0; t < n; ++t) {
        const double e = std::exp(double{logit[t]} - top);
        share_[i][t / kT] += e;
        z += e;
      }
      for (double& x : share_[i]) x /= z;
    }
  }

  // Adds the choice's attention share and the targets it holds to *m. A
  // target is a block holding at least head_min_mass of a head's
  // attention (the pages the mass scorer exists to find).
  void Judge(const std::vector<int64_t>& chosen, Method* m) const {
    std::vector<char> in(share_.empty() ? 0 : share_[0].size(), 0);
    for (int64_t b : chosen) {
      if (b >= 0 && b < static_cast<int64_t>(in.size())) in[b] = 1;
    }
    double mean = 0;
    for (const std::vector<double>& head : share_) {
      double got = 0;
      for (size_t b = 0; b < head.size(); ++b) {
        if (in[b]) got += head[b];
        if (head[b] >= cal_.head_min_mass) {
          ++m->targets;
          m->kept += in[b];
        }
      }
      mean += got / static_cast<double>(share_.size());
    }
    m->attention += mean;
  }

 private:
  const quality::LongContext& lc_;
  const index::SelectionCalibration& cal_;
  std::vector<std::vector<float>> keys_;    // per layer [tokens][dim]
  std::vector<std::vector<double>> share_;  // [R][pages]
};

struct RunResult {
  int threads = 0;
  int64_t blocks = 0;
  double put_s = 0;
  Method mass, pooled;
  double reuse = 0;           // share of head-steps that reused
  double pages_per_head = 0;  // pages read per head-step
};

// One daemon, its two contexts and their streams.
class Driver {
 public:
  Driver(const quality::LongContext& lc, const index::SelectionCalibration& cal)
      : lc_(lc), cal_(cal), profile_(Profile(cal)) {}

  ~Driver() {
    for (auto& s : streams_) {
      if (s.stream != nullptr) {
        s.stream->WritesDone();
        s.stream->Finish().IgnoreError();
      }
    }
    client_.reset();
    server_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  absl::Status Start(int threads, int64_t max_blocks) {
    dir_ = absl::StrCat("/tmp/kvtier-selv2-real-", ::getpid(), "-", threads);
    std::filesystem::remove_all(dir_);
    const uint64_t arena = uint64_t(max_blocks + 64) * kBlockBytes;
    absl::StatusOr<daemon::Config> config = daemon::LoadConfig(
        "",
        {"server.data_dir=" + dir_, "log.level=warn",
         absl::StrCat("tiers.device.capacity_bytes=", arena),
         absl::StrCat("tiers.host.capacity_bytes=", arena), "tiers.host.staging_bytes=1MiB",
         "tiers.nvme.file_count=1", "tiers.nvme.file_size_bytes=64MiB", "tiers.nvme.io_threads=1",
         "leases.default_ttl_ms=600000", absl::StrCat("select.batch_threads=", threads)});
    if (!config.ok()) return config.status();
    absl::StatusOr<std::unique_ptr<daemon::Server>> server = daemon::Server::Start(*config);
    if (!server.ok()) return server.status();
    server_ = std::move(*server);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(server_->socket_path());
    if (!client.ok()) return client.status();
    client_ = std::move(*client);
    absl::StatusOr<v1::RegisterProfileResponse> reg = client_->RegisterProfile(profile_);
    if (!reg.ok()) return reg.status();
    profile_id_ = reg->profile_id();
    return absl::OkStatus();
  }

  // Puts pages [0, pages) and opens both contexts with them.
  absl::Status Fill(int64_t pages) {
    for (int64_t p0 = 0; p0 < pages; p0 += 1024) {
      if (absl::Status s = Put(p0, std::min(pages, p0 + 1024)); !s.ok()) return s;
    }
    for (Stream& s : streams_) {
      v1::OpenContextRequest open;
      open.set_profile_id(profile_id_);
      open.set_lease_ttl_ms(600000);
      v1::Segment* seg = open.add_segments();
      for (int64_t p = 0; p < pages; ++p) seg->add_block_ids(BlockId(p));
      grpc::ClientContext ctx;
      v1::OpenContextResponse opened;
      const grpc::Status st = client_->kvtier_stub()->OpenContext(&ctx, open, &opened);
      if (!st.ok()) return absl::InternalError("OpenContext: " + st.error_message());
      s.context = opened.context_id();
      s.ctx = std::make_unique<grpc::ClientContext>();
      s.stream = client_->kvtier_stub()->Select(s.ctx.get());
    }
    pages_ = pages;
    return absl::OkStatus();
  }

  // Decode step s: appends the pages its position completes, then one
  // Select per method.
  absl::Status Step(int32_t s, RunResult* run) {
    const int64_t pos = lc_.QueryPosition(s);
    for (; pages_ < pos / kT; ++pages_) {
      if (absl::Status st = Put(pages_, pages_ + 1); !st.ok()) return st;
      for (const Stream& c : streams_) {
        v1::AppendBlocksRequest req;
        req.set_context_id(c.context);
        req.add_block_ids(BlockId(pages_));
        grpc::ClientContext ctx;
        v1::AppendBlocksResponse resp;
        const grpc::Status st = client_->kvtier_stub()->AppendBlocks(&ctx, req, &resp);
        if (!st.ok()) return absl::InternalError("AppendBlocks: " + st.error_message());
      }
    }
    const uint32_t budget = static_cast<uint32_t>(std::max<int64_t>(2, pages_ / 32));
    v1::SelectRequest mass = Request(0, budget, pos);
    for (float x : lc_.HeadQueries(s, cal_)) mass.mutable_contexts(0)->add_head_queries(x);
    if (absl::Status st = Send(0, mass, &run->mass); !st.ok()) return st;
    v1::SelectRequest pooled = Request(1, budget, pos);
    absl::StatusOr<std::vector<float>> anchor = Anchor(pos);
    if (!anchor.ok()) return anchor.status();
    pooled.mutable_contexts(0)->set_scorer(v1::SCORER_KEY_KEY);
    for (float x : *anchor) pooled.mutable_contexts(0)->add_anchor(x);
    return Send(1, pooled, &run->pooled);
  }

  std::string Metrics() const { return server_->runtime()->metrics()->Render(); }

 private:
  struct Stream {
    uint64_t context = 0;
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<SelectStream> stream;
  };

  absl::Status Put(int64_t p0, int64_t p1) {
    std::vector<v1::PutBlocksRequest> reqs;
    for (int64_t p = p0; p < p1; ++p) {
      if (reqs.empty() || reqs.back().blocks_size() == 32) {
        reqs.emplace_back().set_profile_id(profile_id_);
      }
      v1::BlockPut* b = reqs.back().add_blocks();
      b->set_block_id(BlockId(p));
      b->set_data(Payload(lc_, p));
    }
    absl::StatusOr<v1::PutBlocksResponse> r = client_->PutBlocks(reqs);
    if (!r.ok()) return r.status();
    for (const v1::PutResult& res : r->results()) {
      if (res.status().code() != 0) return absl::InternalError("put: " + res.status().message());
    }
    return absl::OkStatus();
  }

  v1::SelectRequest Request(int which, uint32_t budget, int64_t pos) {
    v1::SelectRequest req;
    req.set_request_id(++request_id_);
    v1::ContextSelect* e = req.add_contexts();
    e->set_context_id(streams_[which].context);
    e->set_max_blocks(budget);
    e->set_step(static_cast<uint64_t>(pos));
    return req;
  }

  // The mean key of the tokens [pos - 8, pos), as an engine computes it.
  absl::StatusOr<std::vector<float>> Anchor(int64_t pos) const {
    AnchorBuilder b(profile_);
    int64_t page = -1;
    std::string payload;
    for (int64_t t = pos - kAnchorTokens; t < pos; ++t) {
      if (t / kT != page) payload = Payload(lc_, page = t / kT);
      const uint32_t first = static_cast<uint32_t>(t % kT);
      if (absl::Status s = b.AddTokens(payload, first, 1); !s.ok()) return s;
    }
    return b.Finish(AnchorLayout::kPooled);
  }

  absl::Status Send(int which, const v1::SelectRequest& req, Method* m) {
    SelectStream* stream = streams_[which].stream.get();
    v1::SelectResponse resp;
    const auto start = Clock::now();
    if (!stream->Write(req) || !stream->Read(&resp)) {
      return absl::UnavailableError("the Select stream closed");
    }
    m->us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    if (resp.contexts_size() != 1 || resp.contexts(0).status().code() != 0) {
      return absl::InternalError(absl::StrCat(
          "Select: ", resp.contexts_size() == 1 ? resp.contexts(0).status().message() : "empty"));
    }
    std::vector<int64_t>& chosen = m->chosen.emplace_back();
    for (const v1::SelectedBlock& b : resp.contexts(0).blocks()) chosen.push_back(b.position());
    return absl::OkStatus();
  }

  const quality::LongContext& lc_;
  const index::SelectionCalibration& cal_;
  const v1::ModelProfile profile_;
  std::string dir_;
  std::unique_ptr<daemon::Server> server_;
  std::unique_ptr<Client> client_;
  uint64_t profile_id_ = 0;
  Stream streams_[2];  // mass, pooled
  int64_t pages_ = 0;
  uint64_t request_id_ = 0;
};

absl::StatusOr<RunResult> RunOnce(const quality::LongContext& lc,
                                  const index::SelectionCalibration& cal, int threads,
                                  int32_t steps) {
  RunResult run;
  run.threads = threads;
  Driver d(lc, cal);
  if (absl::Status s = d.Start(threads, lc.tokens() / kT); !s.ok()) return s;
  const auto put0 = Clock::now();
  if (absl::Status s = d.Fill(lc.QueryPosition(0) / kT); !s.ok()) return s;
  run.put_s = std::chrono::duration<double>(Clock::now() - put0).count();
  const std::string before = d.Metrics();
  for (int32_t s = 0; s < steps; ++s) {
    if (absl::Status st = d.Step(s, &run); !st.ok()) return st;
  }
  const std::string after = d.Metrics();
  auto delta = [&](const std::string& name) { return Sample(after, name) - Sample(before, name); };
  const double reused = delta("kvtier_select_mass_heads_total{path=\"reused\"}");
  const double descended = delta("kvtier_select_mass_heads_total{path=\"descended\"}");
  const double heads = reused + descended;
  run.reuse = heads > 0 ? reused / heads : 0;
  run.pages_per_head = heads > 0 ? delta("kvtier_select_mass_pages_opened_total") / heads : 0;
  run.blocks = lc.QueryPosition(steps - 1) / kT;
  return run;
}

std::string Row(int threads, const std::string& name, const Method& m, double pooled_p50,
                int32_t steps) {
  const double p50 = Percentile(m.us, 0.5);
  return absl::StrFormat("| %d | %s | %.1f | %.1f | %.2f | %.3f | %lld/%lld |", threads, name, p50,
                         Percentile(m.us, 0.99), p50 / pooled_p50, m.attention / steps,
                         static_cast<long long>(m.kept), static_cast<long long>(m.targets));
}

std::string Report(const RealKeysOptions& o, const std::vector<RunResult>& runs) {
  std::string md = absl::StrFormat(
      "# Select through kvtierd on real keys (kvtier_select_v2_bench --keys real)\n\n"
      "One context of %lld tokens (%lld blocks at the last step) built from the shared copy "
      "model's dumps with paired heads (head_dim 128; 4 layers, 1 KV head, 16 tokens, fp16), "
      "8 retrieval heads (quality::PairedCalibration), a daemon on its embedded defaults per "
      "select.batch_threads value; %d consecutive decode steps, each appending the block it "
      "completes, then one Select per method on its own stream, budget 1/32 of the blocks; "
      "ISA %s. p50/p99: gRPC round trip over the steps. attention: the retrieval heads' exact "
      "attention (float, every key) held by the chosen blocks, mean over heads and steps. "
      "targets: (head, step) blocks holding >= head_min_mass of a head's attention, and how many "
      "the choice held. reuse and pages read: the daemon's kvtier_select_mass_* counters.\n\n"
      "| threads | method | p50 us | p99 us | vs pooled (p50) | attention | targets kept | reuse "
      "| pages read per head-step | puts s |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
      static_cast<long long>(o.tokens), static_cast<long long>(runs.empty() ? 0 : runs[0].blocks),
      o.steps, std::string(index::Int8DotIsa()));
  for (const RunResult& r : runs) {
    const double pooled = Percentile(r.pooled.us, 0.5);
    absl::StrAppendFormat(&md, "%s %.3f | %.0f (%.2f%%) | %.1f |\n",
                          Row(r.threads, "mass (shipped)", r.mass, pooled, o.steps), r.reuse,
                          r.pages_per_head,
                          100.0 * r.pages_per_head / static_cast<double>(r.blocks), r.put_s);
    absl::StrAppendFormat(&md, "%s | | |\n",
                          Row(r.threads, "pooled anchor (key-key)", r.pooled, pooled, o.steps));
  }
  return md;
}

}  // namespace

int RunRealKeys(const RealKeysOptions& o) {
  std::vector<quality::KvDump> dumps;
  index::SelectionCalibration copy;
  if (absl::Status s = quality::LoadLongInputs(o.dumps_dir, o.calibration_dir, &dumps, &copy);
      !s.ok()) {
    std::fprintf(stderr, "kvtier_select_v2_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  const index::SelectionCalibration cal = quality::PairedCalibration(copy);
  std::vector<const quality::KvDump*> ptrs;
  for (const quality::KvDump& d : dumps) ptrs.push_back(&d);
  quality::LongContextOptions lo;
  lo.tokens = o.tokens;
  lo.pair_heads = true;
  lo.query_stride = 1;
  lo.query_steps = o.steps;
  absl::StatusOr<quality::LongContext> lc = quality::LongContext::Build(ptrs, lo);
  if (!lc.ok()) {
    std::fprintf(stderr, "kvtier_select_v2_bench: %s\n", lc.status().ToString().c_str());
    return 1;
  }
  std::vector<RunResult> runs;
  for (int t : o.threads) {
    std::printf("threads %d: putting %lld blocks of %zu KiB...\n", t,
                static_cast<long long>(lc->QueryPosition(0) / kT), kBlockBytes / 1024);
    absl::StatusOr<RunResult> r = RunOnce(*lc, cal, t, o.steps);
    if (!r.ok()) {
      std::fprintf(stderr, "kvtier_select_v2_bench: %s\n", r.status().ToString().c_str());
      return 1;
    }
    runs.push_back(*r);
  }
  // Judged after every run is timed: the exact attention sweeps every key,
  // which would evict the daemon's index between the timed steps.
  Attention attention(*lc, cal);
  for (int32_t s = 0; s < o.steps; ++s) {
    attention.Step(s, lc->QueryPosition(s) / kT);
    for (RunResult& r : runs) {
      attention.Judge(r.mass.chosen[s], &r.mass);
      attention.Judge(r.pooled.chosen[s], &r.pooled);
    }
  }
  const std::string md = Report(o, runs);
  std::printf("\n%s", md.c_str());
  if (!o.out.empty()) std::ofstream(o.out) << md;
  return 0;
}

}  // namespace kvtier::bench
