#include "bench/select/long_scenario.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/quality/kv_dump.h"
#include "bench/quality/long_context.h"
#include "bench/quality/long_inputs.h"
#include "index/context_index.h"
#include "index/kernels/int8_dot.h"
#include "index/select/key_scorers.h"
#include "index/select/selector.h"

namespace kvtier::bench {
namespace {

using Clock = std::chrono::steady_clock;
using quality::LongContext;
using quality::LongContextOptions;

constexpr int32_t kT = 16;
// KV bytes per token of a 7B-class profile (28 layers x 2 x 4 KV heads x
// 128 x bf16): what the index's share is measured against.
constexpr double kKvBytesPerToken = 28.0 * 2 * 4 * 128 * 2;

struct Shape {
  std::string name;
  bool pair_heads;
  index::SelectionCalibration calibration;
};

struct Case {
  int64_t tokens;
  int batch;
};

struct Stats {
  double p50_us = 0, p99_us = 0;
};

Stats Summarise(std::vector<double> us) {
  Stats s;
  if (us.empty()) return s;
  std::sort(us.begin(), us.end());
  s.p50_us = us[us.size() / 2];
  s.p99_us = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  return s;
}

struct Row {
  std::string shape, method;
  int64_t tokens = 0;
  int batch = 0;
  Stats latency;
  double visited = 1.0;  // share of retrieval-key pages read
  // Share of the retrieval heads' key bytes touched per step (summaries
  // included): what the memory-bound cost follows.
  double key_bytes = 1.0;
  double mass = 1.0;                      // expected mass vs the flat pass
  double reuse = 0;                       // share of head-steps that reused their kept pages
  int64_t targets = 0, targets_kept = 0;  // retrieval targets the flat pass chose; kept
  double bytes_per_token = 0;
};

index::SelectorOptions Shipped(int64_t min_blocks, int threads,
                               const std::shared_ptr<index::WorkerPool>& pool) {
  index::SelectorOptions o;
  o.sink_blocks = 1;
  o.local_blocks = 1;
  o.page_keep_fraction = 1.0;
  o.stability.window_steps = 64;
  o.stability.theta = 0.8f;
  o.stability.weight = 0.5f;
  o.stability.hold_threshold = 0.5f;
  o.num_threads = threads;
  o.pool = pool;
  o.mass_tree.min_blocks = min_blocks;
  return o;
}

class LongBench {
 public:
  LongBench(const LongScenarioOptions& o, std::vector<quality::KvDump> dumps)
      : o_(o), dumps_(std::move(dumps)) {
    for (const auto& d : dumps_) ptrs_.push_back(&d);
  }

