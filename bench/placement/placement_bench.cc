// kvtier_placement_bench: the placement policies (tiers.placement) judged on
// real model KV, replayed as an engine drives kvtierd (docs/QUALITY.md,
// "Placement").
//
// Per model of the realkv dumps (each group: every dump of one model, its
// contexts live at once and interleaved step by step), per policy and per
// tier size, one kvtierd is started in this process on its embedded
// defaults plus:
//   tiers.placement = the policy, tiers.device.capacity_bytes and
//   tiers.host.capacity_bytes = size x the working set (every block of every
//   context at the end of the replay), NVMe big enough for all of it.
// The engine's side, over real gRPC on the daemon's Unix socket: the profile
// is registered with the model's committed calibration; each dump's prompt
// blocks (the first half) are put and opened as a context; then, for every
// decode step t, each context puts and appends the block completed at t (if
// any), and ONE Select request asks for every context (SCORER_UNSPECIFIED:
// the shipped scorer, pooled anchor of the last 8 keys and the retrieval
// heads' queries at t, a budget of --budget of the context's blocks, the
// partial block and the shipped sink/local blocks counted in it).
// Between steps the bench waits for the daemon's prefetcher to go idle (an
// NVMe read of a 32 KiB block takes well under a decode step), which makes a
// run deterministic; an engine does not wait.
//
// Measured over the decode steps, from the store's counters (the ones behind
// kvtier_reads_total{tier} and kvtier_promotions_total{tier}):
//   fast-tier hit rate  selected blocks whose fastest copy was in the device
//                       or host tier when Select asked for them (no disk
//                       read needed), over all selected blocks
//   device hit rate     of those, already in the device arena
//   resident share      selected blocks answered RESIDENT (an arena handle
//                       now; the rest PENDING: on NVMe, or no unpinned slot)
//   promoted bytes per step  NVMe -> host (Select misses and the
//                       prefetcher's rising blocks) and host -> device
//   demoted bytes per step   host -> NVMe (last copies written to make room)
//
// Output (--out): placement.csv, placement.md; plot.py draws placement.png.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/quality/calibrate.h"
#include "bench/quality/kv_dump.h"
#include "bench/quality/methods.h"
#include "bench/quality/metrics.h"
#include "bench/quality/replay_data.h"
#include "client/client.h"
#include "daemon/config.h"
#include "daemon/options.h"
#include "daemon/server.h"

namespace kvtier::placement {
namespace {

using quality::ReplayData;

struct Options {
  std::string data_dir;
  std::string calibration_dir;
  std::string out_dir;
  std::vector<std::string> policies;
  std::vector<double> sizes;
  double budget = 0.125;
  int64_t max_steps = 0;  // 0: every decode step
  int repeat = 3;         // runs per (model, policy, size), pooled
};

// One model's dumps, replayed together.
struct Group {
  std::string model;
  std::vector<quality::KvDump> dumps;
  std::vector<ReplayData> data;  // one per dump (points into dumps)
  index::SelectionCalibration calibration;
};

struct RunResult {
  std::string model;
  std::string policy;
  double size = 0;
  int contexts = 0;
  int64_t steps = 0;
  uint64_t block_bytes = 0;
  uint64_t working_set_bytes = 0;
  uint64_t tier_bytes = 0;  // device = host capacity
  uint64_t selected = 0;    // blocks Select returned
  uint64_t resident = 0;    // of those, RESIDENT
  // FNV-1a over (step, context, position) of every selected block: equal
  // across policies when placement did not change what Select chose.
  uint64_t selection_digest = 14695981039346656037ull;
  uint64_t reads[kNumTiers] = {0, 0, 0};
  uint64_t promoted_host = 0;    // NVMe -> host copies
  uint64_t promoted_device = 0;  // host -> device copies
  uint64_t demoted = 0;          // host -> NVMe (last copies)
  uint64_t evicted = 0;
  double seconds = 0;
  // Over the repetitions pooled into this result: how many, and the lowest
  // and highest fast-tier hit rate of one of them.
  int repeats = 1;
  double fast_hit_min = 0;
  double fast_hit_max = 0;

