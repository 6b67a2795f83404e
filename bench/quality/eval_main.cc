// kvtier-eval: replays saved Q/K/V (safetensors dumps) step by step and
// measures every block scorer against exact attention, the oracle and the
// published baselines. See docs/QUALITY.md for the method and the results.
//
//   kvtier-eval --data /work/shared/data/realkv --out bench/out/quality
//   kvtier-eval --synthetic 2 --max-steps 64        (quick run, no data)
//   kvtier-eval --compaction --out bench/out/compaction   (SelKV compaction)
//
// Writes results.csv, claims.csv and quality.md into --out; plot.py draws
// the PNGs (bench/quality/run.sh does both). --compaction writes
// compaction.csv and compaction.md instead (plot_compaction.py draws them).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/quality/calibrate.h"
#include "bench/quality/compaction_eval.h"
#include "bench/quality/kv_dump.h"
#include "bench/quality/methods.h"
#include "bench/quality/replay.h"
#include "bench/quality/report.h"
#include "storage/common/status_macros.h"
#ifdef KVTIER_QUALITY_E2E
#include "bench/quality/daemon_backend.h"
#endif

namespace kvtier::quality {
namespace {

struct Flags {
  std::vector<std::string> data = {"/work/shared/data/realkv"};
  int32_t synthetic = 0;
  std::string write_synthetic;
  std::string out = "bench/out/quality";
  ReplayOptions replay;
  int32_t sink_blocks = 1;
  int32_t local_blocks = 1;
  std::string budgets = "1/16,1/8,1/4";
  std::string detail_budget = "1/8";
  std::string methods = "default";
  std::string extra_methods;
  bool no_stab_variant = false;
  // The "stab" variant runs the daemon's shipped filter (deploy/kvtierd.toml
  // select.window_steps, theta, stability_weight, hold_threshold).
  int32_t window = 64;
  float theta = 0.8f;
  float weight = 0.5f;
  float hold = 0.5f;
  std::string sweep_methods = "keykey,keykey_flat,keykey_layer_centered+recency:0.5";
  std::string sweep_windows = "1,4,8,16,20,32,64";
  std::string sweep_weights = "0.1,0.3,0.5";
  std::string sweep_thetas = "0.5,0.7,0.8,0.9";
  std::string forced_methods = "streamingllm,keykey,keykey_layer_centered+recency:0.5";
  std::string forced_settings = "1:0,1:1,1:2,1:4,0:0,2:0";
  int64_t step_stride = 1;
  int64_t max_steps = 0;
  int64_t max_tokens = 0;
  bool no_claims = false;
  int64_t claims_stride = 8;
  int32_t pages_per_chunk = 16;
  int32_t chunks_per_grid = 16;
  double page_keep_fraction = 0.1;
  double chunk_keep_fraction = 0.2;
  double grid_keep_fraction = 0.5;
  std::string tuned_methods = "keykey,keykey_weighted";
  int32_t jobs = 2;
  std::string endpoint;
  std::string timing = "both";  // at | ahead | both
  std::string calibrations = KVTIER_CALIBRATION_DIR;
  std::vector<std::string> calibrate;  // dumps to calibrate from
  std::string calibration_out = "bench/out/calibration";
  std::string calibrate_budget = "1/8";
  int32_t calibrate_max_heads = 8;
  double calibrate_min_gain = 0.005;
  float calibrate_head_min_mass = 0.0f;
  float calibrate_retrieval_share = 1.0f;
  int32_t calibrate_copy_run = 0;
  int32_t calibrate_copy_hold = 64;
  int32_t calibrate_copy_min_blocks = 4;
  int32_t calibrate_copy_lead = 0;
  float calibrate_copy_min_mass = -1.0f;
  float calibrate_copy_weight = 1.0f;
  float calibrate_uncopied_weight = 0.0f;
  double calibrate_min_sink_share = 0.01;
  double calibrate_sink_weight = 2.0;
  bool compaction = false;
  int64_t compaction_prefix = 768;
  int32_t compaction_window = 32;
  std::string compaction_rhos = "0.25,0.5";
};

const char* kDefaultMixes[] = {
    "keykey_flat+recency:0.5",          "keykey_flat_centered+recency:0.5",
    "keykey_layer+recency:0.5",         "keykey_layer_centered+recency:0.5",
    "keykey_head_centered+recency:0.5",
};

// Settings of the daemon's Selector found best for the key-key scorers on
// the realkv dumps (docs/QUALITY.md): small chunks with tight masks (the
// chunk mean smooths noisy page scores) and the stability filter with a
// selective threshold.
MethodOptions TunedOptions(MethodOptions o) {
  o.pages_per_chunk = 4;
  o.chunks_per_grid = 4;
  o.page_keep_fraction = 1.0;
  o.chunk_keep_fraction = 0.2;
  o.grid_keep_fraction = 0.5;
  o.stability = StabilityMode::kIndex;
  o.stability_options.window_steps = 64;
  o.stability_options.theta = 0.8f;
  o.stability_options.weight = 0.5f;
  return o;
}

absl::StatusOr<double> ParseFraction(absl::string_view s) {
  std::vector<std::string> parts = absl::StrSplit(s, '/');
  double num = 0, den = 1;
  if (parts.empty() || parts.size() > 2 || !absl::SimpleAtod(parts[0], &num) ||
      (parts.size() == 2 && !absl::SimpleAtod(parts[1], &den)) || den == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", s, "\" is not a fraction such as 1/8 or 0.125"));
  }
  return num / den;
}

