// kvtier_select_bench: cost and recall of in-process block selection against
// FAISS on the same vectors, all in one run.
//
// Data (tests/testutil/synthetic.h): D = 128 block vectors with a shared
// mean direction, topic runs of 16-256 consecutive blocks and noise; each
// query's anchor is one topic of the context plus noise. The reference is
// the exact top-K of cos(anchor, v_b) over all blocks (FAISS IndexFlatIP on
// normalised vectors), K = 1% of the blocks (the CHESS budget).
//
//   single   one context of N blocks (8K, 64K, 256K): kvtier descent and
//            GEMM at several keep-fraction settings, FlatIP, HNSW.
//   batch    64 contexts x 8K blocks: one SelectBatch vs 64 FlatIP searches.
//   window   the default scorer on an uncalibrated profile (a sliding
//            window): the window path against the flat pass, per step.
//   memory   bytes per open context and per block of summaries.
//   long     the mass scorer at 16K-1M tokens, batches of 1-64, against its
//            flat pass, the pooled tree and an exact scan (long_scenario.h;
//            run only when named: it takes minutes).
//   reps     which per-block representative of a retrieval head's keys ranks
//            the blocks holding its attention (rep_scenario.h; only when
//            named).
//
// Every method runs single-threaded (FAISS's OpenMP pool is set to 1 thread
// for searches) unless a row says threads=2. Ratios are FlatIP latency /
// method latency in the same run.
//
// Usage: kvtier_select_bench --out DIR [--quick] [--queries N] [--hnsw-all]
//                             [--scenario single|batch|window|long|reps|all]
//                             [--config NAME] [--blocks N]  (one config / size)
//                             [--threads N]  (long: the selector's threads, 2)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "bench/select/long_scenario.h"
#include "bench/select/rep_scenario.h"
#include "faiss/IndexFlat.h"
#include "faiss/IndexHNSW.h"
#include "index/kernels/simd.h"
#include "index/select/selector.h"
#include "index/summary/summary.h"
#include "index/summary/summary_codec.h"
#include "tests/testutil/synthetic.h"

