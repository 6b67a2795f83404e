#include "bench/select/rep_scenario.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/quality/long_context.h"
#include "bench/quality/long_inputs.h"

namespace kvtier::bench {
namespace {

using quality::LongContext;
using quality::LongContextOptions;

constexpr int32_t kT = 16;       // tokens per block
constexpr int32_t kSteps = 32;   // consecutive decode steps
constexpr int64_t kRecent = 32;  // last blocks, always read
constexpr double kStrong = 0.05;
constexpr double kFractions[] = {0.01, 0.02, 0.05, 0.10};
constexpr int kNumFractions = 4;

enum Rep { kMean, kHalves, kTop, kMeanTop, kHalvesTop, kQuest, kShipped, kCh16, kCh32, kNumReps };
const char* const kRepNames[kNumReps] = {"mean",     "halves",     "top",
                                         "mean|top", "halves|top", "quest",
                                         "shipped",  "channels16", "channels32"};

// Bytes per block and head of a representative at int8 (dim D).
int64_t RepBytes(int rep, int64_t D) {
  switch (rep) {
    case kMean:
    case kTop:
      return D;
    case kHalves:
    case kMeanTop:
    case kQuest:
      return 2 * D;
    case kHalvesTop:
      return 3 * D;
    case kShipped:
      return 4 * D;
    case kCh16:
      return kT * 16;
    default:
      return kT * 32;
  }
}

float Dot(const float* a, const float* b, int32_t D) {
  float s = 0;
  for (int32_t d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

double LogAddExp(double a, double b) {
  if (a == -INFINITY) return b;
  if (b == -INFINITY) return a;
  const double hi = std::max(a, b);
  return hi + std::log1p(std::exp(std::min(a, b) - hi));
}

// One key slot's keys and per-block summaries (float).
struct Slot {
  std::vector<float> keys;                       // [tokens][D]
  std::vector<float> mean, h1, h2, top, mx, mn;  // [blocks][D]
  std::vector<double> abs_mean;                  // [D]: mean |k_d|
};

Slot Summarise(const LongContext& lc, int32_t layer, int64_t blocks) {
  const int32_t D = lc.dim();
  Slot s;
  s.keys.resize(static_cast<size_t>(blocks) * kT * D);
  lc.Keys(layer, 0, 0, blocks * kT, s.keys.data());
  for (auto* v : {&s.mean, &s.h1, &s.h2, &s.top, &s.mx, &s.mn}) {
    v->assign(static_cast<size_t>(blocks) * D, 0.0f);
  }
  s.abs_mean.assign(D, 0.0);
  for (int64_t b = 0; b < blocks; ++b) {
    float* mean = &s.mean[b * D];
    float* mx = &s.mx[b * D];
    float* mn = &s.mn[b * D];
    float best_norm = -1;
    for (int32_t t = 0; t < kT; ++t) {
      const float* k = &s.keys[(b * kT + t) * D];
      float* half = t < kT / 2 ? &s.h1[b * D] : &s.h2[b * D];
      for (int32_t d = 0; d < D; ++d) {
        mean[d] += k[d] / kT;
        half[d] += k[d] * (2.0f / kT);
        mx[d] = t == 0 ? k[d] : std::max(mx[d], k[d]);
        mn[d] = t == 0 ? k[d] : std::min(mn[d], k[d]);
        s.abs_mean[d] += std::fabs(k[d]);
      }
      const float norm = Dot(k, k, D);
      if (norm > best_norm) {
        best_norm = norm;
        std::copy(k, k + D, &s.top[b * D]);
      }
    }
  }
  for (double& a : s.abs_mean) a /= static_cast<double>(blocks) * kT;
  return s;
}

struct Tally {
  int64_t target_hits[kNumReps][kNumFractions] = {};
  int64_t strong_hits[kNumReps][kNumFractions] = {};
  double mass[kNumReps][kNumFractions] = {};
  int64_t targets = 0, strong = 0, head_steps = 0;
};

// The channels of a head ranked by mean |q_d| x mean |k_d|, best first.
std::vector<int32_t> RankChannels(const std::vector<std::vector<float>>& queries,
                                  const Slot& slot) {
  const size_t D = slot.abs_mean.size();
  std::vector<double> w(D, 0.0);
  for (const auto& q : queries) {
    for (size_t d = 0; d < D; ++d) w[d] += std::fabs(q[d]) * slot.abs_mean[d];
  }
  std::vector<int32_t> order(D);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return w[a] > w[b]; });
  return order;
}

// Log-sum-exp over block b's tokens of scale * q.k on `channels` (all
// when empty).
double BlockLse(const Slot& s, int64_t b, const float* q, int32_t D, double scale,
                const std::vector<int32_t>& channels) {
  double lse = -INFINITY;
  for (int32_t t = 0; t < kT; ++t) {
    const float* k = &s.keys[(b * kT + t) * D];
    float dot = 0;
    if (channels.empty()) {
      dot = Dot(q, k, D);
    } else {
      for (int32_t d : channels) dot += q[d] * k[d];
    }
    lse = LogAddExp(lse, scale * dot);
  }
  return lse;
}

// Every representative's score of block b for query q.
void Scores(const Slot& s, int64_t b, const float* q, int32_t D, double scale,
            const std::vector<int32_t>& ch16, const std::vector<int32_t>& ch32,
            double out[kNumReps]) {
  const double log_t = std::log(double{kT});
  const double m = scale * Dot(q, &s.mean[b * D], D);
  const double halves = LogAddExp(std::log(kT / 2.0) + scale * Dot(q, &s.h1[b * D], D),
                                  std::log(kT / 2.0) + scale * Dot(q, &s.h2[b * D], D));
  const double top = scale * Dot(q, &s.top[b * D], D);
  double u = 0;
  for (int32_t d = 0; d < D; ++d) u += std::max(q[d] * s.mx[b * D + d], q[d] * s.mn[b * D + d]);
  u *= scale;
  out[kMean] = log_t + m;
  out[kHalves] = halves;
  out[kTop] = top;
  out[kMeanTop] = std::max(log_t + m, top);
  out[kHalvesTop] = std::max(halves, top);
  out[kQuest] = log_t + u;
  out[kShipped] = std::max(log_t + m + 0.25 * (u - m), top);
  out[kCh16] = BlockLse(s, b, q, D, scale, ch16);
  out[kCh32] = BlockLse(s, b, q, D, scale, ch32);
}

void RunCase(const std::vector<const quality::KvDump*>& dumps, const index::SelectionCalibration& c,
             int64_t tokens, Tally* tally) {
  LongContextOptions lo;
  lo.tokens = tokens;
  lo.pair_heads = true;
  lo.query_stride = 1;
  lo.query_steps = kSteps;
  absl::StatusOr<LongContext> lc = LongContext::Build(dumps, lo);
  if (!lc.ok()) {
    std::fprintf(stderr, "reps: %s\n", lc.status().ToString().c_str());
    std::abort();
  }
  const int32_t D = lc->dim();
  const int64_t blocks = lc->QueryPosition(kSteps - 1) / kT;
  const double scale = c.softmax_scale;
  const double h = c.head_min_mass;
  std::vector<Slot> slots(lc->num_layers());
  std::vector<bool> have(lc->num_layers(), false);
  for (const auto& head : c.retrieval_heads) {
    if (!have[head.layer]) slots[head.layer] = Summarise(*lc, head.layer, blocks);
    have[head.layer] = true;
  }
  std::vector<double> share(blocks), score(blocks * kNumReps);
  std::vector<int64_t> order;
  for (const auto& head : c.retrieval_heads) {
    const Slot& slot = slots[head.layer];
    std::vector<std::vector<float>> queries(kSteps, std::vector<float>(D));
    for (int32_t s = 0; s < kSteps; ++s) lc->Query(s, head.layer, head.q_head, queries[s].data());
    const std::vector<int32_t> ranked = RankChannels(queries, slot);
    const std::vector<int32_t> ch16(ranked.begin(), ranked.begin() + std::min(16, D));
    const std::vector<int32_t> ch32(ranked.begin(), ranked.begin() + std::min(32, D));
    for (int32_t s = 0; s < kSteps; ++s) {
      const float* q = queries[s].data();
      const int64_t n = lc->QueryPosition(s) / kT;
      double lz = -INFINITY;
      for (int64_t b = 0; b < n; ++b) {
        share[b] = BlockLse(slot, b, q, D, scale, {});
        lz = LogAddExp(lz, share[b]);
      }
      double outside = 0;
      const int64_t last = n - kRecent;
      for (int64_t b = 0; b < n; ++b) {
        share[b] = std::exp(share[b] - lz);
        if (b >= 1 && b < last) outside += share[b];
      }
      for (int64_t b = 1; b < last; ++b) {
        Scores(slot, b, q, D, scale, ch16, ch32, &score[b * kNumReps]);
        tally->targets += share[b] >= h;
        tally->strong += share[b] >= kStrong;
      }
      ++tally->head_steps;
      for (int rep = 0; rep < kNumReps; ++rep) {
        order.resize(last - 1);
        std::iota(order.begin(), order.end(), int64_t{1});
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
          return score[a * kNumReps + rep] > score[b * kNumReps + rep];
        });
        for (int f = 0; f < kNumFractions; ++f) {
          const int64_t k = std::min<int64_t>(
              static_cast<int64_t>(order.size()),
              static_cast<int64_t>(std::ceil(kFractions[f] * static_cast<double>(n))));
          double held = 0;
          for (int64_t i = 0; i < k; ++i) {
            const double p = share[order[i]];
            held += p;
            tally->target_hits[rep][f] += p >= h;
            tally->strong_hits[rep][f] += p >= kStrong;
          }
          tally->mass[rep][f] += outside > 0 ? held / outside : 1.0;
        }
      }
    }
  }
}

}  // namespace