template <typename T>
absl::StatusOr<std::vector<T>> ParseList(const std::string& s, const char* flag) {
  std::vector<T> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    if constexpr (std::is_same_v<T, double>) {
      absl::StatusOr<double> f = ParseFraction(p);
      if (!f.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(flag, ": ", f.status().message()));
      }
      out.push_back(*f);
    } else if constexpr (std::is_same_v<T, float>) {
      float v;
      if (!absl::SimpleAtof(p, &v)) {
        return absl::InvalidArgumentError(absl::StrCat(flag, ": \"", p, "\" is not a number"));
      }
      out.push_back(v);
    } else if constexpr (std::is_same_v<T, int32_t>) {
      int32_t v;
      if (!absl::SimpleAtoi(p, &v)) {
        return absl::InvalidArgumentError(absl::StrCat(flag, ": \"", p, "\" is not an integer"));
      }
      out.push_back(v);
    } else {
      out.push_back(std::string(p));
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> DumpPaths(const std::vector<std::string>& data) {
  std::vector<std::string> out;
  for (const std::string& p : data) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) {
      std::vector<std::string> files;
      for (const auto& e : std::filesystem::directory_iterator(p, ec)) {
        if (e.path().extension() == ".safetensors") {
          files.push_back(e.path().string());
        }
      }
      std::sort(files.begin(), files.end());
      if (files.empty()) {
        return absl::NotFoundError(absl::StrCat("--data ", p, ": no *.safetensors files"));
      }
      out.insert(out.end(), files.begin(), files.end());
    } else if (std::filesystem::exists(p, ec)) {
      out.push_back(p);
    } else {
      return absl::NotFoundError(absl::StrCat("--data ", p, ": not found"));
    }
  }
  return out;
}

