#include "bench/quality/calibrate.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/quality/attention.h"
#include "bench/quality/json.h"
#include "bench/quality/replay.h"

namespace kvtier::quality {
namespace {

// Per-head priors and head weights from the dump's attention.
struct HeadPriors {
  int32_t heads = 0;
  std::vector<std::vector<double>> prior;  // [head][distance]
  std::vector<double> weight;              // [head]
  double sink_share = 0;                   // of the heads' attention on stored blocks, on the sinks
  std::vector<double> sink;                // [head]: mean mass on the sink blocks per step
};

HeadPriors MeasurePriors(const KvDump& dump, const ReplayData& data, const CalibrateOptions& o) {
  const int32_t bs = o.replay.block_size;
  const int32_t H = dump.num_layers * dump.num_q_heads;
  const int64_t P = data.prompt_tokens;
  const int64_t max_blocks = dump.seq_len / bs + 1;
  std::vector<std::vector<double>> sum(H, std::vector<double>(max_blocks, 0));
  std::vector<int64_t> count(max_blocks, 0);
  std::vector<double> stored(H, 0);
  std::vector<double> on_sink(H, 0);
  double on_sinks = 0;
  int64_t steps = 0;
  StepAttention att;
  AttentionOptions ao;
  ao.outputs = false;
  for (int64_t t = P; t < dump.seq_len; ++t) {
    ComputeStepAttention(dump, t, bs, ao, &att);
    const int64_t sel = o.ahead ? t - 1 : t;
    const int64_t n = (sel + 1) / bs;  // blocks the daemon holds
    for (int64_t b = o.sink_blocks; b < n; ++b) ++count[n - 1 - b];
    for (int32_t h = 0; h < H; ++h) {
      const float* m = att.Mass(h);
      for (int64_t b = 0; b < n; ++b) {
        stored[h] += m[b];
        if (b >= o.sink_blocks) {
          sum[h][n - 1 - b] += m[b];
        } else {
          on_sinks += m[b];
          on_sink[h] += m[b];
        }
      }
    }
    ++steps;
  }
  // Distances seen in at least 1/8 of the steps keep their own entry; the
  // rest pool into the last one.
  const int64_t min_count = std::max<int64_t>(8, steps / 8);
  int64_t K = 1;
  while (K < max_blocks && count[K] >= min_count) ++K;
  K = std::min<int64_t>(K, index::kMaxPriorBlocks);
  HeadPriors out;
  out.heads = H;
  double all_stored = 0;
  for (double x : stored) all_stored += x;
  out.sink_share = all_stored > 0 ? on_sinks / all_stored : 0;
  out.sink.resize(H);
  for (int32_t h = 0; h < H; ++h) out.sink[h] = steps > 0 ? on_sink[h] / steps : 0;
  out.prior.assign(H, std::vector<double>(K, 0));
  out.weight.assign(H, 0);
  for (int32_t h = 0; h < H; ++h) {
    for (int64_t d = 0; d + 1 < K; ++d) {
      out.prior[h][d] = count[d] > 0 ? sum[h][d] / count[d] : 0;
    }
    double tail = 0;
    int64_t tail_count = 0;
    for (int64_t d = K - 1; d < max_blocks; ++d) {
      tail += sum[h][d];
      tail_count += count[d];
    }
    out.prior[h][K - 1] = tail_count > 0 ? tail / tail_count : 0;
    out.weight[h] = steps > 0 ? stored[h] / steps : 1;
  }
  return out;
}

// Non-increasing least-squares fit (pool adjacent violators): the prior of
// the heads that are not retrieval heads falls with distance; bumps far
// back in one calibration text are what the retrieval heads are for, and
// they would not repeat at the same distances in another text.
void MakeNonIncreasing(std::vector<double>* v) {
  std::vector<std::pair<double, int64_t>> pools;  // mean, count
  for (double x : *v) {
    pools.push_back({x, 1});
    while (pools.size() > 1 && pools[pools.size() - 2].first < pools.back().first) {
      const auto [m1, n1] = pools.back();
      pools.pop_back();
      auto& [m0, n0] = pools.back();
      m0 = (m0 * n0 + m1 * n1) / (n0 + n1);
      n0 += n1;
    }
  }
  v->clear();
  for (const auto& [m, n] : pools) v->insert(v->end(), n, m);
}

index::SelectionCalibration Build(const KvDump& dump, const HeadPriors& p,
                                  const std::vector<int32_t>& heads, float head_min_mass) {
  index::SelectionCalibration c;
  c.head_min_mass = head_min_mass;
  c.num_q_heads = dump.num_q_heads;
  const size_t K = p.prior.empty() ? 1 : p.prior[0].size();
  std::vector<double> prior(K, 0), all(K, 0);
  for (int32_t h = 0; h < p.heads; ++h) {
    const bool retrieval = std::find(heads.begin(), heads.end(), h) != heads.end();
    for (size_t d = 0; d < K; ++d) {
      all[d] += p.prior[h][d];
      if (!retrieval) prior[d] += p.prior[h][d];
    }
  }
  MakeNonIncreasing(&prior);
  MakeNonIncreasing(&all);
  c.prior.assign(prior.begin(), prior.end());
  c.prior_all.assign(all.begin(), all.end());
  // The sink's own expected attention, summed as prior and prior_all.
  double sink = 0, sink_all = 0;
  for (int32_t h = 0; h < p.heads; ++h) {
    sink_all += p.sink[h];
    if (std::find(heads.begin(), heads.end(), h) == heads.end()) sink += p.sink[h];
  }
  c.sink_mass = static_cast<float>(sink);
  c.sink_mass_all = static_cast<float>(sink_all);
  for (int32_t h : heads) {
    c.retrieval_heads.push_back({h / dump.num_q_heads, h % dump.num_q_heads});
    c.head_weights.push_back(static_cast<float>(std::clamp(p.weight[h], 1e-3, 1.0)));
  }
  return c;
}

std::string HeadName(const KvDump& dump, int32_t h) {
  return absl::StrCat("L", h / dump.num_q_heads, "H", h % dump.num_q_heads);
}

}  // namespace

absl::StatusOr<CalibrationResult> Calibrate(const KvDump& dump, const CalibrateOptions& o) {
  if (!(o.head_min_mass >= 0 && o.head_min_mass < 1)) {
    return absl::InvalidArgumentError("calibrate: head_min_mass must be in [0, 1)");
  }
  if (!(o.sink_weight >= 0 && o.sink_weight <= 1000)) {
    return absl::InvalidArgumentError("calibrate: sink_weight must be in [0, 1000]");
  }
  if (!(o.budget > 0 && o.budget <= 1) || o.max_heads < 0 ||
      o.max_heads > index::kMaxRetrievalHeads || !(o.min_gain >= 0) || o.sink_blocks < 0 ||
      o.local_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibrate: budget must be in (0, 1], max_heads in [0, ",
                     index::kMaxRetrievalHeads, "], min_gain >= 0, sink/local blocks >= 0"));
  }
  absl::StatusOr<ReplayData> data = BuildReplayData(dump, o.replay);
  if (!data.ok()) return data.status();
  const HeadPriors priors = MeasurePriors(dump, *data, o);

