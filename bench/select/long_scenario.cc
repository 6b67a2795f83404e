#include "bench/select/long_scenario.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/quality/calibrate.h"
#include "bench/quality/kv_dump.h"
#include "bench/quality/long_context.h"
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
  double mass = 1.0;  // expected mass vs the flat pass
  double bytes_per_token = 0;
};

index::SelectorOptions Shipped(int64_t min_pages, int threads,
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
  o.mass_tree.min_pages = min_pages;
  return o;
}

// The 7B-class calibration: the copy model's prior, every (layer, query
// head) of the paired shape a retrieval head (8 on 4 key heads), the model's
// own softmax scale.
index::SelectionCalibration PairedCalibration(const index::SelectionCalibration& copy) {
  index::SelectionCalibration c = copy;
  c.num_q_heads = 2;
  c.retrieval_heads.clear();
  for (int32_t l = 0; l < 4; ++l) {
    for (int32_t h = 0; h < 2; ++h) c.retrieval_heads.push_back({l, h});
  }
  c.head_weights.assign(8, 0.5f);
  c.softmax_scale = 0.125f;
  return c;
}

class LongBench {
 public:
  LongBench(const LongScenarioOptions& o, std::vector<quality::KvDump> dumps)
      : o_(o), dumps_(std::move(dumps)) {
    for (const auto& d : dumps_) ptrs_.push_back(&d);
  }