// --calibrate: one calibration per dump, written as <model>.json.
absl::Status RunCalibrate(const Flags& f) {
  CalibrateOptions co;
  co.replay = f.replay;
  KVTIER_ASSIGN_OR_RETURN(co.budget, ParseFraction(f.calibrate_budget));
  co.ahead = f.timing != "at";
  co.sink_blocks = f.sink_blocks;
  co.local_blocks = f.local_blocks;
  co.max_heads = f.calibrate_max_heads;
  co.min_gain = f.calibrate_min_gain;
  co.head_min_mass = f.calibrate_head_min_mass;
  co.retrieval_share = f.calibrate_retrieval_share;
  co.copy_run = f.calibrate_copy_run;
  co.copy_hold = f.calibrate_copy_hold;
  co.copy_min_blocks = f.calibrate_copy_min_blocks;
  co.copy_lead = f.calibrate_copy_lead;
  co.copy_min_mass = f.calibrate_copy_min_mass;
  co.copy_weight = f.calibrate_copy_weight;
  co.uncopied_weight = f.calibrate_uncopied_weight;
  co.min_sink_share = f.calibrate_min_sink_share;
  co.sink_weight = f.calibrate_sink_weight;
  co.progress = [](const std::string& line) {
    std::printf("  %s\n", line.c_str());
    std::fflush(stdout);
  };
  std::filesystem::create_directories(f.calibration_out);
  for (const std::string& path : f.calibrate) {
    KVTIER_ASSIGN_OR_RETURN(KvDump d, LoadKvDump(path));
    std::printf("calibrating on %s (budget %s, %s)\n", d.name.c_str(), f.calibrate_budget.c_str(),
                co.ahead ? "one step ahead" : "at step t");
    KVTIER_ASSIGN_OR_RETURN(CalibrationResult r, Calibrate(d, co));
    const std::string out = absl::StrCat(f.calibration_out, "/", r.model, ".json");
    if (absl::Status s = WriteFile(out, CalibrationToJson(r)); !s.ok()) return s;
    std::printf("wrote %s: %zu retrieval heads, prior of %zu blocks\n", out.c_str(),
                r.calibration.retrieval_heads.size(), r.calibration.prior.size());
  }
  return absl::OkStatus();
}

// --compaction: SelKV compaction against plain eviction on every dump
// (compaction_eval.h), dumps evaluated in parallel.
absl::Status RunCompaction(const Flags& f, const std::string& command) {
  CompactionEvalOptions o;
  o.prefix_tokens = f.compaction_prefix;
  o.window = f.compaction_window;
  KVTIER_ASSIGN_OR_RETURN(o.rhos, ParseList<double>(f.compaction_rhos, "--compaction-rhos"));
  for (double rho : o.rhos) {
    if (!(rho > 0 && rho <= 1)) {
      return absl::InvalidArgumentError("--compaction-rhos: every rho must be in (0, 1]");
    }
  }
  std::vector<KvDump> synthetic;
  std::vector<std::string> paths;
  if (f.synthetic > 0) {
    for (int32_t i = 0; i < f.synthetic; ++i) {
      SyntheticDumpOptions so;
      so.recall = i % 2 == 1;
      so.seed = static_cast<uint64_t>(i) + 1;
      KVTIER_ASSIGN_OR_RETURN(KvDump d, MakeSyntheticDump(so));
      synthetic.push_back(std::move(d));
    }
  } else {
    KVTIER_ASSIGN_OR_RETURN(paths, DumpPaths(f.data));
  }
  const size_t n = f.synthetic > 0 ? synthetic.size() : paths.size();
  std::vector<absl::StatusOr<CompactionDumpResult>> results(n, absl::UnknownError("not run"));
  std::atomic<size_t> next{0};
  std::mutex print_mu;
  auto worker = [&] {
    for (size_t i = next++; i < n; i = next++) {
      absl::StatusOr<KvDump> d =
          f.synthetic > 0 ? absl::StatusOr<KvDump>(synthetic[i]) : LoadKvDump(paths[i]);
      results[i] = d.ok() ? EvaluateCompaction(*d, o) : d.status();
      std::lock_guard<std::mutex> lock(print_mu);
      if (results[i].ok()) {
        std::printf("%-28s %6.1f s\n", results[i]->dump.c_str(), results[i]->seconds);
        std::fflush(stdout);
      }
    }
  };
  std::vector<std::thread> threads;
  for (int32_t j = 1; j < std::clamp<int32_t>(f.jobs, 1, 64); ++j) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
  std::vector<CompactionDumpResult> done;
  for (auto& r : results) {
    if (!r.ok()) return r.status();
    done.push_back(*std::move(r));
  }
  std::filesystem::create_directories(f.out);
  KVTIER_RETURN_IF_ERROR(WriteCompactionReport(f.out, done, o, command));
  std::printf("wrote %s/{compaction.csv,compaction.md}\n", f.out.c_str());
  return absl::OkStatus();
}