  CalibrationResult result;
  auto model = dump.metadata.find("model");
  result.model = model != dump.metadata.end() ? model->second : dump.kind;
  result.source = dump.name;
  std::vector<int32_t> chosen;
  double best_share = -1;
  for (int32_t round = 0; round <= o.max_heads; ++round) {
    // Round 0 measures the prior alone; later rounds one run per head.
    ReplayConfig rc;
    rc.replay = o.replay;
    rc.claims = false;
    std::vector<int32_t> candidates;
    if (round == 0) {
      candidates.push_back(-1);
    } else {
      for (int32_t h = 0; h < priors.heads; ++h) {
        if (std::find(chosen.begin(), chosen.end(), h) == chosen.end()) {
          candidates.push_back(h);
        }
      }
    }
    if (candidates.empty()) break;
    for (int32_t h : candidates) {
      std::vector<int32_t> heads = chosen;
      if (h >= 0) heads.push_back(h);
      RunSpec spec;
      spec.method = "mass";
      spec.variant = h < 0 ? "raw" : absl::StrCat("raw+", HeadName(dump, h));
      spec.budget = o.budget;
      spec.ahead = o.ahead;
      spec.options.sink_blocks = o.sink_blocks;
      spec.options.local_blocks = o.local_blocks;
      spec.options.stability = StabilityMode::kOff;
      spec.options.calibration = Build(dump, priors, heads, 0.0f);
      rc.runs.push_back(spec);
    }
    absl::StatusOr<ReplayResult> r = RunReplay(dump, rc);
    if (!r.ok()) return r.status();
    double round_best = -1;
    int32_t round_head = -1;
    for (size_t i = 0; i < candidates.size(); ++i) {
      const double share = r->runs.at(rc.runs[i].Key())->metrics.Summarise(data->block_bytes).share;
      if (share > round_best) {
        round_best = share;
        round_head = candidates[i];
      }
    }
    if (round == 0) {
      result.share_prior = round_best;
      best_share = round_best;
      if (o.progress) {
        o.progress(absl::StrFormat("prior alone: share %.4f", round_best));
      }
      continue;
    }
    if (round_best - best_share < o.min_gain) {
      if (o.progress) {
        o.progress(absl::StrFormat("best next head %s adds %.4f < %.4f: stop",
                                   HeadName(dump, round_head), round_best - best_share,
                                   o.min_gain));
      }
      break;
    }
    chosen.push_back(round_head);
    best_share = round_best;
    result.share_after.push_back(round_best);
    if (o.progress) {
      o.progress(absl::StrFormat("+ %s: share %.4f", HeadName(dump, round_head), round_best));
    }
  }
  result.calibration = Build(dump, priors, chosen, o.head_min_mass);
  index::SelectionCalibration& c = result.calibration;
  // A sink holding at least min_sink_share of the attention is kept always
  // (attention mass underrates a sink: removing it moves the attention of
  // every head that parks there, so its mass is no measure of its worth);
  // below that the first block is kept only when its measured attention
  // times sink_weight (sink_mass) earns it a place in the budget, like any
  // block. A model that gives its first block (almost) nothing does not
  // keep it.
  result.sink_share = priors.sink_share;
  if (o.sink_blocks == 1 && priors.sink_share < o.min_sink_share) {
    c.sink_blocks = 0;
    c.sink_mass = static_cast<float>(c.sink_mass * o.sink_weight);
    c.sink_mass_all = static_cast<float>(c.sink_mass_all * o.sink_weight);
  } else {
    c.sink_blocks = o.sink_blocks;
    c.sink_mass = c.sink_mass_all = -1.0f;
  }
  c.local_blocks = o.local_blocks;
  c.retrieval_share = o.retrieval_share;
  if (o.copy_run > 0) {  // off: the fields keep their defaults (and JSON leaves them out)
    c.copy_run = o.copy_run;
    c.copy_hold = o.copy_hold;
    c.copy_min_blocks = o.copy_min_blocks;
    c.copy_lead = o.copy_lead;
    c.copy_min_mass = o.copy_min_mass;
    c.uncopied_weight = o.uncopied_weight;
    c.copy_weight = o.copy_weight;
  }
  if (o.progress) {
    o.progress(absl::StrFormat("sink: %.4f of the attention on stored blocks -> sink_blocks %d%s",
                               priors.sink_share, c.sink_blocks,
                               c.sink_mass >= 0
                                   ? absl::StrFormat(", competing with sink_mass %.4f", c.sink_mass)
                                   : std::string()));
  }
  return result;
}