  uint64_t read_total() const { return reads[0] + reads[1] + reads[2]; }
  double fast_hit() const {
    return read_total() ? double(reads[0] + reads[1]) / double(read_total()) : 0;
  }
  double device_hit() const { return read_total() ? double(reads[0]) / double(read_total()) : 0; }
  double resident_share() const { return selected ? double(resident) / double(selected) : 0; }
  double PerStep(uint64_t blocks) const {
    return steps ? double(blocks) * double(block_bytes) / double(steps) : 0;
  }
};

// tiers.placement and the variant keys of a policy name of this bench.
std::vector<std::string> PolicyOverrides(const std::string& policy) {
  if (policy == "stability_unwanted_first") {
    return {"tiers.placement=stability", "tiers.stability.unwanted_first=true"};
  }
  return {"tiers.placement=" + policy};
}

v1::ModelProfile ProfileOf(const Group& g) {
  const quality::KvDump& d = g.dumps.front();
  v1::ModelProfile p;
  p.set_name(g.model);
  p.set_revision("placement-bench");
  p.set_num_layers(d.num_layers);
  p.set_num_kv_heads(d.num_kv_heads);
  p.set_head_dim(d.head_dim);
  p.set_block_size_tokens(g.data.front().options.block_size);
  p.set_dtype(v1::DTYPE_FP16);
  const index::SelectionCalibration& c = g.calibration;
  if (c.calibrated()) {
    v1::SelectionCalibration* pc = p.mutable_calibration();
    pc->set_num_q_heads(static_cast<uint32_t>(c.num_q_heads));
    for (const index::HeadRef& h : c.retrieval_heads) {
      v1::HeadRef* r = pc->add_retrieval_heads();
      r->set_layer(static_cast<uint32_t>(h.layer));
      r->set_q_head(static_cast<uint32_t>(h.q_head));
    }
    for (float x : c.prior) pc->add_prior(x);
    for (float x : c.prior_all) pc->add_prior_all(x);
    for (float x : c.head_weights) pc->add_head_weights(x);
    pc->set_softmax_scale(c.softmax_scale);
    pc->set_head_min_mass(c.head_min_mass);
  }
  return p;
}

absl::Status ItemError(const v1::ItemStatus& s, const std::string& what) {
  return absl::Status(static_cast<absl::StatusCode>(s.code()),
                      absl::StrCat(what, ": ", s.message()));
}

std::string BlockId(size_t context, int64_t block) {
  return absl::StrCat("c", context, "-b", block);
}

absl::Status PutBlocks(Client& client, uint64_t profile_id, const ReplayData& data, size_t context,
                       int64_t from, int64_t to) {
  std::vector<v1::PutBlocksRequest> reqs(1);
  for (int64_t b = from; b < to; ++b) {
    if (reqs.back().blocks_size() == 64) reqs.emplace_back();
    reqs.back().set_profile_id(profile_id);
    v1::BlockPut* put = reqs.back().add_blocks();
    put->set_block_id(BlockId(context, b));
    put->set_data(data.payloads[b]);
  }
  absl::StatusOr<v1::PutBlocksResponse> r = client.PutBlocks(reqs);
  if (!r.ok()) return r.status();
  for (const auto& result : r->results()) {
    if (result.status().code() != 0) return ItemError(result.status(), "PutBlocks");
  }
  return absl::OkStatus();
}

// The daemon's settings for one run: the embedded defaults plus its files
// in `dir`, the tier sizes and the policy.
std::vector<std::string> DaemonOverrides(const std::string& dir, uint64_t tier_bytes,
                                         uint64_t nvme_bytes, const std::string& policy) {
  std::vector<std::string> overrides = {
      "server.data_dir=" + dir,
      "tiers.device.shm_dir=" + dir,
      "tiers.host.shm_dir=" + dir,
      "log.level=warn",
      "server.shutdown_grace_ms=1000",
      absl::StrCat("tiers.device.capacity_bytes=", tier_bytes),
      absl::StrCat("tiers.host.capacity_bytes=", tier_bytes),
      "tiers.host.staging_bytes=1MiB",
      "tiers.nvme.file_count=1",
      absl::StrCat("tiers.nvme.file_size_bytes=", nvme_bytes),
      "tiers.nvme.io_threads=1",
      "leases.default_ttl_ms=600000",
      // One block of a PutBlocks message at a time: the blocks of a prompt
      // enter the tiers in order, so that a run is deterministic.
      "server.put_parallelism=1",
  };
  for (const std::string& p : PolicyOverrides(policy)) overrides.push_back(p);
  return overrides;
}

// Puts each context's prompt blocks and opens it, one context after
// another; fills the context ids and how many blocks each holds.
absl::Status Prefill(Client& client, uint64_t profile_id, const Group& g,
                     std::vector<uint64_t>* context_ids, std::vector<int64_t>* appended) {
  const int64_t bs = g.data.front().options.block_size;
  const int64_t prompt = g.data.front().prompt_tokens;
  for (size_t c = 0; c < g.data.size(); ++c) {
    const ReplayData& d = g.data[c];
    if (d.prompt_tokens != prompt || d.options.block_size != bs) {
      return absl::InvalidArgumentError("the dumps of a group must have one shape");
    }
    const int64_t complete = prompt / bs;  // complete blocks before step `prompt`
    if (absl::Status s = PutBlocks(client, profile_id, d, c, 0, complete); !s.ok()) return s;
    v1::OpenContextRequest req;
    req.set_profile_id(profile_id);
    req.set_lease_ttl_ms(600000);
    v1::Segment* seg = req.add_segments();
    for (int64_t b = 0; b < complete; ++b) seg->add_block_ids(BlockId(c, b));
    grpc::ClientContext ctx;
    v1::OpenContextResponse resp;
    grpc::Status st = client.kvtier_stub()->OpenContext(&ctx, req, &resp);
    if (!st.ok()) return absl::UnknownError(absl::StrCat("OpenContext: ", st.error_message()));
    context_ids->push_back(resp.context_id());
    appended->push_back(complete);
  }
  return absl::OkStatus();
}

// Puts and appends context c's blocks in [*appended, num_complete).
absl::Status AppendCompleted(Client& client, uint64_t profile_id, const ReplayData& d, size_t c,
                             uint64_t context_id, int64_t num_complete, int64_t* appended) {
  if (*appended >= num_complete) return absl::OkStatus();
  if (absl::Status s = PutBlocks(client, profile_id, d, c, *appended, num_complete); !s.ok()) {
    return s;
  }
  v1::AppendBlocksRequest req;
  req.set_context_id(context_id);
  for (int64_t b = *appended; b < num_complete; ++b) req.add_block_ids(BlockId(c, b));
  grpc::ClientContext ctx;
  v1::AppendBlocksResponse resp;
  grpc::Status st = client.kvtier_stub()->AppendBlocks(&ctx, req, &resp);
  if (!st.ok()) return absl::UnknownError(absl::StrCat("AppendBlocks: ", st.error_message()));
  *appended = num_complete;
  return absl::OkStatus();
}

// Context c's entry of the step-t Select, as an engine on the shipped
// defaults sends it: the pooled anchor, the retrieval heads' queries at t,
// the budget less the engine's partial block.
void AddContextSelect(const Group& g, size_t c, int64_t t, int64_t step, uint64_t context_id,
                      const index::SelectorOptions& selector, double budget_fraction,
                      quality::StepInput* in, v1::SelectRequest* req) {
  const ReplayData& d = g.data[c];
  const int64_t bs = d.options.block_size;
  const int64_t num_complete = (t + 1) / bs;
  const int64_t num_blocks = (t + bs) / bs;
  const bool partial = num_blocks > num_complete;
  quality::ComputeAnchors(d, t, in);
  const quality::ForcedBlocks forced = quality::ForcedBlocks::Make(
      num_blocks, selector.sink_blocks, selector.local_blocks + (partial ? 1 : 0));
  const int64_t budget = quality::StepBudget(budget_fraction, num_blocks, forced.count());
  v1::ContextSelect* e = req->add_contexts();
  e->set_context_id(context_id);
  for (float x : in->anchor) e->add_anchor(x);
  for (const index::HeadRef& h : g.calibration.retrieval_heads) {
    const float* q = g.dumps[c].Q(h.layer, h.q_head, t);
    for (int32_t i = 0; i < g.dumps[c].head_dim; ++i) e->add_head_queries(q[i]);
  }
  e->set_scorer(v1::SCORER_UNSPECIFIED);
  e->set_max_blocks(static_cast<uint32_t>(budget - (partial ? 1 : 0)));
  e->set_step(static_cast<uint64_t>(step));
}

// Counts the step-t answer into *out.
absl::Status CountSelection(const v1::SelectResponse& resp, int64_t t, RunResult* out) {
  for (int c = 0; c < resp.contexts_size(); ++c) {
    const v1::ContextSelection& sel = resp.contexts(c);
    if (sel.status().code() != 0) return ItemError(sel.status(), "Select");
    for (const v1::SelectedBlock& b : sel.blocks()) {
      ++out->selected;
      out->resident += b.residency() == v1::RESIDENCY_RESIDENT;
      for (uint64_t x : {static_cast<uint64_t>(t), static_cast<uint64_t>(c),
                         static_cast<uint64_t>(b.position())}) {
        out->selection_digest = (out->selection_digest ^ x) * 1099511628211ull;
      }
    }
  }
  return absl::OkStatus();
}

// One daemon, one policy and size, one model's contexts replayed.
absl::StatusOr<RunResult> RunOne(const Group& g, const std::string& policy, double size,
                                 const Options& o, int run_index) {
  RunResult out;
  out.model = g.model;
  out.policy = policy;
  out.size = size;
  out.contexts = static_cast<int>(g.data.size());
  out.block_bytes = static_cast<uint64_t>(g.data.front().block_bytes);
  for (const ReplayData& d : g.data) {
    out.working_set_bytes += static_cast<uint64_t>(d.num_complete) * out.block_bytes;
  }
  out.tier_bytes = static_cast<uint64_t>(size * double(out.working_set_bytes)) / out.block_bytes *
                   out.block_bytes;
  const uint64_t nvme_bytes = (2 * out.working_set_bytes + (64u << 20)) & ~uint64_t{(1u << 20) - 1};

  const std::string dir = absl::StrCat(std::filesystem::temp_directory_path().string(),
                                       "/kvtier-placement-", ::getpid(), "-", run_index);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  absl::StatusOr<daemon::Config> config =
      daemon::LoadConfig("", DaemonOverrides(dir, out.tier_bytes, nvme_bytes, policy));
  if (!config.ok()) return config.status();
  const index::SelectorOptions selector = daemon::SelectorOptionsOf(*config);
  absl::StatusOr<std::unique_ptr<daemon::Server>> server = daemon::Server::Start(*config);
  if (!server.ok()) return server.status();
  struct Cleanup {
    std::unique_ptr<daemon::Server>* server;
    std::string dir;
    ~Cleanup() {
      server->reset();
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{&*server, dir};
  BlockStore* store = (*server)->runtime()->store();
  daemon::Prefetcher* prefetcher = (*server)->runtime()->prefetcher();
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect((*server)->socket_path());
  if (!client.ok()) return client.status();
  absl::StatusOr<v1::RegisterProfileResponse> profile = (*client)->RegisterProfile(ProfileOf(g));
  if (!profile.ok()) return profile.status();
  if (profile->block_size_bytes() != out.block_bytes) {
    return absl::InternalError("profile block size differs from the replay's payloads");
  }
  const uint64_t profile_id = profile->profile_id();
  std::vector<uint64_t> context_ids;
  std::vector<int64_t> appended;
  if (absl::Status s = Prefill(**client, profile_id, g, &context_ids, &appended); !s.ok()) {
    return s;
  }

  // Decode: every step, each context's completed block is put and
  // appended, then one Select asks for every context.
  grpc::ClientContext stream_ctx;
  auto stream = (*client)->kvtier_stub()->Select(&stream_ctx);
  const BlockStoreStats before = store->Stats();
  const auto t0 = std::chrono::steady_clock::now();
  int64_t T = g.dumps.front().seq_len;
  for (const quality::KvDump& d : g.dumps) T = std::min(T, d.seq_len);
  const int64_t bs = g.data.front().options.block_size;
  quality::StepInput in;
  v1::SelectRequest req;
  v1::SelectResponse resp;
  for (int64_t t = g.data.front().prompt_tokens; t < T; ++t) {
    if (o.max_steps > 0 && out.steps >= o.max_steps) break;
    req.Clear();
    req.set_request_id(static_cast<uint64_t>(t));
    for (size_t c = 0; c < g.data.size(); ++c) {
      if (absl::Status s = AppendCompleted(**client, profile_id, g.data[c], c, context_ids[c],
                                           (t + 1) / bs, &appended[c]);
          !s.ok()) {
        return s;
      }
      AddContextSelect(g, c, t, out.steps + 1, context_ids[c], selector, o.budget, &in, &req);
    }
    if (!stream->Write(req) || !stream->Read(&resp)) {
      return absl::UnavailableError(
          absl::StrCat("Select stream closed: ", stream->Finish().error_message()));
    }
    if (absl::Status s = CountSelection(resp, t, &out); !s.ok()) return s;
    prefetcher->WaitIdle();  // the step's NVMe reads are done (see above)
    ++out.steps;
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const BlockStoreStats after = store->Stats();
  stream->WritesDone();
  if (grpc::Status st = stream->Finish(); !st.ok()) {
    return absl::UnknownError(absl::StrCat("Select stream: ", st.error_message()));
  }
  for (int t = 0; t < kNumTiers; ++t) out.reads[t] = after.reads_from[t] - before.reads_from[t];
  out.promoted_host = after.promotions[1] - before.promotions[1];
  out.promoted_device = after.promotions[0] - before.promotions[0];
  out.demoted = after.demotions - before.demotions;
  out.evicted = after.evicted_blocks - before.evicted_blocks;
  // Every selected block was asked for exactly once (AcquireHandles); no
  // other read happened during the replay.
  if (out.read_total() != out.selected || after.read_misses != before.read_misses) {
    return absl::InternalError(absl::StrCat("reads counted ", out.read_total(),
                                            " but Select returned ", out.selected, " blocks"));
  }
  return out;
}

std::string Fraction(double f) {
  if (f > 0 && std::abs(1.0 / f - std::round(1.0 / f)) < 1e-9) {
    return absl::StrCat("1/", static_cast<int>(std::round(1.0 / f)));
  }
  return absl::StrCat(f);
}

// Counts of `rs` added up under `model`: rates become pooled rates. With
// `repeats`, rs are repetitions of one configuration; else parts (models) of
// one repetition.
RunResult Sum(const std::vector<RunResult>& rs, const std::string& model, bool repeats) {
  RunResult s = rs.front();
  s.model = model;
  s.contexts = 0;
  s.steps = 0;
  s.working_set_bytes = 0;
  s.tier_bytes = 0;
  s.selected = s.resident = s.promoted_host = s.promoted_device = s.demoted = s.evicted = 0;
  for (uint64_t& r : s.reads) r = 0;
  s.seconds = 0;
  s.fast_hit_min = 1;
  s.fast_hit_max = 0;
  for (const RunResult& r : rs) {
    if (!repeats || s.contexts == 0) {
      s.contexts += r.contexts;
      s.working_set_bytes += r.working_set_bytes;
      s.tier_bytes += r.tier_bytes;
    }
    s.steps += r.steps;
    s.selected += r.selected;
    s.resident += r.resident;
    for (int t = 0; t < kNumTiers; ++t) s.reads[t] += r.reads[t];
    s.promoted_host += r.promoted_host;
    s.promoted_device += r.promoted_device;
    s.demoted += r.demoted;
    s.evicted += r.evicted;
    s.seconds += r.seconds;
    s.fast_hit_min = std::min(s.fast_hit_min, r.fast_hit());
    s.fast_hit_max = std::max(s.fast_hit_max, r.fast_hit());
  }
  // Per-step figures are averages over every step added up here (for
  // "all": over both models' steps).
  if (repeats) s.repeats = static_cast<int>(rs.size());
  return s;
}

absl::Status WriteOutputs(const std::vector<RunResult>& results, const Options& o, double wall_s) {
  std::filesystem::create_directories(o.out_dir);
  std::ofstream csv(o.out_dir + "/placement.csv");
  csv << "model,policy,size,contexts,steps,block_bytes,working_set_bytes,tier_bytes,selected,"
         "reads_device,reads_host,reads_nvme,fast_hit_rate,device_hit_rate,resident_share,"
         "promoted_nvme_to_host_bytes_per_step,promoted_host_to_device_bytes_per_step,"
         "demoted_host_to_nvme_bytes_per_step,evicted_blocks,seconds,repeats,fast_hit_rate_min,"
         "fast_hit_rate_max\n";
  for (const RunResult& r : results) {
    csv << absl::StrFormat(
        "%s,%s,%.6g,%d,%d,%d,%d,%d,%d,%d,%d,%d,%.6f,%.6f,%.6f,%.1f,%.1f,%.1f,%d,"
        "%.2f,%d,%.6f,%.6f\n",
        r.model, r.policy, r.size, r.contexts, r.steps, r.block_bytes, r.working_set_bytes,
        r.tier_bytes, r.selected, r.reads[0], r.reads[1], r.reads[2], r.fast_hit(), r.device_hit(),
        r.resident_share(), r.PerStep(r.promoted_host), r.PerStep(r.promoted_device),
        r.PerStep(r.demoted), r.evicted, r.seconds, r.repeats, r.fast_hit_min, r.fast_hit_max);
  }
  std::ofstream md(o.out_dir + "/placement.md");
  md << "# Placement on the shared real-model KV\n\n"
     << absl::StrFormat(
            "Budget %s of each context's blocks per step; device = host capacity = size x the "
            "working set; %d runs pooled per row (hit-rate range over the runs in brackets). "
            "Wall time %.0f s.\n\n",
            Fraction(o.budget), o.repeat, wall_s);
  md << "| model | size | policy | fast-tier hit rate | device hit rate | resident | NVMe->host "
        "KiB/step | host->device KiB/step | host->NVMe KiB/step |\n"
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const RunResult& r : results) {
    md << absl::StrFormat(
        "| %s | %s | %s | %.4f [%.4f, %.4f] | %.4f | %.4f | %.1f | %.1f | %.1f |\n", r.model,
        Fraction(r.size), r.policy, r.fast_hit(), r.fast_hit_min, r.fast_hit_max, r.device_hit(),
        r.resident_share(), r.PerStep(r.promoted_host) / 1024, r.PerStep(r.promoted_device) / 1024,
        r.PerStep(r.demoted) / 1024);
  }
  if (!csv || !md) return absl::InternalError(absl::StrCat("cannot write into ", o.out_dir));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Group>> LoadGroups(const Options& o) {
  absl::StatusOr<std::map<std::string, index::SelectionCalibration>> calibrations =
      quality::LoadCalibrations(o.calibration_dir);
  if (!calibrations.ok()) return calibrations.status();
  std::vector<std::string> paths;
  for (const auto& e : std::filesystem::directory_iterator(o.data_dir)) {
    if (e.path().extension() == ".safetensors") paths.push_back(e.path().string());
  }
  std::sort(paths.begin(), paths.end());
  if (paths.empty()) return absl::NotFoundError(absl::StrCat("no dumps in ", o.data_dir));
  std::map<std::string, Group> by_model;
  for (const std::string& p : paths) {
    absl::StatusOr<quality::KvDump> d = quality::LoadKvDump(p);
    if (!d.ok()) return d.status();
    Group& g = by_model[d->metadata["model"]];
    g.model = d->metadata["model"];
    g.dumps.push_back(std::move(*d));
  }
  std::vector<Group> groups;
  for (auto& [model, g] : by_model) {
    auto cal = calibrations->find(model);
    if (cal == calibrations->end()) {
      return absl::NotFoundError(
          absl::StrCat("no calibration of model ", model, " in ", o.calibration_dir));
    }
    g.calibration = cal->second;
    for (const quality::KvDump& d : g.dumps) {
      absl::StatusOr<ReplayData> data = quality::BuildReplayData(d, quality::ReplayOptions());
      if (!data.ok()) return data.status();
      data->calibration = g.calibration;
      g.data.push_back(std::move(*data));
    }
    groups.push_back(std::move(g));
  }
  // ReplayData points at its dump: fix the pointers after the moves.
  for (Group& g : groups) {
    for (size_t i = 0; i < g.dumps.size(); ++i) g.data[i].dump = &g.dumps[i];
  }
  return groups;
}

int Main(int argc, char** argv) {
  Options o;
  o.data_dir = KVTIER_REALKV_DIR;
  o.calibration_dir = KVTIER_CALIBRATION_DIR;
  o.out_dir = "bench/out/placement";
  std::string policies = "keydiff,lru,stability,stability_unwanted_first";
  std::string sizes = "0.25,0.125";
  CLI::App app{"kvtier_placement_bench: placement policies on real KV through kvtierd"};
  app.add_option("--data", o.data_dir, "folder of realkv *.safetensors dumps");
  app.add_option("--calibrations", o.calibration_dir, "folder of the models' calibrations");
  app.add_option("--out", o.out_dir, "where placement.csv and placement.md go");
  app.add_option("--policies", policies,
                 "comma-separated: keydiff, lru, stability, stability_unwanted_first");
  app.add_option("--sizes", sizes, "device = host capacity as fractions of the working set");
  app.add_option("--budget", o.budget, "Select budget, fraction of a context's blocks");
  app.add_option("--max-steps", o.max_steps, "decode steps per run (0: all)");
  app.add_option("--repeat", o.repeat, "runs per model, policy and size (pooled)")
      ->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  o.policies = absl::StrSplit(policies, ',', absl::SkipEmpty());
  for (absl::string_view s : absl::StrSplit(sizes, ',', absl::SkipEmpty())) {
    double f = 0;
    if (!absl::SimpleAtod(s, &f) || !(f > 0 && f <= 1)) {
      std::fprintf(stderr, "--sizes: %s is not a fraction in (0, 1]\n", std::string(s).c_str());
      return 2;
    }
    o.sizes.push_back(f);
  }
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<Group>> groups = LoadGroups(o);
  if (!groups.ok()) {
    std::fprintf(stderr, "%s\n", groups.status().ToString().c_str());
    return 1;
  }
  std::vector<RunResult> results;
  // Placement must not change what Select chooses: every run of a model
  // sees the same selections (else the comparison is not like for like).
  std::map<std::string, uint64_t> digests;
  int run = 0;
  for (double size : o.sizes) {
    for (const std::string& policy : o.policies) {
      // runs[rep][group]
      std::vector<std::vector<RunResult>> runs(o.repeat);
      for (int rep = 0; rep < o.repeat; ++rep) {
        for (const Group& g : *groups) {
          absl::StatusOr<RunResult> r = RunOne(g, policy, size, o, run++);
          if (!r.ok()) {
            std::fprintf(stderr, "%s / %s / %s: %s\n", g.model.c_str(), policy.c_str(),
                         Fraction(size).c_str(), r.status().ToString().c_str());
            return 1;
          }
          std::fprintf(stderr,
                       "%-18s size %-4s %-25s #%d hit %.4f (device %.4f) resident %.4f  "
                       "NVMe->host %.1f KiB/step  host->device %.1f KiB/step  %.1f s  "
                       "selections %016llx\n",
                       g.model.c_str(), Fraction(size).c_str(), policy.c_str(), rep, r->fast_hit(),
                       r->device_hit(), r->resident_share(), r->PerStep(r->promoted_host) / 1024,
                       r->PerStep(r->promoted_device) / 1024, r->seconds,
                       static_cast<unsigned long long>(r->selection_digest));
          auto [it, first] = digests.emplace(g.model, r->selection_digest);
          if (!first && it->second != r->selection_digest) {
            std::fprintf(stderr, "%s: Select chose other blocks under %s than in earlier runs\n",
                         g.model.c_str(), policy.c_str());
            return 1;
          }
          runs[rep].push_back(*r);
        }
      }
      for (size_t gi = 0; gi < groups->size(); ++gi) {
        std::vector<RunResult> reps;
        for (const auto& per_group : runs) reps.push_back(per_group[gi]);
        results.push_back(Sum(reps, (*groups)[gi].model, /*repeats=*/true));
      }
      if (groups->size() > 1) {
        std::vector<RunResult> reps;
        for (const auto& per_group : runs) reps.push_back(Sum(per_group, "all", false));
        results.push_back(Sum(reps, "all", /*repeats=*/true));
      }
    }
  }
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (absl::Status s = WriteOutputs(results, o, wall_s); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("wrote %s/placement.csv and placement.md (%.0f s)\n", o.out_dir.c_str(), wall_s);
  return 0;
}

}  // namespace
}  // namespace kvtier::placement

int main(int argc, char** argv) { return kvtier::placement::Main(argc, argv); }