absl::Status Run(const Flags& f, const std::string& command) {
  if (!f.calibrate.empty()) return RunCalibrate(f);
  if (f.compaction) return RunCompaction(f, command);
  KVTIER_ASSIGN_OR_RETURN(std::vector<double> budgets, ParseList<double>(f.budgets, "--budgets"));
  KVTIER_ASSIGN_OR_RETURN(double detail, ParseFraction(f.detail_budget));
  std::sort(budgets.begin(), budgets.end());
  if (std::find(budgets.begin(), budgets.end(), detail) == budgets.end()) {
    return absl::InvalidArgumentError("--detail-budget must be one of --budgets");
  }

  MethodOptions mo;
  mo.sink_blocks = f.sink_blocks;
  mo.local_blocks = f.local_blocks;
  mo.stability_options.window_steps = f.window;
  mo.stability_options.theta = f.theta;
  mo.stability_options.weight = f.weight;
  mo.stability_options.hold_threshold = f.hold;
  mo.pages_per_chunk = f.pages_per_chunk;
  mo.chunks_per_grid = f.chunks_per_grid;
  mo.page_keep_fraction = f.page_keep_fraction;
  mo.chunk_keep_fraction = f.chunk_keep_fraction;
  mo.grid_keep_fraction = f.grid_keep_fraction;
  mo.endpoint = f.endpoint;

  std::vector<std::string> methods;
  if (f.methods == "default") {
    methods = MethodNames();
    methods.push_back("oracle_head");
    for (const char* m : kDefaultMixes) methods.push_back(m);
  } else {
    KVTIER_ASSIGN_OR_RETURN(methods, ParseList<std::string>(f.methods, "--methods"));
  }
  KVTIER_ASSIGN_OR_RETURN(std::vector<std::string> extra,
                          ParseList<std::string>(f.extra_methods, "--extra-methods"));
  methods.insert(methods.end(), extra.begin(), extra.end());
  for (const std::string& m : methods) {
    if (m == "oracle_head") continue;
    if (absl::Status s = CheckMethodName(m); !s.ok()) return s;
  }

  std::vector<bool> timings;
  if (f.timing == "ahead" || f.timing == "both") timings.push_back(true);
  if (f.timing == "at" || f.timing == "both") timings.push_back(false);
  if (timings.empty()) {
    return absl::InvalidArgumentError("--timing must be at, ahead or both");
  }
  // Sweeps, tuned and forced runs use the first timing (ahead when run).
  const bool primary_ahead = timings.front();

  ReplayConfig config;
  config.replay = f.replay;
  config.step_stride = f.step_stride;
  config.max_steps = f.max_steps;
  config.claims = !f.no_claims;
  config.claims_stride = f.claims_stride;
  if (!f.calibrations.empty() && f.calibrations != "none") {
    KVTIER_ASSIGN_OR_RETURN(config.calibrations, LoadCalibrations(f.calibrations));
  }
  config.runs = StandardRuns(methods, budgets, mo, !f.no_stab_variant, timings);

  // The daemon's key-key scorers at the settings docs/QUALITY.md
  // recommends for the index as it is.
  KVTIER_ASSIGN_OR_RETURN(std::vector<std::string> tuned,
                          ParseList<std::string>(f.tuned_methods, "--tuned-methods"));
  for (const std::string& m : tuned) {
    if (!IsDaemonMethod(m)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tuned-methods: ", m, " is not a daemon scorer"));
    }
    for (double b : budgets) {
      RunSpec r{m, "tuned", b, TunedOptions(mo), primary_ahead};
      config.runs.push_back(r);
    }
  }

  // Stability sweep at the detail budget.
  KVTIER_ASSIGN_OR_RETURN(std::vector<std::string> sweep_methods,
                          ParseList<std::string>(f.sweep_methods, "--sweep-methods"));
  KVTIER_ASSIGN_OR_RETURN(std::vector<int32_t> windows,
                          ParseList<int32_t>(f.sweep_windows, "--sweep-windows"));
  KVTIER_ASSIGN_OR_RETURN(std::vector<float> weights,
                          ParseList<float>(f.sweep_weights, "--sweep-weights"));
  KVTIER_ASSIGN_OR_RETURN(std::vector<float> thetas,
                          ParseList<float>(f.sweep_thetas, "--sweep-thetas"));
  if (thetas.empty()) thetas.push_back(f.theta);
  for (const std::string& m : sweep_methods) {
    if (absl::Status s = CheckMethodName(m); !s.ok()) return s;
    for (StabilityMode mode : {StabilityMode::kIndex, StabilityMode::kRank}) {
      if (mode == StabilityMode::kRank && IsDaemonMethod(m)) continue;
      // The rank rule has no threshold: one theta.
      const size_t num_thetas = mode == StabilityMode::kRank ? 1 : thetas.size();
      for (size_t ti = 0; ti < num_thetas; ++ti) {
        for (float w : weights) {
          for (int32_t win : windows) {
            RunSpec r{m,
                      mode == StabilityMode::kRank
                          ? absl::StrCat("sweep:rank,W=", win, ",w=", w)
                          : absl::StrCat("sweep:index,W=", win, ",w=", w, ",theta=", thetas[ti]),
                      detail, mo, primary_ahead};
            r.options.stability = mode;
            r.options.stability_options.window_steps = win;
            r.options.stability_options.weight = w;
            r.options.stability_options.theta = thetas[ti];
            config.runs.push_back(r);
          }
        }
      }
    }
  }
  // Sink / local sweep at every budget.
  KVTIER_ASSIGN_OR_RETURN(std::vector<std::string> forced_methods,
                          ParseList<std::string>(f.forced_methods, "--forced-methods"));
  KVTIER_ASSIGN_OR_RETURN(std::vector<std::string> forced_settings,
                          ParseList<std::string>(f.forced_settings, "--forced-settings"));
  for (const std::string& m : forced_methods) {
    if (absl::Status s = CheckMethodName(m); !s.ok()) return s;
    for (const std::string& setting : forced_settings) {
      int32_t sink = 0, local = 0;
      std::vector<std::string> sl = absl::StrSplit(setting, ':');
      if (sl.size() != 2 || !absl::SimpleAtoi(sl[0], &sink) || !absl::SimpleAtoi(sl[1], &local) ||
          sink < 0 || local < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--forced-settings: \"", setting, "\" is not sink:local"));
      }
      for (double b : budgets) {
        RunSpec r{m, absl::StrCat("forced:sink=", sink, ",local=", local), b, mo, primary_ahead};
        r.options.stability = StabilityMode::kOff;
        r.options.sink_blocks = sink;
        r.options.local_blocks = local;
        config.runs.push_back(r);
      }
    }
  }

  // Dumps.
  std::vector<std::string> paths;
  std::vector<KvDump> synthetic;
  if (f.synthetic > 0) {
    for (int32_t i = 0; i < f.synthetic; ++i) {
      SyntheticDumpOptions so;
      so.recall = i % 2 == 1;
      so.seed = static_cast<uint64_t>(i / 2) + 1;
      KVTIER_ASSIGN_OR_RETURN(KvDump d, MakeSyntheticDump(so));
      synthetic.push_back(std::move(d));
    }
    if (!f.write_synthetic.empty()) {
      std::filesystem::create_directories(f.write_synthetic);
      for (const KvDump& d : synthetic) {
        KVTIER_ASSIGN_OR_RETURN(std::string bytes, SerializeKvDump(d));
        const std::string path = absl::StrCat(f.write_synthetic, "/", d.name, ".safetensors");
        if (absl::Status s = WriteFile(path, bytes); !s.ok()) return s;
        std::printf("wrote %s\n", path.c_str());
      }
    }
  } else {
    KVTIER_ASSIGN_OR_RETURN(paths, DumpPaths(f.data));
  }
  const size_t num_dumps = f.synthetic > 0 ? synthetic.size() : paths.size();

  std::vector<absl::StatusOr<ReplayResult>> results;
  for (size_t i = 0; i < num_dumps; ++i) {
    results.emplace_back(absl::UnknownError("not run"));
  }
  std::atomic<size_t> next{0};
  std::mutex print_mu;
  auto worker = [&] {
    for (size_t i = next++; i < num_dumps; i = next++) {
      absl::StatusOr<KvDump> d =
          f.synthetic > 0 ? absl::StatusOr<KvDump>(synthetic[i]) : LoadKvDump(paths[i]);
      if (d.ok() && f.max_tokens > 0 && f.max_tokens < d->seq_len) {
        d = TruncateDump(*d, f.max_tokens);
      }
      if (!d.ok()) {
        results[i] = d.status();
        continue;
      }
      results[i] = RunReplay(*d, config);
      std::lock_guard<std::mutex> lock(print_mu);
      if (results[i].ok()) {
        std::printf("%-28s %4lld steps %6.1f s\n", d->name.c_str(),
                    static_cast<long long>(results[i]->steps), results[i]->seconds);
      }
      std::fflush(stdout);
    }
  };
  std::vector<std::thread> threads;
  const int32_t jobs = std::clamp<int32_t>(f.jobs, 1, 64);
  for (int32_t j = 1; j < jobs; ++j) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();

  std::map<std::string, ReplayResult> groups;
  ReplayResult all;
  all.group = "all";
  for (auto& r : results) {
    if (!r.ok()) return r.status();
    if (absl::Status s = MergeReplay(*r, &groups[r->group]); !s.ok()) return s;
    groups[r->group].group = r->group;
    if (absl::Status s = MergeReplay(*r, &all); !s.ok()) return s;
  }
  std::vector<const ReplayResult*> ordered;
  ordered.reserve(groups.size() + 1);
  for (const auto& [name, g] : groups) ordered.push_back(&g);
  if (groups.size() > 1) ordered.push_back(&all);

  std::filesystem::create_directories(f.out);
  ReportOptions ro;
  ro.budgets = budgets;
  ro.detail_budget = detail;
  ro.command = command;
  ro.notes = absl::StrCat(
      "Block size ", f.replay.block_size,
      " tokens; anchor = mean key of the "
      "last ",
      f.replay.anchor_tokens, " tokens; decode steps over the last ",
      absl::StrFormat("%.0f", 100 * (1 - f.replay.prompt_fraction)), "% of each dump",
      f.step_stride > 1 ? absl::StrCat(" (every ", f.step_stride, "th step)") : std::string(),
      f.max_steps > 0 ? absl::StrCat(", at most ", f.max_steps, " per dump") : std::string(),
      "; sink_blocks ", f.sink_blocks, ", local_blocks ", f.local_blocks,
      " (+ the partial block); budgets count every kept block; stab = "
      "window ",
      f.window, ", theta ", f.theta, ", weight ", f.weight, ", hold ", f.hold,
      "; (tuned) rows: the daemon scorer with pages_per_chunk 4, "
      "chunks_per_grid 4, page_keep_fraction 1.0, chunk_keep_fraction 0.2, "
      "stability W 64, theta 0.8, weight 0.5.\n");
  if (absl::Status s = WriteReport(f.out, ordered, ro); !s.ok()) return s;
  std::printf("wrote %s/{results.csv,claims.csv,quality.md}\n", f.out.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace kvtier::quality

namespace {

int RunMain(int argc, char** argv) {
  kvtier::quality::Flags f;
  CLI::App app{"kvtier-eval: block-selection quality on saved Q/K/V"};
  app.add_option("--data", f.data, "safetensors dumps or folders of them")->capture_default_str();
  app.add_option("--synthetic", f.synthetic, "replay N synthetic dumps instead of --data");
  app.add_option("--write-synthetic", f.write_synthetic, "also write the synthetic dumps here");
  app.add_option("--out", f.out, "output folder")->capture_default_str();
  app.add_option("--block-size", f.replay.block_size)->capture_default_str();
  app.add_option("--anchor-tokens", f.replay.anchor_tokens)->capture_default_str();
  app.add_option("--prompt-fraction", f.replay.prompt_fraction)->capture_default_str();
  app.add_option("--snapkv-window", f.replay.snapkv_window)->capture_default_str();
  app.add_option("--sink-blocks", f.sink_blocks)->capture_default_str();
  app.add_option("--local-blocks", f.local_blocks, "complete local blocks besides the partial one")
      ->capture_default_str();
  app.add_option("--budgets", f.budgets)->capture_default_str();
  app.add_option("--detail-budget", f.detail_budget)->capture_default_str();
  app.add_option("--methods", f.methods, "comma list, or 'default' (every method + mixes)")
      ->capture_default_str();
  app.add_option("--extra-methods", f.extra_methods, "appended to --methods");
  app.add_flag("--no-stab-variant", f.no_stab_variant);
  app.add_option("--stability-window", f.window)->capture_default_str();
  app.add_option("--theta", f.theta)->capture_default_str();
  app.add_option("--stability-weight", f.weight)->capture_default_str();
  app.add_option("--hold-threshold", f.hold)->capture_default_str();
  app.add_option("--sweep-methods", f.sweep_methods)->capture_default_str();
  app.add_option("--sweep-windows", f.sweep_windows)->capture_default_str();
  app.add_option("--sweep-weights", f.sweep_weights)->capture_default_str();
  app.add_option("--sweep-thetas", f.sweep_thetas, "index rule only")->capture_default_str();
  app.add_option("--forced-methods", f.forced_methods)->capture_default_str();
  app.add_option("--forced-settings", f.forced_settings, "sink:local,...")->capture_default_str();
  app.add_option("--step-stride", f.step_stride)->capture_default_str();
  app.add_option("--max-steps", f.max_steps, "per dump; 0 = all")->capture_default_str();
  app.add_option("--max-tokens", f.max_tokens, "cut every dump to its first N tokens; 0 = all");
  app.add_flag("--no-claims", f.no_claims);
  app.add_option("--claims-stride", f.claims_stride)->capture_default_str();
  app.add_option("--pages-per-chunk", f.pages_per_chunk)->capture_default_str();
  app.add_option("--chunks-per-grid", f.chunks_per_grid)->capture_default_str();
  app.add_option("--page-keep-fraction", f.page_keep_fraction)->capture_default_str();
  app.add_option("--chunk-keep-fraction", f.chunk_keep_fraction)->capture_default_str();
  app.add_option("--grid-keep-fraction", f.grid_keep_fraction)->capture_default_str();
  app.add_option("--tuned-methods", f.tuned_methods,
                 "daemon scorers also run at the recommended settings")
      ->capture_default_str();
  app.add_option("--jobs", f.jobs, "dumps replayed in parallel")->capture_default_str();
  app.add_option("--endpoint", f.endpoint,
                 "kvtierd address, or 'inprocess': compare the daemon's "
                 "selections with the in-process ones (end-to-end)");
  app.add_option("--timing", f.timing,
                 "at (chosen and used at step t), ahead (chosen at t - 1, "
                 "used at t) or both")
      ->capture_default_str();
  app.add_option("--calibrations", f.calibrations,
                 "folder of <model>.json selection calibrations ('none': "
                 "replay uncalibrated)")
      ->capture_default_str();
  app.add_option("--calibrate", f.calibrate,
                 "calibrate the mass scorer on these dumps instead of "
                 "replaying; writes <model>.json to --calibration-out");
  app.add_option("--calibration-out", f.calibration_out)->capture_default_str();
  app.add_option("--calibrate-budget", f.calibrate_budget)->capture_default_str();
  app.add_option("--calibrate-max-heads", f.calibrate_max_heads)->capture_default_str();
  app.add_option("--calibrate-min-gain", f.calibrate_min_gain)->capture_default_str();
  app.add_option("--calibrate-head-min-mass", f.calibrate_head_min_mass,
                 "the calibration's head_min_mass (chosen on next-byte loss "
                 "in the decode loop, docs/QUALITY.md)")
      ->capture_default_str();
  app.add_option("--calibrate-retrieval-share", f.calibrate_retrieval_share,
                 "the calibration's retrieval_share: the share of the free budget blocks with a "
                 "retrieval term may take (chosen on next-byte loss, docs/QUALITY.md)")
      ->capture_default_str();
  app.add_option("--calibrate-copy-run", f.calibrate_copy_run,
                 "the calibration's copy_run: Selects in a row a retrieval head's strongest key "
                 "must move forward with the step before the head counts as copying (0 = no "
                 "copy tracking)")
      ->capture_default_str();
  app.add_option("--calibrate-copy-hold", f.calibrate_copy_hold,
                 "the calibration's copy_hold: steps a head stays copying after the last "
                 "Select that confirmed it")
      ->capture_default_str();
  app.add_option("--calibrate-copy-min-blocks", f.calibrate_copy_min_blocks,
                 "the calibration's copy_min_blocks: how far back (blocks) a strongest key must "
                 "be to confirm copying")
      ->capture_default_str();
  app.add_option("--calibrate-copy-lead", f.calibrate_copy_lead,
                 "the calibration's copy_lead: tokens a copying head's attention is moved "
                 "forward (1 for Selects used one step later)")
      ->capture_default_str();
  app.add_option("--calibrate-copy-min-mass", f.calibrate_copy_min_mass,
                 "the calibration's copy_min_mass: the gate of a copying head (-1 = "
                 "head_min_mass)")
      ->capture_default_str();
  app.add_option("--calibrate-uncopied-weight", f.calibrate_uncopied_weight,
                 "the calibration's uncopied_weight: the share of its terms a head that is not "
                 "copying counts")
      ->capture_default_str();
  app.add_option("--calibrate-copy-weight", f.calibrate_copy_weight,
                 "the calibration's copy_weight: how many times its terms a copying head "
                 "counts (above 1 a copy target outranks the prior's recent blocks)")
      ->capture_default_str();
  app.add_option("--calibrate-min-sink-share", f.calibrate_min_sink_share,
                 "keep the sink block always from this share of the attention on stored "
                 "blocks up; below, it competes with its own attention")
      ->capture_default_str();
  app.add_option("--calibrate-sink-weight", f.calibrate_sink_weight,
                 "a sink that competes counts this many times its measured attention (chosen "
                 "on next-byte loss: attention mass underrates a sink)")
      ->check(CLI::Range(0.0, 1000.0))
      ->capture_default_str();
  app.add_flag("--compaction", f.compaction,
               "evaluate SelKV compaction (index/selkv.h) instead of block "
               "selection; writes compaction.csv and compaction.md to --out");
  app.add_option("--compaction-prefix", f.compaction_prefix,
                 "tokens compacted (T0); later positions are the test queries")
      ->capture_default_str();
  app.add_option("--compaction-window", f.compaction_window,
                 "observation queries before T0 (per query head)")
      ->capture_default_str();
  app.add_option("--compaction-rhos", f.compaction_rhos, "retention fractions")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
#ifdef KVTIER_QUALITY_E2E
  kvtier::quality::InstallDaemonBackend();
#endif
  std::string command = "kvtier-eval";
  for (int i = 1; i < argc; ++i) absl::StrAppend(&command, " ", argv[i]);
  absl::Status s = kvtier::quality::Run(f, command);
#ifdef KVTIER_QUALITY_E2E
  kvtier::quality::StopInProcessDaemons();
#endif
  if (!s.ok()) {
    std::fprintf(stderr, "kvtier-eval: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return RunMain(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvtier-eval: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "kvtier-eval: unknown exception\n");
  }
  return 1;
}