std::string CalibrationToJson(const CalibrationResult& r) {
  const index::SelectionCalibration& c = r.calibration;
  auto floats = [](const std::vector<float>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      absl::StrAppend(&s, i ? ", " : "", absl::StrFormat("%.9g", v[i]));
    }
    return s + "]";
  };
  std::string heads = "[";
  for (size_t i = 0; i < c.retrieval_heads.size(); ++i) {
    absl::StrAppend(&heads, i ? ", " : "", "{\"layer\": ", c.retrieval_heads[i].layer,
                    ", \"q_head\": ", c.retrieval_heads[i].q_head, "}");
  }
  heads += "]";
  return absl::StrCat(
      "{\n  \"model\": \"", r.model, "\",\n  \"source\": \"", r.source,
      "\",\n  \"num_q_heads\": ", c.num_q_heads, ",\n  \"retrieval_heads\": ", heads,
      ",\n  \"head_weights\": ", floats(c.head_weights),
      ",\n  \"softmax_scale\": ", absl::StrFormat("%.9g", c.softmax_scale),
      ",\n  \"head_min_mass\": ", absl::StrFormat("%.9g", c.head_min_mass),
      c.sink_blocks >= 0 ? absl::StrCat(",\n  \"sink_blocks\": ", c.sink_blocks) : std::string(),
      c.local_blocks >= 0 ? absl::StrCat(",\n  \"local_blocks\": ", c.local_blocks) : std::string(),
      c.sink_mass >= 0 ? absl::StrFormat(",\n  \"sink_mass\": %.9g,\n  \"sink_mass_all\": %.9g",
                                         c.sink_mass, c.sink_mass_all)
                       : std::string(),
      ",\n  \"retrieval_share\": ", absl::StrFormat("%.9g", c.retrieval_share),
      c.copy_run > 0
          ? absl::StrCat(",\n  \"copy_run\": ", c.copy_run, ",\n  \"copy_hold\": ", c.copy_hold,
                         ",\n  \"copy_min_blocks\": ", c.copy_min_blocks,
                         ",\n  \"copy_lead\": ", c.copy_lead,
                         c.copy_min_mass >= 0
                             ? absl::StrFormat(",\n  \"copy_min_mass\": %.9g", c.copy_min_mass)
                             : std::string(),
                         absl::StrFormat(",\n  \"uncopied_weight\": %.9g", c.uncopied_weight),
                         c.copy_weight != 1.0f
                             ? absl::StrFormat(",\n  \"copy_weight\": %.9g", c.copy_weight)
                             : std::string())
          : std::string(),
      ",\n  \"prior\": ", floats(c.prior), ",\n  \"prior_all\": ", floats(c.prior_all), "\n}\n");
}