  // One (shape, tokens, batch) case, driven as an engine drives it: the
  // contexts hold the pages before the first step's position; each step
  // appends the pages its position completes, then one SelectBatch of the
  // batch's contexts per method. Each method has its own copy of the
  // contexts (its reuse state and copy tracks are its own).
  void Run(const Shape& shape, const Case& k, std::vector<Row>* rows) {
    const index::SelectionCalibration& c = shape.calibration;
    const int steps = o_.quick ? 32 : 64;
    std::vector<LongContext> lcs;
    // Per method (flat, sparse as shipped, sparse with a full descent
    // every step, sparse reusing at any query drift), the batch's contexts.
    constexpr int kFlat = 0, kSparse = 1, kFull = 2, kAlways = 3, kMethods = 4;
    std::vector<std::unique_ptr<index::ContextIndex>> ctxs[kMethods];
    const auto build0 = Clock::now();
    for (int b = 0; b < k.batch; ++b) {
      LongContextOptions lo;
      lo.tokens = k.tokens;
      lo.pair_heads = shape.pair_heads;
      lo.query_stride = 1;
      lo.query_steps = steps;
      lo.far_position = (k.tokens / 7 + b * (k.tokens / (3 * k.batch))) / 256 * 256;
      absl::StatusOr<LongContext> lc = LongContext::Build(ptrs_, lo);
      if (!lc.ok()) std::abort();
      index::ContextIndexOptions io;
      io.tree.dim = lc->dim();
      io.tree.block_size_tokens = kT;
      io.num_layers = lc->num_layers();
      io.num_kv_heads = lc->num_kv_heads();
      io.block_size_tokens = kT;
      io.calibration = c;
      const int64_t n0 = lc->QueryPosition(0) / kT;
      std::vector<index::BlockSummary> pages;
      for (int64_t p = 0; p < n0; ++p) pages.push_back(lc->PageSummary(p, c));
      for (auto& v : ctxs) {
        auto ctx = index::ContextIndex::Create(io);
        if (!ctx.ok() || !(*ctx)->AddSegment(pages).ok()) std::abort();
        v.push_back(std::move(*ctx));
      }
      lcs.push_back(std::move(*lc));
    }
    std::printf("  built %d context(s) of %lld tokens in %.1f s\n", k.batch,
                static_cast<long long>(k.tokens),
                std::chrono::duration<double>(Clock::now() - build0).count());
    const int32_t D = ctxs[0][0]->tree().dim();
    const int64_t R = static_cast<int64_t>(c.retrieval_heads.size());
    auto pool = std::make_shared<index::WorkerPool>(o_.threads - 1);
    std::unique_ptr<index::Selector> sel[kMethods];
    sel[kFlat] = *index::Selector::Create(Shipped(int64_t{1} << 40, o_.threads, pool));
    const index::SelectorOptions shipped =
        Shipped(index::MassTreeOptions().min_blocks, o_.threads, pool);
    sel[kSparse] = *index::Selector::Create(shipped);
    index::SelectorOptions o = shipped;
    o.mass_tree.reuse_steps = 0;
    sel[kFull] = *index::Selector::Create(o);
    o = shipped;
    o.mass_tree.reuse_min_cosine = -1.0f;
    sel[kAlways] = *index::Selector::Create(o);

    std::vector<double> us[kMethods], tree_us, scan_us;
    double mass[kMethods] = {};
    int64_t opened[kMethods] = {}, screened[kMethods] = {}, chunks[kMethods] = {},
            reused[kMethods] = {}, descended[kMethods] = {};
    int64_t targets = 0, kept[kMethods] = {};  // retrieval targets the flat pass chose
    int64_t page_steps = 0;                    // sum over steps of n x batch
    // Targets after the first step, and those that were (or follow) a
    // target of the step before: what reuse from step to step can keep.
    int64_t later_targets = 0, held_targets = 0;
    std::vector<std::vector<int64_t>> prev_targets(k.batch);
    std::vector<std::vector<float>> q(k.batch);
    anchor_.resize(k.batch);
    std::vector<float> est;
    index::KeyScorerScratch scratch;
    std::vector<index::SelectRequest> reqs(k.batch);
    std::vector<index::SelectResult> res[kMethods];
    for (auto& r : res) r.resize(k.batch);
    std::vector<std::vector<int32_t>> dots(o_.threads);
    for (int s = 0; s < steps; ++s) {
      const int64_t n = lcs[0].QueryPosition(s) / kT;
      for (int b = 0; b < k.batch; ++b) {
        for (int64_t p = ctxs[0][b]->tree().num_pages(); p < n; ++p) {
          const index::BlockSummary page = lcs[b].PageSummary(p, c);
          for (auto& v : ctxs) {
            if (!v[b]->Append(page).ok()) std::abort();
          }
        }
        q[b] = lcs[b].HeadQueries(s, c);
      }
      const int64_t budget = std::max<int64_t>(2, n / 32);
      for (int m = 0; m < kMethods; ++m) {
        for (int b = 0; b < k.batch; ++b) {
          index::SelectRequest& r = reqs[b];
          r = index::SelectRequest();
          r.context = ctxs[m][b].get();
          r.scorer = index::ScorerKind::kMass;
          r.stability = false;
          r.budget_blocks = budget;
          r.step = lcs[b].QueryPosition(s);
          r.head_queries = q[b];
        }
        const auto t0 = Clock::now();
        if (!sel[m]->SelectBatch(reqs, absl::MakeSpan(res[m])).ok()) std::abort();
        us[m].push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        for (const index::SelectResult& r : res[m]) {
          opened[m] += r.mass_pages_opened;
          screened[m] += r.mass_pages_screened;
          chunks[m] += r.mass_chunks_screened;
          reused[m] += r.mass_heads_reused;
          descended[m] += r.mass_heads_descended;
        }
      }
      // Judged by the flat pass's own estimates on this step's keys.
      est.resize(n);
      const int64_t last = static_cast<int64_t>(c.prior.size()) - 1;
      for (int b = 0; b < k.batch; ++b) {
        const index::ContextIndex& ctx = *ctxs[kSparse][b];
        if (!index::MassScores({ctx.keys(), &c, ctx.key_slots(), D, n, q[b]}, &scratch,
                               absl::MakeSpan(est))
                 .ok()) {
          std::abort();
        }
        for (int m = 0; m < kMethods; ++m) {
          for (int64_t p : res[m][b].blocks) mass[m] += est[p];
        }
        const auto& fb = res[kFlat][b].blocks;
        std::vector<int64_t>& prev = prev_targets[b];
        const std::vector<int64_t> before = prev;
        prev.clear();
        for (int64_t p = 1; p + 1 < n; ++p) {
          if (est[p] <= c.prior[std::min<int64_t>(n - 1 - p, last)]) continue;
          if (!std::binary_search(fb.begin(), fb.end(), p)) continue;
          ++targets;
          prev.push_back(p);
          if (s > 0) {
            ++later_targets;
            held_targets += std::binary_search(before.begin(), before.end(), p) ||
                            std::binary_search(before.begin(), before.end(), p - 1);
          }
          for (int m = 0; m < kMethods; ++m) {
            const auto& mb = res[m][b].blocks;
            kept[m] += std::binary_search(mb.begin(), mb.end(), p);
          }
        }
      }
      page_steps += n * k.batch;
      // The pooled key-key tree (its anchor: the last block's mean key).
      for (int b = 0; b < k.batch; ++b) {
        index::SelectRequest& r = reqs[b];
        r = index::SelectRequest();
        r.context = ctxs[kSparse][b].get();
        r.scorer = index::ScorerKind::kKeyKey;
        r.budget_blocks = budget;
        r.step = lcs[b].QueryPosition(s);
        anchor_[b] = lcs[b].PageSummary(n - 1, c).mean;
        r.anchor = anchor_[b];
      }
      auto t0 = Clock::now();
      if (!sel[kSparse]->SelectBatch(reqs, absl::MakeSpan(res[kFlat])).ok()) std::abort();
      tree_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      // The exact scan: every retrieval key of every context, int8 x int8
      // (the flat pass's bytes without its exps), on the same threads.
      t0 = Clock::now();
      pool->ParallelFor(k.batch, o_.threads, [&](int32_t slot, int64_t b) {
        const index::KeyTable& t = *ctxs[kSparse][b]->keys();
        dots[slot].resize(n * kT);
        std::vector<int8_t> qb(D);
        for (int32_t j = 0; j < t.num_key_heads(); ++j) {
          index::QuantizeInt8(&q[b][0], D, qb.data());
          index::DotRowsS8(t.HeadKeys(0, j), n * kT, D, D, qb.data(), dots[slot].data());
        }
      });
      scan_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    std::printf(
        "  the flat pass's retrieval targets after the first step: %lld, of which were (or "
        "follow) one the step before: %lld\n",
        static_cast<long long>(later_targets), static_cast<long long>(held_targets));
    const int64_t n = ctxs[0][0]->tree().num_pages();
    const double bytes = static_cast<double>(ctxs[kSparse][0]->MemoryBytes()) / (n * kT);
    auto add = [&](const std::string& method, const std::vector<double>& t, double visited,
                   double m, double key_bytes, double reuse, int64_t found) {
      Row r;
      r.shape = shape.name;
      r.tokens = k.tokens;
      r.batch = k.batch;
      r.method = method;
      r.latency = Summarise(t);
      r.visited = visited;
      r.key_bytes = key_bytes;
      r.mass = m;
      r.reuse = reuse;
      r.targets = targets;
      r.targets_kept = found;
      r.bytes_per_token = bytes;
      rows->push_back(r);
      std::printf(
          "  %-6s %8lld tok x%-3d %-26s p50 %9.1f us  p99 %9.1f us  read %.4f  key bytes "
          "%.4f  mass %.5f  targets %lld/%lld  reuse %.3f  index %.0f B/token (%.2f%% of 7B "
          "KV)\n",
          r.shape.c_str(), static_cast<long long>(r.tokens), r.batch, method.c_str(),
          r.latency.p50_us, r.latency.p99_us, r.visited, r.key_bytes, r.mass,
          static_cast<long long>(found), static_cast<long long>(targets), reuse, r.bytes_per_token,
          100.0 * r.bytes_per_token / kKvBytesPerToken);
      std::fflush(stdout);
    };
    // Per head and step: T x D bytes per opened page, 4 x D per page or
    // chunk summary screened (kSummaryRows rows of D int8 values).
    const double all_pages = static_cast<double>(page_steps) * R;
    auto sparse_row = [&](const std::string& method, int m) {
      const int64_t heads = reused[m] + descended[m];
      const double reuse = heads > 0 ? static_cast<double>(reused[m]) / heads : 0.0;
      const double touched =
          static_cast<double>(opened[m]) * kT +
          static_cast<double>(screened[m] + chunks[m]) * index::KeyTable::kSummaryRows;
      add(method, us[m], opened[m] / all_pages, mass[kFlat] > 0 ? mass[m] / mass[kFlat] : 1.0,
          touched / (all_pages * kT), reuse, kept[m]);
    };
    sparse_row("mass sparse (shipped)", kSparse);
    sparse_row("mass sparse (no reuse)", kFull);
    sparse_row("mass sparse (any drift)", kAlways);
    add("mass flat pass", us[kFlat], 1.0, 1.0, 1.0, 0.0, kept[kFlat]);
    add("pooled key-key tree", tree_us, 0.0, 0.0, 0.0, 0.0, 0);
    add("exact int8 scan", scan_us, 1.0, 0.0, 1.0, 0.0, 0);
  }

 private:
  const LongScenarioOptions o_;
  std::vector<quality::KvDump> dumps_;
  std::vector<const quality::KvDump*> ptrs_;
  std::vector<std::vector<float>> anchor_;
};

}  // namespace

// The 7B-class calibration: the copy model's prior, every (layer, query
// head) of the paired shape a retrieval head (8 on 4 key heads), the model's
// own softmax scale.
bool LoadLongInputs(const LongScenarioOptions& o, std::vector<quality::KvDump>* dumps,
                    index::SelectionCalibration* copy) {
  const absl::Status st = quality::LoadLongInputs(o.dumps_dir, o.calibration_dir, dumps, copy);
  if (!st.ok()) std::fprintf(stderr, "long: %s\n", st.ToString().c_str());
  return st.ok();
}

bool RunLongScenario(const LongScenarioOptions& o, const std::string& out_dir) {
  std::vector<quality::KvDump> dumps;
  index::SelectionCalibration copy;
  if (!LoadLongInputs(o, &dumps, &copy)) return false;
  std::vector<Shape> shapes = {{"7b", true, quality::PairedCalibration(copy)},
                               {"small", false, copy}};
  std::vector<Case> cases = {{16384, 1},  {131072, 1},  {1 << 20, 1},
                             {16384, 16}, {131072, 16}, {32768, 64}};
  if (o.quick) cases = {{16384, 1}, {131072, 1}, {32768, 64}};
  std::printf("long: isa %s, %d threads\n", std::string(index::Int8DotIsa()).c_str(), o.threads);
  LongBench bench(o, std::move(dumps));
  std::vector<Row> rows;
  for (const Shape& shape : shapes) {
    for (const Case& k : cases) {
      if (shape.name == "small" && k.batch == 16) continue;
      bench.Run(shape, k, &rows);
    }
  }
  FILE* f = std::fopen((out_dir + "/select_long.csv").c_str(), "w");
  FILE* md = std::fopen((out_dir + "/select_long.md").c_str(), "w");
  if (f == nullptr || md == nullptr) {
    std::perror(out_dir.c_str());
    return false;
  }
  std::fprintf(f,
               "shape,tokens,batch,threads,method,p50_us,p99_us,pages_read,key_bytes_touched,"
               "expected_mass_vs_flat,targets,targets_kept,reuse_rate,index_bytes_per_token\n");
  std::fprintf(md,
               "| shape | tokens x batch | threads | method | p50 us | p99 us | vs flat p50 | "
               "pages read | key bytes touched | expected mass vs flat | targets kept | reuse "
               "| index B/token (share of 7B KV) |\n"
               "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Row& r : rows) {
    double flat_p50 = 0;
    for (const Row& x : rows) {
      if (x.shape == r.shape && x.tokens == r.tokens && x.batch == r.batch &&
          x.method == "mass flat pass") {
        flat_p50 = x.latency.p50_us;
      }
    }
    std::fprintf(f, "%s,%lld,%d,%d,%s,%.1f,%.1f,%.5f,%.5f,%.5f,%lld,%lld,%.4f,%.1f\n",
                 r.shape.c_str(), static_cast<long long>(r.tokens), r.batch, o.threads,
                 r.method.c_str(), r.latency.p50_us, r.latency.p99_us, r.visited, r.key_bytes,
                 r.mass, static_cast<long long>(r.targets), static_cast<long long>(r.targets_kept),
                 r.reuse, r.bytes_per_token);
    const bool tree = r.method == "pooled key-key tree";
    const bool mass = r.method.rfind("mass", 0) == 0;
    std::fprintf(md,
                 "| %s | %lldK x %d | %d | %s | %.0f | %.0f | %.2fx | %s | %s | %s | %s | %s | "
                 "%.0f (%.2f%%) |\n",
                 r.shape.c_str(), static_cast<long long>(r.tokens / 1024), r.batch, o.threads,
                 r.method.c_str(), r.latency.p50_us, r.latency.p99_us,
                 r.latency.p50_us > 0 ? flat_p50 / r.latency.p50_us : 0.0,
                 tree ? "-" : absl::StrFormat("%.4f", r.visited).c_str(),
                 tree ? "-" : absl::StrFormat("%.4f", r.key_bytes).c_str(),
                 mass ? absl::StrFormat("%.5f", r.mass).c_str() : "-",
                 mass ? absl::StrFormat("%lld/%lld", static_cast<long long>(r.targets_kept),
                                        static_cast<long long>(r.targets))
                            .c_str()
                      : "-",
                 mass ? absl::StrFormat("%.3f", r.reuse).c_str() : "-", r.bytes_per_token,
                 100.0 * r.bytes_per_token / kKvBytesPerToken);
  }
  std::fclose(f);
  std::fclose(md);
  std::printf("wrote %s/select_long.csv and select_long.md\n", out_dir.c_str());
  return true;
}

}  // namespace kvtier::bench