bool RunRepScenario(const LongScenarioOptions& o, const std::string& out_dir) {
  std::vector<quality::KvDump> dumps;
  index::SelectionCalibration copy;
  if (!LoadLongInputs(o, &dumps, &copy)) return false;
  std::vector<const quality::KvDump*> ptrs;
  ptrs.reserve(dumps.size());
  for (const auto& d : dumps) ptrs.push_back(&d);
  const index::SelectionCalibration c = quality::PairedCalibration(copy);
  FILE* md = std::fopen((out_dir + "/select_reps.md").c_str(), "w");
  FILE* csv = std::fopen((out_dir + "/select_reps.csv").c_str(), "w");
  if (md == nullptr || csv == nullptr) {
    std::perror(out_dir.c_str());
    return false;
  }
  std::fprintf(csv,
               "tokens,representative,bytes_per_block,key_share,top_fraction,target_recall,"
               "strong_recall,mass_recall\n");
  std::fprintf(md,
               "| tokens | representative | bytes/block (of 2,048) | targets at 1%% / 2%% / 5%% / "
               "10%% | strong (>= 5%%) at 1%% / 2%% / 5%% / 10%% | mass at 1%% / 2%% / 5%% / 10%% "
               "|\n|---|---|---:|---|---|---|\n");
  std::vector<int64_t> cases = {16384, 131072};
  if (o.quick) cases = {131072};
  for (int64_t tokens : cases) {
    Tally t;
    RunCase(ptrs, c, tokens, &t);
    std::printf("reps: %lld tokens, %lld head-steps, %lld targets, %lld strong blocks\n",
                static_cast<long long>(tokens), static_cast<long long>(t.head_steps),
                static_cast<long long>(t.targets), static_cast<long long>(t.strong));
    const int64_t D = 128;
    for (int rep = 0; rep < kNumReps; ++rep) {
      std::string cells[3];
      for (int f = 0; f < kNumFractions; ++f) {
        const double tr = t.targets > 0 ? double(t.target_hits[rep][f]) / t.targets : 1.0;
        const double sr = t.strong > 0 ? double(t.strong_hits[rep][f]) / t.strong : 1.0;
        const double mr = t.mass[rep][f] / static_cast<double>(t.head_steps);
        char buf[3][32];
        std::snprintf(buf[0], sizeof buf[0], "%s%.3f", f ? " / " : "", tr);
        std::snprintf(buf[1], sizeof buf[1], "%s%.3f", f ? " / " : "", sr);
        std::snprintf(buf[2], sizeof buf[2], "%s%.3f", f ? " / " : "", mr);
        for (int i = 0; i < 3; ++i) cells[i] += buf[i];
        std::fprintf(csv, "%lld,%s,%lld,%.4f,%.2f,%.4f,%.4f,%.4f\n", static_cast<long long>(tokens),
                     kRepNames[rep], static_cast<long long>(RepBytes(rep, D)),
                     static_cast<double>(RepBytes(rep, D)) / (kT * D), kFractions[f], tr, sr, mr);
      }
      std::printf("  %-11s %4lld B  targets %s  strong %s  mass %s\n", kRepNames[rep],
                  static_cast<long long>(RepBytes(rep, D)), cells[0].c_str(), cells[1].c_str(),
                  cells[2].c_str());
      std::fprintf(md, "| %lldK | %s | %lld | %s | %s | %s |\n",
                   static_cast<long long>(tokens / 1024), kRepNames[rep],
                   static_cast<long long>(RepBytes(rep, D)), cells[0].c_str(), cells[1].c_str(),
                   cells[2].c_str());
    }
  }
  std::fclose(md);
  std::fclose(csv);
  std::printf("wrote %s/select_reps.csv and select_reps.md\n", out_dir.c_str());
  return true;
}

}  // namespace kvtier::bench