  void Run(const Shape& shape, const Case& k, std::vector<Row>* rows) {
    const index::SelectionCalibration& c = shape.calibration;
    std::vector<LongContext> lcs;
    std::vector<std::unique_ptr<index::ContextIndex>> ctxs;
    const auto build0 = Clock::now();
    for (int b = 0; b < k.batch; ++b) {
      LongContextOptions lo;
      lo.tokens = k.tokens;
      lo.pair_heads = shape.pair_heads;
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
      auto ctx = index::ContextIndex::Create(io);
      if (!ctx.ok()) std::abort();
      const int64_t n = lc->QueryPosition(lc->query_steps() - 1) / kT;
      std::vector<index::BlockSummary> pages;
      for (int64_t p = 0; p < n; ++p) pages.push_back(lc->PageSummary(p, c));
      if (!(*ctx)->AddSegment(pages).ok()) std::abort();
      lcs.push_back(std::move(*lc));
      ctxs.push_back(std::move(*ctx));
    }
    std::printf("  built %d context(s) of %lld tokens in %.1f s\n", k.batch,
                static_cast<long long>(k.tokens),
                std::chrono::duration<double>(Clock::now() - build0).count());
    const int64_t n = ctxs[0]->tree().num_pages();
    const int32_t D = ctxs[0]->tree().dim();
    const int64_t R = static_cast<int64_t>(c.retrieval_heads.size());
    const int64_t budget = std::max<int64_t>(2, n / 32);
    const int queries = o_.quick ? 8 : 16;
    // Every step's queries, per context: [R][D].
    std::vector<std::vector<std::vector<float>>> q(queries);
    for (int s = 0; s < queries; ++s) {
      for (const LongContext& lc : lcs) q[s].push_back(lc.HeadQueries(s % lc.query_steps(), c));
    }
    auto pool = std::make_shared<index::WorkerPool>(o_.threads - 1);
    auto sparse =
        *index::Selector::Create(Shipped(index::MassTreeOptions().min_pages, o_.threads, pool));
    auto flat = *index::Selector::Create(Shipped(int64_t{1} << 40, o_.threads, pool));

    auto batch = [&](int s, index::ScorerKind kind, std::vector<index::SelectRequest>* reqs) {
      reqs->clear();
      for (int b = 0; b < k.batch; ++b) {
        index::SelectRequest r;
        r.context = ctxs[b].get();
        r.scorer = kind;
        r.stability = kind != index::ScorerKind::kMass;
        r.budget_blocks = budget;
        r.step = ++step_;
        if (kind == index::ScorerKind::kMass) {
          r.head_queries = q[s][b];
        } else {
          // The pooled anchor: the mean key of the context's last block.
          r.anchor = anchors_[b];
        }
        reqs->push_back(r);
      }
    };
    anchors_.clear();
    for (int b = 0; b < k.batch; ++b) {
      index::BlockSummary last = lcs[b].PageSummary(n - 1, c);
      anchors_.push_back(last.mean);
    }
    std::vector<index::SelectRequest> reqs;
    std::vector<index::SelectResult> res(k.batch), flat_res(k.batch);
    Row base;
    base.shape = shape.name;
    base.tokens = k.tokens;
    base.batch = k.batch;

    // Flat pass (the reference): its choice and estimates per step.
    std::vector<double> flat_us;
    std::vector<std::vector<std::vector<int64_t>>> flat_blocks(queries);
    for (int s = 0; s < queries; ++s) {
      batch(s, index::ScorerKind::kMass, &reqs);
      const auto t0 = Clock::now();
      if (!flat->SelectBatch(reqs, absl::MakeSpan(flat_res)).ok()) std::abort();
      flat_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      for (const auto& r : flat_res) flat_blocks[s].push_back(r.blocks);
    }
    // The sparse path: timed, then judged against the flat pass.
    std::vector<double> sparse_us;
    double mass_flat = 0, mass_sparse = 0;
    int64_t opened = 0, screened = 0, chunks = 0;
    int64_t targets = 0, targets_kept = 0;  // retrieval targets the flat pass chose
    std::vector<float> est(n);
    index::KeyScorerScratch scratch;
    for (int rep = 0; rep < 3; ++rep) {
      for (int s = 0; s < queries; ++s) {
        batch(s, index::ScorerKind::kMass, &reqs);
        const auto t0 = Clock::now();
        if (!sparse->SelectBatch(reqs, absl::MakeSpan(res)).ok()) std::abort();
        sparse_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        if (rep > 0) continue;
        for (int b = 0; b < k.batch; ++b) {
          opened += res[b].mass_pages_opened;
          screened += res[b].mass_pages_screened;
          chunks += res[b].mass_chunks_screened;
          const index::ContextIndex& ctx = *ctxs[b];
          if (!index::MassScores(ctx.keys(), c, ctx.key_slots(), D, n, q[s][b], &scratch,
                                 absl::MakeSpan(est))
                   .ok()) {
            std::abort();
          }
          for (int64_t p : flat_blocks[s][b]) mass_flat += est[p];
          for (int64_t p : res[b].blocks) mass_sparse += est[p];
          const int64_t last = static_cast<int64_t>(c.prior.size()) - 1;
          for (int64_t p = 1; p + 1 < n; ++p) {
            if (est[p] <= c.prior[std::min<int64_t>(n - 1 - p, last)]) continue;
            const auto& fb = flat_blocks[s][b];
            const bool in_flat = std::binary_search(fb.begin(), fb.end(), p);
            targets += in_flat;
            const bool kept =
                in_flat && std::binary_search(res[b].blocks.begin(), res[b].blocks.end(), p);
            targets_kept += kept;
          }
        }
      }
    }
    // Pooled key-key through the tree.
    std::vector<double> tree_us;
    for (int rep = 0; rep < 3; ++rep) {
      for (int s = 0; s < queries; ++s) {
        batch(s, index::ScorerKind::kKeyKey, &reqs);
        const auto t0 = Clock::now();
        if (!sparse->SelectBatch(reqs, absl::MakeSpan(res)).ok()) std::abort();
        tree_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
    }
    // The exact scan: every retrieval key of every context, int8 x int8
    // (the flat pass's bytes without its exps), on the same threads.
    std::vector<double> scan_us;
    std::vector<std::vector<int32_t>> dots(o_.threads, std::vector<int32_t>(n * kT));
    for (int s = 0; s < queries; ++s) {
      const auto t0 = Clock::now();
      pool->ParallelFor(k.batch, o_.threads, [&](int32_t slot, int64_t b) {
        const index::KeyTable& t = *ctxs[b]->keys();
        std::vector<int8_t> qb(D);
        for (int32_t j = 0; j < t.num_key_heads(); ++j) {
          index::QuantizeInt8(&q[s][b][0], D, qb.data());
          index::DotRowsS8(t.HeadKeys(0, j), n * kT, D, D, qb.data(), dots[slot].data());
        }
      });
      scan_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    const double bytes = static_cast<double>(ctxs[0]->MemoryBytes()) / (n * kT);
    auto add = [&](const std::string& method, const std::vector<double>& us, double visited,
                   double mass, double key_bytes) {
      Row r = base;
      r.method = method;
      r.latency = Summarise(us);
      r.visited = visited;
      r.key_bytes = key_bytes;
      r.mass = mass;
      r.bytes_per_token = bytes;
      rows->push_back(r);
      std::printf(
          "  %-6s %8lld tok x%-3d %-24s p50 %10.1f us  p99 %10.1f us  read %.4f  "
          "key bytes %.4f  mass %.5f  index %.0f B/token (%.2f%% of 7B KV)\n",
          r.shape.c_str(), static_cast<long long>(r.tokens), r.batch, method.c_str(),
          r.latency.p50_us, r.latency.p99_us, r.visited, r.key_bytes, r.mass, r.bytes_per_token,
          100.0 * r.bytes_per_token / kKvBytesPerToken);
      std::fflush(stdout);
    };
    std::printf(
        "  pages screened per head and step: %.4f of the pages; retrieval targets the flat "
        "pass chose: %lld, also chosen by the sparse path: %lld\n",
        static_cast<double>(screened) / (static_cast<double>(n) * R * k.batch * queries),
        static_cast<long long>(targets), static_cast<long long>(targets_kept));
    // Per head and step: T x D bytes per opened page, 4 x D per page or
    // chunk summary screened (kSummaryRows rows of D int8 values).
    const double all_keys = static_cast<double>(n) * R * k.batch * queries * kT * D;
    const double touched =
        static_cast<double>(opened) * kT * D +
        static_cast<double>(screened + chunks) * index::KeyTable::kSummaryRows * D;
    add("mass sparse (shipped)", sparse_us,
        static_cast<double>(opened) / (static_cast<double>(n) * R * k.batch * queries),
        mass_flat > 0 ? mass_sparse / mass_flat : 1.0, touched / all_keys);
    add("mass flat pass", flat_us, 1.0, 1.0, 1.0);
    add("pooled key-key tree", tree_us, 0.0, 0.0, 0.0);
    add("exact int8 scan", scan_us, 1.0, 0.0, 1.0);
  }

 private:
  const LongScenarioOptions o_;
  std::vector<quality::KvDump> dumps_;
  std::vector<const quality::KvDump*> ptrs_;
  std::vector<std::vector<float>> anchors_;
  int64_t step_ = 0;
};

}  // namespace

bool RunLongScenario(const LongScenarioOptions& o, const std::string& out_dir) {
  std::vector<quality::KvDump> dumps;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(o.dumps_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("rkc-", 0) != 0 || e.path().extension() != ".safetensors") continue;
    absl::StatusOr<quality::KvDump> d = quality::LoadKvDump(e.path().string());
    if (!d.ok()) {
      std::fprintf(stderr, "long: %s\n", d.status().ToString().c_str());
      return false;
    }
    dumps.push_back(std::move(*d));
  }
  if (dumps.empty()) {
    std::fprintf(stderr, "long: no rkc-* dumps in %s\n", o.dumps_dir.c_str());
    return false;
  }
  std::sort(dumps.begin(), dumps.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  auto cals = quality::LoadCalibrations(o.calibration_dir);
  if (!cals.ok() || !cals->count("austen-copy")) {
    std::fprintf(stderr, "long: no austen-copy calibration in %s\n", o.calibration_dir.c_str());
    return false;
  }
  // Copy tracking off: every head's terms count at every step, the most
  // work the descent does (with it on, a head that is not copying opens
  // pages down to head_min_mass only, as here).
  index::SelectionCalibration copy = cals->at("austen-copy");
  copy.copy_run = 0;
  std::vector<Shape> shapes = {{"7b", true, PairedCalibration(copy)}, {"small", false, copy}};
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
               "expected_mass_vs_flat,index_bytes_per_token\n");
  std::fprintf(md,
               "| shape | tokens x batch | threads | method | p50 us | p99 us | vs flat p50 | "
               "pages read | key bytes touched | expected mass vs flat | index B/token (share "
               "of 7B KV) |\n"
               "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Row& r : rows) {
    double flat_p50 = 0;
    for (const Row& x : rows) {
      if (x.shape == r.shape && x.tokens == r.tokens && x.batch == r.batch &&
          x.method == "mass flat pass") {
        flat_p50 = x.latency.p50_us;
      }
    }
    std::fprintf(f, "%s,%lld,%d,%d,%s,%.1f,%.1f,%.5f,%.5f,%.5f,%.1f\n", r.shape.c_str(),
                 static_cast<long long>(r.tokens), r.batch, o.threads, r.method.c_str(),
                 r.latency.p50_us, r.latency.p99_us, r.visited, r.key_bytes, r.mass,
                 r.bytes_per_token);
    const bool tree = r.method == "pooled key-key tree";
    std::fprintf(
        md, "| %s | %lldK x %d | %d | %s | %.0f | %.0f | %.2fx | %s | %s | %s | %.0f (%.2f%%) |\n",
        r.shape.c_str(), static_cast<long long>(r.tokens / 1024), r.batch, o.threads,
        r.method.c_str(), r.latency.p50_us, r.latency.p99_us,
        r.latency.p50_us > 0 ? flat_p50 / r.latency.p50_us : 0.0,
        tree ? "-" : absl::StrFormat("%.4f", r.visited).c_str(),
        tree ? "-" : absl::StrFormat("%.4f", r.key_bytes).c_str(),
        r.method.rfind("mass", 0) == 0 ? absl::StrFormat("%.5f", r.mass).c_str() : "-",
        r.bytes_per_token, 100.0 * r.bytes_per_token / kKvBytesPerToken);
  }
  std::fclose(f);
  std::fclose(md);
  std::printf("wrote %s/select_long.csv and select_long.md\n", out_dir.c_str());
  return true;
}

}  // namespace kvtier::bench
