#include "bench/quality/replay.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"

namespace kvtier::quality {
namespace {

using Clock = std::chrono::steady_clock;

struct RunState {
  const RunSpec* spec = nullptr;
  // The blocks the method always keeps: the options', or for the mass
  // scorer a calibration's own sink and local blocks when it sets them
  // (index/select/calibration.h).
  int32_t sink_blocks = 0, local_blocks = 0;
  std::unique_ptr<Method> method;
  std::unique_ptr<Method> twin;  // kvtierd, end-to-end mode
  std::vector<int64_t> prev;
  int64_t prev_num_blocks = 0;
  bool has_prev = false;
  RunResult* result = nullptr;
};

absl::Status CheckSelection(const RunSpec& spec, const StepInput& in,
                            const std::vector<int64_t>& blocks) {
  auto bad = [&](absl::string_view what) {
    return absl::InternalError(absl::StrCat("method ", spec.method, " (", spec.variant, ", budget ",
                                            spec.budget, ") at step ", in.t, ": ", what));
  };
  if (static_cast<int64_t>(blocks.size()) > in.budget) {
    return bad(absl::StrCat("chose ", blocks.size(), " blocks, budget ", in.budget));
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i] < 0 || blocks[i] >= in.num_blocks || (i > 0 && blocks[i] <= blocks[i - 1])) {
      return bad("selection is not ascending within the visible blocks");
    }
  }
  for (int64_t b = 0; b < in.num_blocks; ++b) {
    if (in.forced.Contains(b) && !std::binary_search(blocks.begin(), blocks.end(), b)) {
      return bad(absl::StrCat("forced block ", b, " is missing"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckCalibration(const index::SelectionCalibration& c, const ReplayData& data) {
  if (c.calibrated() && c.num_q_heads != data.dump->num_q_heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_q_heads ", c.num_q_heads, " but the dump has ", data.dump->num_q_heads));
  }
  return index::ValidateCalibration(c, data.layout);
}

// The inputs an engine has at step tp (one step before it uses the set)
// for a request whose set it will use at step t: the daemon's blocks are
// the complete ones at tp; the budget leaves out what the engine keeps
// itself at t (blocks completed since, its partial block).
void AheadRequest(const ReplayData& data, const StepInput& at, int64_t bs, StepInput* req) {
  const int64_t tp = at.t - 1;
  const int64_t complete = (tp + 1) / bs;
  ComputeAnchors(data, tp, req);
  req->t = tp;
  req->step = at.step;
  req->num_blocks = complete;
  req->num_complete = complete;
  req->has_partial = false;
  req->budget = at.budget - (at.num_complete - complete) - (at.has_partial ? 1 : 0);
  req->accumulated = at.accumulated;
  req->snapkv = at.snapkv;
  req->cache = nullptr;  // scores of step t - 1, not t
  req->attention = nullptr;
}

int DistanceBucket(int64_t b, int64_t own) {
  if (b == 0) return 0;
  const int64_t d = own - b;
  if (d <= 3) return static_cast<int>(d) + 1;
  if (d <= 7) return 5;
  if (d <= 15) return 6;
  return 7;
}

}  // namespace

const char* DistanceBucketName(int bucket) {
  static const char* kNames[kDistanceBuckets] = {"sink (block 0)", "own block", "1 back",
                                                 "2 back",         "3 back",    "4-7 back",
                                                 "8-15 back",      "16+ back"};
  return bucket >= 0 && bucket < kDistanceBuckets ? kNames[bucket] : "?";
}

std::string RunSpec::Key() const {
  return absl::StrCat(method, "|", variant, "|", budget, ahead ? "|ahead" : "");
}

std::vector<RunSpec> StandardRuns(const std::vector<std::string>& methods,
                                  const std::vector<double>& budgets, const MethodOptions& options,
                                  bool stab_variant, const std::vector<bool>& timings) {
  std::vector<RunSpec> runs;
  for (bool ahead : timings) {
    for (const std::string& m : methods) {
      for (double f : budgets) {
        RunSpec r{m, "raw", f, options, ahead};
        r.options.stability = StabilityMode::kOff;
        runs.push_back(r);
        if (stab_variant && m != "oracle" && m != "oracle_head" && m != "default") {
          r.variant = "stab";
          r.options.stability = StabilityMode::kIndex;
          runs.push_back(r);
          if (!IsDaemonMethod(m)) {
            r.variant = "stabrank";
            r.options.stability = StabilityMode::kRank;
            runs.push_back(r);
          }
        }
      }
    }
  }
  return runs;
}

absl::StatusOr<ReplayResult> RunReplay(const KvDump& dump, const ReplayConfig& config) {
  const Clock::time_point start = Clock::now();
  if (config.step_stride < 1 || config.max_steps < 0 || config.claims_stride < 1) {
    return absl::InvalidArgumentError("step_stride and claims_stride must be >= 1, max_steps >= 0");
  }
  absl::StatusOr<ReplayData> data_or = BuildReplayData(dump, config.replay);
  if (!data_or.ok()) return data_or.status();
  auto model = dump.metadata.find("model");
  if (model != dump.metadata.end()) {
    auto c = config.calibrations.find(model->second);
    if (c != config.calibrations.end()) {
      if (absl::Status s = CheckCalibration(c->second, *data_or); !s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(dump.name, ": calibration of model ", model->second, ": ", s.message()));
      }
      data_or->calibration = c->second;
    }
  }
  const ReplayData& data = *data_or;
  const int32_t bs = config.replay.block_size;

  ReplayResult out;
  out.group = dump.kind;
  out.num_heads = dump.num_layers * dump.num_q_heads;
  out.group_size = dump.group_size();
  out.block_bytes = data.block_bytes;
  out.dumps = 1;
  if (config.claims) {
    out.claims = std::make_unique<ClaimsAccumulator>(dump.num_layers, config.claim_fractions);
  }
  std::vector<RunState> states;
  for (const RunSpec& spec : config.runs) {
    if (!(spec.budget > 0 && spec.budget <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("run ", spec.Key(), ": budget must be in (0, 1]"));
    }
    if (spec.options.local_blocks < 0 || spec.options.sink_blocks < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("run ", spec.Key(), ": sink_blocks and local_blocks must be >= 0"));
    }
    const std::string key = spec.Key();
    if (out.runs.count(key) > 0) {
      return absl::InvalidArgumentError(absl::StrCat("run ", key, " is listed twice"));
    }
    auto result = std::make_unique<RunResult>(
        RunResult{spec, MetricAccumulator(out.num_heads, out.group_size)});
    RunState st;
    st.spec = &result->spec;
    st.result = result.get();
    st.sink_blocks = spec.options.sink_blocks;
    st.local_blocks = spec.options.local_blocks;
    if (UsesMassScorer(spec.method)) {
      const index::SelectionCalibration& c =
          spec.options.calibration ? *spec.options.calibration : data.calibration;
      if (c.sink_blocks >= 0) st.sink_blocks = c.sink_blocks;
      if (c.local_blocks >= 0) st.local_blocks = c.local_blocks;
    }
    if (spec.method != "oracle_head") {
      MethodOptions local = spec.options;
      local.endpoint.clear();
      absl::StatusOr<std::unique_ptr<Method>> m = MakeMethod(spec.method, data, local);
      if (!m.ok()) return m.status();
      st.method = std::move(*m);
      if (!spec.options.endpoint.empty() && IsDaemonMethod(spec.method)) {
        absl::StatusOr<std::unique_ptr<Method>> twin = MakeMethod(spec.method, data, spec.options);
        if (!twin.ok()) return twin.status();
        st.twin = std::move(*twin);
      }
    }
    out.runs.emplace(key, std::move(result));
    states.push_back(std::move(st));
  }

  bool ahead_runs = false;
  for (const RunSpec& spec : config.runs) ahead_runs |= spec.ahead;
  const int64_t T = dump.seq_len;
  const int64_t P = data.prompt_tokens;
  const int64_t prompt_blocks = P / bs;
  std::vector<double> accumulated((T + bs - 1) / bs, 0.0);
  std::vector<double> snapkv(data.num_complete, 0.0);
  std::vector<double> total, head_mass;
  std::vector<int64_t> blocks, twin_blocks;
  std::vector<std::vector<int64_t>> per_head(out.num_heads);
  StepAttention att, prev_att;
  StepInput in, req;
  ScoreCache cache;
  std::vector<int64_t> used;
  int64_t evaluated = 0;
  for (int64_t t = 0; t < T; ++t) {
    const bool step = t >= P && (t - P) % config.step_stride == 0;
    if (t >= P && config.max_steps > 0 && evaluated >= config.max_steps) break;
    const bool claims_step = step && out.claims != nullptr && evaluated % config.claims_stride == 0;
    AttentionOptions ao;
    ao.outputs = step;
    ao.probs = claims_step;
    ComputeStepAttention(dump, t, bs, ao, &att);
    TotalMass(att, &total);
    if (step) {
      in.t = t;
      // The decode step (kvtierd reads step 0 as "the next step"): with a
      // stride, Selects are step_stride steps apart, as the keys move.
      in.step = t - P + 1;
      in.num_blocks = att.num_blocks;
      in.num_complete = (t + 1) / bs;
      in.has_partial = in.num_blocks > in.num_complete;
      ComputeAnchors(data, t, &in);
      in.attention = &att;
      in.accumulated = &accumulated;
      in.snapkv = &snapkv;
      in.cache = &cache;
      for (RunState& st : states) {
        const RunSpec& spec = *st.spec;
        in.forced = ForcedBlocks::Make(in.num_blocks, st.sink_blocks,
                                       st.local_blocks + (in.has_partial ? 1 : 0));
        in.budget = StepBudget(spec.budget, in.num_blocks, in.forced.count());
        const std::vector<int64_t> oracle = TopBlocks(total, in.forced, in.budget);
        if (st.method == nullptr) {  // oracle_head
          for (int32_t lh = 0; lh < out.num_heads; ++lh) {
            const float* m = att.Mass(lh);
            head_mass.assign(m, m + att.num_blocks);
            per_head[lh] = TopBlocks(head_mass, in.forced, in.budget);
          }
          st.result->metrics.AddPerHeadStep(att, in.forced, per_head, oracle);
          continue;
        }
        const StepInput* ask = &in;
        if (spec.ahead) {
          AheadRequest(data, in, bs, &req);
          req.forced = ForcedBlocks::Make(req.num_blocks, st.sink_blocks, st.local_blocks);
          req.attention = &prev_att;  // the oracle of step t - 1
          ask = &req;
        }
        ask->charged_us = 0;
        const Clock::time_point t0 = Clock::now();
        if (absl::Status s = st.method->Select(*ask, &blocks); !s.ok()) {
          return absl::Status(s.code(),
                              absl::StrCat(dump.name, ": ", spec.Key(), ": ", s.message()));
        }
        const double us =
            std::chrono::duration<double, std::micro>(Clock::now() - t0).count() + ask->charged_us;
        if (absl::Status s = CheckSelection(spec, *ask, blocks); !s.ok()) {
          return s;
        }
        if (st.twin != nullptr) {
          if (absl::Status s = st.twin->Select(*ask, &twin_blocks); !s.ok()) {
            return s;
          }
          ++st.result->e2e_steps;
          if (twin_blocks != blocks) ++st.result->e2e_mismatches;
        }
        if (spec.ahead) {
          // The engine adds what it holds itself at t.
          for (int64_t b = req.num_complete; b < in.num_blocks; ++b) {
            blocks.push_back(b);
          }
          if (absl::Status s = CheckSelection(spec, in, blocks); !s.ok()) {
            return s;
          }
        }
        const int64_t churn = st.has_prev ? NewBlocks(st.prev, blocks, st.prev_num_blocks) : 0;
        st.result->metrics.AddStep(att, in.forced, blocks, oracle, churn, us);
        st.prev = blocks;
        st.prev_num_blocks = in.num_blocks;
        st.has_prev = true;
      }
      if (claims_step) out.claims->AddStep(data, att, in);
      for (int64_t b = 0; b < att.num_blocks; ++b) {
        out.distance_mass[DistanceBucket(b, att.num_blocks - 1)] += total[b] / out.num_heads;
      }
      ++evaluated;
    }
    for (int64_t b = 0; b < att.num_blocks; ++b) accumulated[b] += total[b];
    if (ahead_runs) std::swap(att, prev_att);  // att is recomputed next step
    if (t < P && t >= P - config.replay.snapkv_window) {
      for (int64_t b = 0; b < std::min<int64_t>(prompt_blocks, att.num_blocks); ++b) {
        snapkv[b] += total[b];
      }
    }
  }
  out.steps = evaluated;
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return out;
}

absl::Status MergeReplay(const ReplayResult& from, ReplayResult* into) {
  if (into->dumps == 0) {
    into->num_heads = from.num_heads;
    into->group_size = from.group_size;
    into->block_bytes = from.block_bytes;
    for (const auto& [key, r] : from.runs) {
      into->runs.emplace(key, std::make_unique<RunResult>(*r));
    }
    if (from.claims != nullptr) {
      into->claims = std::make_unique<ClaimsAccumulator>(*from.claims);
    }
    into->distance_mass = from.distance_mass;
    into->steps = from.steps;
    into->dumps = from.dumps;
    into->seconds = from.seconds;
    return absl::OkStatus();
  }
  if (from.num_heads != into->num_heads || from.block_bytes != into->block_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot merge a replay of ", from.num_heads, " heads and ", from.block_bytes,
                     "-byte blocks into one of ", into->num_heads, " heads and ", into->block_bytes,
                     "-byte blocks"));
  }
  for (const auto& [key, r] : from.runs) {
    auto it = into->runs.find(key);
    if (it == into->runs.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("run ", key, " is missing from the merged result"));
    }
    if (absl::Status s = it->second->metrics.Merge(r->metrics); !s.ok()) {
      return s;
    }
    it->second->e2e_steps += r->e2e_steps;
    it->second->e2e_mismatches += r->e2e_mismatches;
  }
  if (from.claims != nullptr && into->claims != nullptr) {
    if (absl::Status s = into->claims->Merge(*from.claims); !s.ok()) return s;
  }
  for (int i = 0; i < kDistanceBuckets; ++i) {
    into->distance_mass[i] += from.distance_mass[i];
  }
  into->steps += from.steps;
  into->dumps += from.dumps;
  into->seconds += from.seconds;
  return absl::OkStatus();
}

}  // namespace kvtier::quality