namespace {

using kvtier::index::ContextIndex;
using kvtier::index::SelectAlgorithm;
using kvtier::index::Selector;
using kvtier::index::SelectorOptions;
using kvtier::index::SelectRequest;
using kvtier::index::SelectResult;
using kvtier::index::TreeOptions;
using kvtier::testing::MakeSyntheticContext;
using kvtier::testing::SyntheticContext;
using kvtier::testing::SyntheticContextOptions;

constexpr int32_t kDim = 128;
bool g_hnsw_all = false;
std::string g_scenario = "all";
std::string g_config;       // --config: only this kConfigs entry (empty: all)
int64_t g_only_blocks = 0;  // --blocks: only this single-context size
using Clock = std::chrono::steady_clock;

double Micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

struct Stats {
  double median_us = 0;
  double mean_us = 0;
  double recall = 0;
  double rows = 0;
};

Stats Summarise(std::vector<double> us, double recall_sum, double rows_sum) {
  Stats s;
  const size_t n = us.size();
  std::sort(us.begin(), us.end());
  s.median_us = us[n / 2];
  s.mean_us = std::accumulate(us.begin(), us.end(), 0.0) / n;
  s.recall = recall_sum / n;
  s.rows = rows_sum / n;
  return s;
}

double Recall(std::vector<int64_t> got, const std::vector<int64_t>& want) {
  std::sort(got.begin(), got.end());
  std::vector<int64_t> both;
  std::set_intersection(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(both));
  return want.empty() ? 1.0 : static_cast<double>(both.size()) / want.size();
}

std::vector<float> Normalised(const std::vector<float>& v) {
  std::vector<float> out(v);
  for (size_t i = 0; i < out.size(); i += kDim) {
    double n2 = 0;
    for (int d = 0; d < kDim; ++d) n2 += double{out[i + d]} * out[i + d];
    const float inv = n2 > 0 ? static_cast<float>(1 / std::sqrt(n2)) : 0.0f;
    for (int d = 0; d < kDim; ++d) out[i + d] *= inv;
  }
  return out;
}

SyntheticContext MakeData(int64_t n, uint64_t seed) {
  SyntheticContextOptions o;
  o.num_blocks = n;
  o.dim = kDim;
  o.num_planted = 0;
  o.num_topics = static_cast<int32_t>(std::max<int64_t>(64, n / 256));
  o.anchor_topic = 0;
  o.seed = seed;
  return MakeSyntheticContext(o);
}

// Query anchors: topic directions of the context (via fresh contexts with the
// same seed and another anchor_topic) plus noise.
std::vector<std::vector<float>> MakeAnchors(int64_t n, uint64_t seed, int queries) {
  std::vector<std::vector<float>> anchors;
  std::mt19937_64 rng(seed * 7919);
  std::normal_distribution<float> noise(0.0f, 0.3f / std::sqrt(kDim));
  for (int q = 0; q < queries; ++q) {
    SyntheticContextOptions o;
    o.num_blocks = 1;  // only the anchor of topic q is needed
    o.dim = kDim;
    o.num_planted = 0;
    o.num_topics = static_cast<int32_t>(std::max<int64_t>(64, n / 256));
    o.anchor_topic = (q * 37) % o.num_topics;
    o.seed = seed;
    std::vector<float> a = MakeSyntheticContext(o).anchor;
    for (float& x : a) x += noise(rng);
    anchors.push_back(a);
  }
  return anchors;
}

// Exact top-k by a plain fp32 scan with the index's own dot kernel (AVX2 /
// AVX-512 when present) and nth_element: the exact baseline a SIMD build of
// FlatIP would approach.
class ExactScan {
 public:
  explicit ExactScan(const std::vector<float>& unit)
      : unit_(unit), n_(static_cast<int64_t>(unit.size()) / kDim), scores_(n_), idx_(n_) {}
  void Search(const std::vector<float>& q, int64_t k, std::vector<int64_t>* out) {
    for (int64_t b = 0; b < n_; ++b) {
      scores_[b] = kvtier::index::simd::Dot(q.data(), &unit_[b * kDim], kDim);
    }
    std::iota(idx_.begin(), idx_.end(), 0);
    std::nth_element(idx_.begin(), idx_.begin() + k, idx_.end(), [this](int32_t a, int32_t b) {
      return scores_[a] > scores_[b] || (scores_[a] == scores_[b] && a < b);
    });
    out->assign(idx_.begin(), idx_.begin() + k);
  }