absl::StatusOr<CalibrationResult> CalibrationFromJson(absl::string_view text) {
  absl::StatusOr<JsonValue> v = ParseJson(text);
  if (!v.ok()) return v.status();
  auto bad = [](absl::string_view field) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration JSON: \"", field, "\" is missing or malformed"));
  };
  if (v->type != JsonValue::Type::kObject) return bad("(top level object)");
  CalibrationResult r;
  auto str = [&](const char* key, std::string* out) {
    const JsonValue* f = v->Find(key);
    if (f == nullptr || f->type != JsonValue::Type::kString) return false;
    *out = f->string;
    return true;
  };
  auto num_list = [&](const char* key, std::vector<float>* out) {
    const JsonValue* f = v->Find(key);
    if (f == nullptr || f->type != JsonValue::Type::kArray) return false;
    for (const JsonValue& x : f->array) {
      if (x.type != JsonValue::Type::kNumber) return false;
      out->push_back(static_cast<float>(x.number));
    }
    return true;
  };
  if (!str("model", &r.model)) return bad("model");
  str("source", &r.source);
  index::SelectionCalibration& c = r.calibration;
  const JsonValue* q = v->Find("num_q_heads");
  if (q == nullptr || !q->is_integer || q->integer < 0 || q->integer > 4096) {
    return bad("num_q_heads");
  }
  c.num_q_heads = static_cast<int32_t>(q->integer);
  const JsonValue* heads = v->Find("retrieval_heads");
  if (heads == nullptr || heads->type != JsonValue::Type::kArray) {
    return bad("retrieval_heads");
  }
  for (const JsonValue& h : heads->array) {
    const JsonValue* l = h.Find("layer");
    const JsonValue* qh = h.Find("q_head");
    if (l == nullptr || qh == nullptr || !l->is_integer || !qh->is_integer || l->integer < 0 ||
        qh->integer < 0 || l->integer > 65535 || qh->integer > 65535) {
      return bad("retrieval_heads");
    }
    c.retrieval_heads.push_back(
        {static_cast<int32_t>(l->integer), static_cast<int32_t>(qh->integer)});
  }
  if (!num_list("prior", &c.prior)) return bad("prior");
  if (!num_list("prior_all", &c.prior_all)) return bad("prior_all");
  if (v->Find("head_weights") != nullptr && !num_list("head_weights", &c.head_weights)) {
    return bad("head_weights");
  }
  if (const JsonValue* s = v->Find("softmax_scale"); s != nullptr) {
    if (s->type != JsonValue::Type::kNumber) return bad("softmax_scale");
    c.softmax_scale = static_cast<float>(s->number);
  }
  if (const JsonValue* s = v->Find("head_min_mass"); s != nullptr) {
    if (s->type != JsonValue::Type::kNumber) return bad("head_min_mass");
    c.head_min_mass = static_cast<float>(s->number);
  }
  for (auto [key, out] :
       {std::pair{"sink_blocks", &c.sink_blocks}, std::pair{"local_blocks", &c.local_blocks},
        std::pair{"copy_run", &c.copy_run}, std::pair{"copy_min_blocks", &c.copy_min_blocks},
        std::pair{"copy_lead", &c.copy_lead}}) {
    if (const JsonValue* s = v->Find(key); s != nullptr) {
      if (!s->is_integer || s->integer < 0 || s->integer > index::kMaxForcedBlocks) return bad(key);
      *out = static_cast<int32_t>(s->integer);
    }
  }
  for (auto [key, out] :
       {std::pair{"retrieval_share", &c.retrieval_share}, std::pair{"sink_mass", &c.sink_mass},
        std::pair{"sink_mass_all", &c.sink_mass_all}, std::pair{"copy_min_mass", &c.copy_min_mass},
        std::pair{"uncopied_weight", &c.uncopied_weight},
        std::pair{"copy_weight", &c.copy_weight}}) {
    if (const JsonValue* s = v->Find(key); s != nullptr) {
      if (s->type != JsonValue::Type::kNumber) return bad(key);
      *out = static_cast<float>(s->number);
    }
  }
  if (const JsonValue* s = v->Find("copy_hold"); s != nullptr) {
    if (!s->is_integer || s->integer < 0 || s->integer > (1 << 20)) return bad("copy_hold");
    c.copy_hold = static_cast<int32_t>(s->integer);
  }
  return r;
}

absl::StatusOr<std::map<std::string, index::SelectionCalibration>> LoadCalibrations(
    const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("calibration folder ", dir, " does not exist"));
  }
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".json") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  std::map<std::string, index::SelectionCalibration> out;
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    absl::StatusOr<CalibrationResult> r = CalibrationFromJson(text.str());
    if (!r.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(f, ": ", r.status().message()));
    }
    if (!out.emplace(r->model, r->calibration).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(f, ": a second calibration of model ", r->model));
    }
  }
  return out;
}

}  // namespace kvtier::quality