 private:
  const std::vector<float>& unit_;
  int64_t n_;
  std::vector<float> scores_;
  std::vector<int32_t> idx_;
};

struct Config {
  const char* name;
  double grid, chunk, page;
};

constexpr Config kConfigs[] = {
    {"default_50_20_10", 0.5, 0.2, 0.1},
    {"wide_75_30_5", 0.75, 0.3, 0.05},
    {"wider_100_40_5", 1.0, 0.4, 0.05},
    {"chunks_only_100_100_5", 1.0, 1.0, 0.05},
};

struct Row {
  std::string scenario, method, config;
  int64_t blocks = 0;
  int contexts = 1;
  int64_t k = 0;
  int threads = 1;
  Stats s;
  double flat_us = 0;
};

void Print(const Row& r) {
  std::printf(
      "%-7s %-16s %-22s N=%-7lld ctx=%-3d K=%-5lld thr=%d  "
      "median %9.1f us  mean %9.1f us  recall %.3f  rows %9.0f  "
      "x%.1f vs flat\n",
      r.scenario.c_str(), r.method.c_str(), r.config.c_str(), static_cast<long long>(r.blocks),
      r.contexts, static_cast<long long>(r.k), r.threads, r.s.median_us, r.s.mean_us, r.s.recall,
      r.s.rows, r.s.median_us > 0 ? r.flat_us / r.s.median_us : 0.0);
  std::fflush(stdout);
}

std::unique_ptr<ContextIndex> OpenContext(const std::vector<float>& vectors) {
  TreeOptions o;
  o.dim = kDim;
  auto ctx = ContextIndex::Create(o);
  if (!ctx.ok() || !(*ctx)->tree().AddSegment(vectors).ok()) std::abort();
  return std::move(*ctx);
}

std::unique_ptr<Selector> MakeSelector(const Config& c, SelectAlgorithm alg, int threads) {
  SelectorOptions o;
  o.grid_keep_fraction = c.grid;
  o.chunk_keep_fraction = c.chunk;
  o.page_keep_fraction = c.page;
  o.sink_blocks = 0;  // pure ranking: compare with exact top-K
  o.local_blocks = 0;
  o.stability.weight = 0;
  o.stability.hold_threshold = 2.0f;
  o.algorithm = alg;
  o.num_threads = threads;
  auto s = Selector::Create(o);
  if (!s.ok()) std::abort();
  return std::move(*s);
}

void SingleContext(int64_t n, int queries, std::vector<Row>* rows) {
  const SyntheticContext data = MakeData(n, 1000 + n);
  const std::vector<float> unit = Normalised(data.vectors);
  const auto anchors = MakeAnchors(n, 1000 + n, queries);
  const int64_t k = std::max<int64_t>(1, n / 100);

  // FAISS exact.
  faiss::IndexFlatIP flat(kDim);
  flat.add(n, unit.data());
  std::vector<std::vector<int64_t>> truth(queries);
  std::vector<float> dist(k);
  std::vector<faiss::Index::idx_t> labels(k);
  std::vector<double> us;
  for (int q = 0; q < queries; ++q) {
    const std::vector<float> qa = Normalised(anchors[q]);
    const auto t0 = Clock::now();
    flat.search(1, qa.data(), k, dist.data(), labels.data());
    us.push_back(Micros(t0, Clock::now()));
    truth[q].assign(labels.begin(), labels.end());
    std::sort(truth[q].begin(), truth[q].end());
  }
  Row fr{"single", "faiss_flat_ip", "exact", n, 1, k, 1, Summarise(us, queries, n * queries), 0};
  fr.flat_us = fr.s.median_us;
  const double flat_us = fr.s.median_us;
  rows->push_back(fr);
  Print(fr);

  {
    ExactScan scan(unit);
    std::vector<int64_t> got;
    us.clear();
    double rec = 0;
    for (int q = 0; q < queries; ++q) {
      const std::vector<float> qa = Normalised(anchors[q]);
      const auto t0 = Clock::now();
      scan.Search(qa, k, &got);
      us.push_back(Micros(t0, Clock::now()));
      rec += Recall(got, truth[q]);
    }
    Row r{"single", "exact_scan_fp32", "simd", n, 1, k, 1, Summarise(us, rec, n * queries),
          flat_us};
    rows->push_back(r);
    Print(r);
  }

  // FAISS HNSW (built with 2 threads, searched with 1); its build takes
  // minutes at 256K blocks on 2 cores, so it runs up to 64K unless asked.
  if (n <= 65536 || g_hnsw_all) {
    faiss::IndexHNSWFlat hnsw(kDim, 32, faiss::METRIC_INNER_PRODUCT);
    hnsw.hnsw.efConstruction = 40;
    omp_set_num_threads(2);
    const auto b0 = Clock::now();
    hnsw.add(n, unit.data());
    const double build_s = Micros(b0, Clock::now()) / 1e6;
    omp_set_num_threads(1);
    for (int ef : {static_cast<int>(k), static_cast<int>(2 * k)}) {
      hnsw.hnsw.efSearch = std::max(ef, 64);
      us.clear();
      double rec = 0;
      for (int q = 0; q < queries; ++q) {
        const std::vector<float> qa = Normalised(anchors[q]);
        const auto t0 = Clock::now();
        hnsw.search(1, qa.data(), k, dist.data(), labels.data());
        us.push_back(Micros(t0, Clock::now()));
        rec += Recall(std::vector<int64_t>(labels.begin(), labels.end()), truth[q]);
      }
      Row r{"single",
            "faiss_hnsw32",
            "efSearch=" + std::to_string(hnsw.hnsw.efSearch),
            n,
            1,
            k,
            1,
            Summarise(us, rec, 0),
            flat_us};
      rows->push_back(r);
      Print(r);
    }
    std::printf("        (HNSW build: %.1f s on 2 threads)\n", build_s);
  }

  // kvtier: the descent and the one pass over every level (gemm).
  for (SelectAlgorithm alg : {SelectAlgorithm::kDescent, SelectAlgorithm::kGemm}) {
    for (const Config& c : kConfigs) {
      if (!g_config.empty() && g_config != c.name) continue;
      const bool descent = alg == SelectAlgorithm::kDescent;
      std::unique_ptr<ContextIndex> ctx = OpenContext(data.vectors);
      std::unique_ptr<Selector> selector = MakeSelector(c, alg, 1);
      std::vector<double> times;
      double rec = 0, scored = 0;
      SelectResult out;
      for (int rep = 0; rep < 2; ++rep) {  // first pass warms caches
        times.clear();
        rec = scored = 0;
        for (int q = 0; q < queries; ++q) {
          SelectRequest r;
          r.context = ctx.get();
          r.anchor = anchors[q];
          r.budget_blocks = k;
          r.step = rep * queries + q;
          const auto t0 = Clock::now();
          if (!selector->Select(r, &out).ok()) std::abort();
          times.push_back(Micros(t0, Clock::now()));
          rec += Recall(out.blocks, truth[q]);
          scored += out.rows_scored;
        }
      }
      Row r{"single", descent ? "kvtier_descent" : "kvtier_gemm",
            c.name,   n,
            1,        k,
            1,        Summarise(times, rec, scored),
            flat_us};
      rows->push_back(r);
      Print(r);
    }
  }
}

void Batch(int contexts, int64_t n, int queries, std::vector<Row>* rows) {
  const int64_t k = n / 100;
  std::vector<SyntheticContext> data;
  std::vector<std::unique_ptr<faiss::IndexFlatIP>> flats;
  std::vector<std::vector<std::vector<float>>> anchors;
  for (int c = 0; c < contexts; ++c) {
    data.push_back(MakeData(n, 5000 + c));
    flats.push_back(std::make_unique<faiss::IndexFlatIP>(kDim));
    flats.back()->add(n, Normalised(data.back().vectors).data());
    anchors.push_back(MakeAnchors(n, 5000 + c, queries));
  }
  // Reference: 64 FlatIP searches per step.
  std::vector<std::vector<std::vector<int64_t>>> truth(queries,
                                                       std::vector<std::vector<int64_t>>(contexts));
  std::vector<float> dist(k);
  std::vector<faiss::Index::idx_t> labels(k);
  std::vector<double> us;
  for (int q = 0; q < queries; ++q) {
    const auto t0 = Clock::now();
    for (int c = 0; c < contexts; ++c) {
      const std::vector<float> qa = Normalised(anchors[c][q]);
      flats[c]->search(1, qa.data(), k, dist.data(), labels.data());
      truth[q][c].assign(labels.begin(), labels.end());
    }
    us.push_back(Micros(t0, Clock::now()));
    for (auto& t : truth[q]) std::sort(t.begin(), t.end());
  }
  Row fr{"batch",  "faiss_flat_ip",
         "exact",  n,
         contexts, k,
         1,        Summarise(us, queries, double(n) * contexts * queries),
         0};
  fr.flat_us = fr.s.median_us;
  const double flat_us = fr.s.median_us;
  rows->push_back(fr);
  Print(fr);
  flats.clear();
  {
    std::vector<std::vector<float>> units;
    std::vector<std::unique_ptr<ExactScan>> scans;
    units.reserve(data.size());
    scans.reserve(data.size());
    for (const SyntheticContext& d : data) units.push_back(Normalised(d.vectors));
    for (const auto& u : units) scans.push_back(std::make_unique<ExactScan>(u));
    std::vector<std::vector<int64_t>> got(contexts);
    us.clear();
    double rec = 0;
    for (int q = 0; q < queries; ++q) {
      std::vector<std::vector<float>> qs;
      qs.reserve(contexts);
      for (int c = 0; c < contexts; ++c) qs.push_back(Normalised(anchors[c][q]));
      const auto t0 = Clock::now();
      for (int c = 0; c < contexts; ++c) scans[c]->Search(qs[c], k, &got[c]);
      us.push_back(Micros(t0, Clock::now()));
      for (int c = 0; c < contexts; ++c) {
        rec += Recall(got[c], truth[q][c]) / contexts;
      }
    }
    Row r{"batch",  "exact_scan_fp32",
          "simd",   n,
          contexts, k,
          1,        Summarise(us, rec, double(n) * contexts * queries),
          flat_us};
    rows->push_back(r);
    Print(r);
  }

  std::vector<std::unique_ptr<ContextIndex>> ctx;
  ctx.reserve(data.size());
  for (const SyntheticContext& d : data) ctx.push_back(OpenContext(d.vectors));
  for (SelectAlgorithm alg : {SelectAlgorithm::kDescent, SelectAlgorithm::kGemm}) {
    for (int threads : {1, 2}) {
      for (const Config& cfg : kConfigs) {
        if (!g_config.empty() && g_config != cfg.name) continue;
        {
          if (threads == 2 && &cfg != &kConfigs[1]) continue;
          auto selector = MakeSelector(cfg, alg, threads);
          std::vector<SelectRequest> reqs(contexts);
          std::vector<SelectResult> outs(contexts);
          double rec = 0, scored = 0;
          static int64_t step = 0;
          for (int rep = 0; rep < 2; ++rep) {
            us.clear();
            rec = scored = 0;
            for (int q = 0; q < queries; ++q) {
              ++step;
              for (int c = 0; c < contexts; ++c) {
                reqs[c].context = ctx[c].get();
                reqs[c].anchor = anchors[c][q];
                reqs[c].budget_blocks = k;
                reqs[c].step = step;
              }
              const auto t0 = Clock::now();
              if (!selector->SelectBatch(reqs, absl::MakeSpan(outs)).ok()) {
                std::abort();
              }
              us.push_back(Micros(t0, Clock::now()));
              for (int c = 0; c < contexts; ++c) {
                rec += Recall(outs[c].blocks, truth[q][c]) / contexts;
                scored += outs[c].rows_scored;
              }
            }
          }
          Row r{"batch",  alg == SelectAlgorithm::kGemm ? "kvtier_gemm" : "kvtier_descent",
                cfg.name, n,
                contexts, k,
                threads,  Summarise(us, rec, scored),
                flat_us};
          rows->push_back(r);
          Print(r);
        }
      }
    }
  }
}

// The shipped default scorer on an uncalibrated profile (mass without
// calibration = a sliding window), one context stepping as an engine drives
// it: one Select per step, a block appended every 16 steps, budget 1/8 of
// the context, stability windows updated (the daemon's select defaults). The
// window path against the flat pass over every page (window_fast_path =
// false), same context contents, same run; results are identical
// (SelectorTest.WindowPathEqualsTheFlatPass).
void Window(int64_t n, int steps, FILE* md) {
  const SyntheticContext data = MakeData(n, 3000 + n);
  SelectorOptions o;
  o.sink_blocks = 1;
  o.local_blocks = 1;
  o.stability.window_steps = 64;
  o.stability.theta = 0.8f;
  o.stability.weight = 0.5f;
  o.stability.hold_threshold = 0.5f;
  double median_us[2] = {0, 0};
  for (int fast = 0; fast < 2; ++fast) {
    o.window_fast_path = fast == 1;
    auto selector = Selector::Create(o);
    if (!selector.ok()) std::abort();
    std::unique_ptr<ContextIndex> ctx = OpenContext(data.vectors);
    std::vector<double> us;
    SelectResult result;
    for (int step = 1; step <= steps; ++step) {
      if (step % 16 == 0 &&
          !ctx->tree().Append(absl::MakeConstSpan(data.vectors.data(), kDim)).ok()) {
        std::abort();
      }
      SelectRequest r;
      r.context = ctx.get();
      r.scorer = kvtier::index::ScorerKind::kMass;
      r.stability = false;  // select.stability_scorers does not name mass
      r.budget_blocks = ctx->tree().num_pages() / 8;
      r.step = step;
      const auto t0 = Clock::now();
      if (!(*selector)->Select(r, &result).ok()) std::abort();
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    // The first step observes every page once on both paths.
    std::sort(us.begin() + 1, us.end());
    median_us[fast] = us[1 + (us.size() - 1) / 2];
  }
  std::printf("window n=%lld: flat pass %.1f us/step, window path %.1f us/step (%.1fx)\n",
              static_cast<long long>(n), median_us[0], median_us[1], median_us[0] / median_us[1]);
  std::fprintf(md, "| %lld | %lld | %.1f | %.1f | %.1fx |\n", static_cast<long long>(n),
               static_cast<long long>(n / 8), median_us[0], median_us[1],
               median_us[0] / median_us[1]);
}

void Memory(FILE* out) {
  const int64_t n = 8192;
  const SyntheticContext data = MakeData(n, 42);
  auto ctx = OpenContext(data.vectors);
  ctx->stability().Resize(n);
  const size_t ctx_bytes = ctx->MemoryBytes();
  std::fprintf(out, "open_context_8k_blocks_bytes,%zu\n", ctx_bytes);
  std::fprintf(out, "open_context_bytes_per_block,%.1f\n", static_cast<double>(ctx_bytes) / n);
  std::printf("memory: open context of %lld blocks = %zu bytes (%.1f B/block)\n",
              static_cast<long long>(n), ctx_bytes, static_cast<double>(ctx_bytes) / n);
  // Summary blobs for a Qwen2.5-7B-like profile (28 layers, 4 KV heads).
  kvtier::index::BlockLayout layout{28, 4, kDim, 16, kvtier::index::Dtype::kBf16};
  const auto payload = kvtier::testing::MakeBlockPayload(layout, 1, {});
  kvtier::index::HeadVarianceTracker tracker(28, 4, kDim);
  const kvtier::index::HeadWeights w = tracker.ComputeWeights();
  struct Variant {
    const char* name;
    bool bounds, per_layer, weighted;
  } variants[] = {{"mean", false, false, false},
                  {"mean_weighted_bounds", true, false, true},
                  {"all_per_layer_means", true, true, true}};
  for (const Variant& v : variants) {
    kvtier::index::SummaryOptions so;
    so.bounds = v.bounds;
    so.per_layer = v.per_layer;
    so.head_weights = v.weighted ? &w : nullptr;
    auto s = kvtier::index::ComputeBlockSummary(layout, payload.bytes, so, nullptr);
    if (!s.ok()) std::abort();
    for (auto enc :
         {kvtier::index::SummaryEncoding::kFp32, kvtier::index::SummaryEncoding::kFp16}) {
      auto blob = kvtier::index::EncodeSummary(*s, enc);
      if (!blob.ok()) std::abort();
      const char* e = enc == kvtier::index::SummaryEncoding::kFp32 ? "fp32" : "fp16";
      std::fprintf(out, "summary_blob_%s_%s_bytes,%zu\n", v.name, e, blob->size());
      std::printf("memory: summary blob %-22s %s = %zu bytes/block\n", v.name, e, blob->size());
    }
  }
  // Summary computation cost for that profile (one 1.75 MiB bf16 block).
  kvtier::index::SummaryOptions so;
  const auto t0 = Clock::now();
  constexpr int kReps = 50;
  for (int i = 0; i < kReps; ++i) {
    auto s = kvtier::index::ComputeBlockSummary(layout, payload.bytes, so, nullptr);
    if (!s.ok()) std::abort();
  }
  const double us = Micros(t0, Clock::now()) / kReps;
  std::fprintf(out, "summary_compute_28x4x16x128_bf16_us,%.1f\n", us);
  std::printf(
      "summary: %.1f us per block (28 layers x 4 heads x 16 tokens, "
      "bf16, %lld bytes)\n",
      us, static_cast<long long>(payload.bytes.size()));
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_dir = ".";
  bool quick = false;
  int long_threads = 2;  // --scenario long: the selector's threads
  int queries = 20;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--out") && i + 1 < argc) {
      out_dir = argv[++i];
    } else if (!std::strcmp(argv[i], "--scenario") && i + 1 < argc) {
      g_scenario = argv[++i];
    } else if (!std::strcmp(argv[i], "--config") && i + 1 < argc) {
      g_config = argv[++i];
    } else if (!std::strcmp(argv[i], "--blocks") && i + 1 < argc) {
      g_only_blocks = std::atoll(argv[++i]);
    } else if (!std::strcmp(argv[i], "--hnsw-all")) {
      g_hnsw_all = true;
    } else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      long_threads = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--queries") && i + 1 < argc) {
      queries = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr,
                   "usage: %s --out DIR [--quick] [--queries N] [--hnsw-all] "
                   "[--scenario single|batch|window|long|reps|all] [--config NAME] [--blocks N] "
                   "[--threads N (long)]\n",
                   argv[0]);
      return 2;
    }
  }
  std::error_code made;
  std::filesystem::create_directories(out_dir, made);
  if (made) {
    std::fprintf(stderr, "--out %s: %s\n", out_dir.c_str(), made.message().c_str());
    return 2;
  }
  omp_set_num_threads(1);
  std::printf("kvtier_select_bench: isa=%s dim=%d queries=%d\n",
              std::string(kvtier::index::simd::ActiveIsa()).c_str(), kDim, queries);
  std::vector<Row> rows;
  std::vector<int64_t> sizes = {8192, 65536, 262144};
  if (quick) sizes = {8192, 65536};
  if (g_only_blocks > 0) sizes = {g_only_blocks};
  if (g_scenario == "long" || g_scenario == "reps") {
    kvtier::bench::LongScenarioOptions lo;
    lo.dumps_dir = KVTIER_REALKV_DIR;
    lo.calibration_dir = KVTIER_CALIBRATION_DIR;
    lo.quick = quick;
    lo.threads = long_threads;
    if (g_scenario == "reps") return kvtier::bench::RunRepScenario(lo, out_dir) ? 0 : 1;
    return kvtier::bench::RunLongScenario(lo, out_dir) ? 0 : 1;
  }
  const bool all = g_scenario == "all";
  if (all || g_scenario == "single") {
    for (int64_t n : sizes) SingleContext(n, queries, &rows);
  }
  if (all || g_scenario == "batch") {
    Batch(quick ? 16 : 64, 8192, std::max(5, queries / 2), &rows);
  }
  if (all || g_scenario == "window") {
    const std::string md_path = out_dir + "/select_window.md";
    FILE* md = std::fopen(md_path.c_str(), "w");
    if (md == nullptr) {
      std::perror(md_path.c_str());
      return 1;
    }
    std::fprintf(md,
                 "| blocks | budget | flat pass us/step | window path us/step | speed-up |\n"
                 "|---|---|---|---|---|\n");
    for (int64_t n : sizes) Window(n, quick ? 100 : 300, md);
    std::fclose(md);
  }

  const std::string csv = out_dir + "/select_bench.csv";
  FILE* f = std::fopen(csv.c_str(), "w");
  if (f == nullptr) {
    std::perror(csv.c_str());
    return 1;
  }
  std::fprintf(f,
               "scenario,method,config,num_blocks,contexts,k,threads,"
               "latency_us_median,latency_us_mean,recall_at_k,rows_scored,"
               "speedup_vs_flat_ip\n");
  for (const Row& r : rows) {
    std::fprintf(f, "%s,%s,%s,%lld,%d,%lld,%d,%.2f,%.2f,%.4f,%.0f,%.2f\n", r.scenario.c_str(),
                 r.method.c_str(), r.config.c_str(), static_cast<long long>(r.blocks), r.contexts,
                 static_cast<long long>(r.k), r.threads, r.s.median_us, r.s.mean_us, r.s.recall,
                 r.s.rows, r.s.median_us > 0 ? r.flat_us / r.s.median_us : 0.0);
  }
  std::fclose(f);
  const std::string mem = out_dir + "/select_memory.csv";
  FILE* m = std::fopen(mem.c_str(), "w");
  if (m == nullptr) {
    std::perror(mem.c_str());
    return 1;
  }
  std::fprintf(m, "metric,value\n");
  Memory(m);
  std::fclose(m);
  std::printf("wrote %s and %s\n", csv.c_str(), mem.c_str());
  return 0;
}
