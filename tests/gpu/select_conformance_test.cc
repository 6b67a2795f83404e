// GPU scoring in Select against the CPU, on the same contexts and anchors:
// the CUDA level scorer (index/select/gpu_scoring.h) inside a Selector, and the
// Selector's own CPU passes (descent and one-pass). The Cuda instances skip
// without a device; the Host instances (the host row backend, bitwise the
// CPU's kernel) run everywhere and check the tests' own logic.
//
//   exact inputs   page vectors of sixteen +-1 entries (unit vectors of
//                  +-0.25), full chunks and grids, anchors of the same
//                  kind: every dot product is exact in fp32 whatever the
//                  summation order, so GPU and CPU selections must agree
//                  bit for bit (blocks, scores, prefetch), ties included,
//                  at every step while blocks are appended.
//   random inputs  the scores of every level within 1e-5 of the CPU's
//                  (partial chunks, several dims, appends and growth).
//   timing         a batch of 64 contexts x 4,096 blocks and one context of
//                  65,536 blocks, GPU against CPU, printed as RESULT lines
//                  (tests/gpu/run.sh collects them).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "index/kernels/simd.h"
#include "index/kernels/unit_vector.h"
#include "index/select/gpu_scoring.h"
#include "index/select/selector.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::index {
namespace {

constexpr int32_t kDim = 128;
constexpr int32_t kPagesPerChunk = 8;
constexpr int32_t kChunksPerGrid = 4;
constexpr int64_t kGridPages = kPagesPerChunk * kChunksPerGrid;

// The level scorers under test: the CUDA one, and the host one (bitwise
// the CPU's kernel), which checks these tests' own logic on any machine.
struct Backend {
  std::string name;
  std::function<absl::StatusOr<std::unique_ptr<LevelScorer>>()> make;
};

void PrintTo(const Backend& backend, std::ostream* os) { *os << backend.name; }

class SelectConformanceTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<LevelScorer>> probe = GetParam().make();
    if (!probe.ok()) GTEST_SKIP() << probe.status().message();
  }
  bool is_cuda() const { return GetParam().name == "Cuda"; }
  std::unique_ptr<LevelScorer> NewScorer() { return std::move(*GetParam().make()); }

  std::unique_ptr<Selector> MakeSelector(SelectorOptions o, bool offload) {
    if (offload) o.level_scorer = GetParam().make;
    auto s = Selector::Create(o);
    EXPECT_OK(s) << s.status();
    if (offload) {
      EXPECT_NE((*s)->level_scorer(), nullptr) << (*s)->level_scorer_create_status();
    }
    return std::move(*s);
  }
};

// n vectors of sixteen +-1 entries at random places (unit length 4).
std::vector<float> SignVectors(int64_t n, std::mt19937* rng) {
  std::vector<float> v(static_cast<size_t>(n) * kDim, 0.0f);
  std::uniform_int_distribution<int> place(0, kDim - 1), sign(0, 1);
  for (int64_t i = 0; i < n; ++i) {
    int placed = 0;
    while (placed < 16) {
      float& x = v[i * kDim + place(*rng)];
      if (x != 0.0f) continue;
      x = sign(*rng) ? 1.0f : -1.0f;
      ++placed;
    }
  }
  return v;
}

std::vector<float> NormalVectors(int64_t n, int32_t dim, std::mt19937* rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n) * dim);
  for (float& x : v) x = dist(*rng);
  return v;
}

std::unique_ptr<ContextIndex> MakeContext(const std::vector<float>& vectors, int32_t dim) {
  TreeOptions o;
  o.dim = dim;
  o.pages_per_chunk = kPagesPerChunk;
  o.chunks_per_grid = kChunksPerGrid;
  auto ctx = ContextIndex::Create(o);
  EXPECT_OK(ctx);
  EXPECT_OK((*ctx)->tree().AddSegment(vectors));
  return std::move(*ctx);
}

SelectorOptions Masks() {
  SelectorOptions o;
  o.grid_keep_fraction = 0.5;
  o.chunk_keep_fraction = 0.5;
  o.page_keep_fraction = 0.5;
  return o;
}

TEST_P(SelectConformanceTest, ExactInputsSelectIdenticallyWhileBlocksAreAppended) {
  constexpr int kContexts = 64;
  // Two identical sets of contexts (same seed), one per Selector: each
  // Select moves its contexts' stability windows.
  std::vector<std::unique_ptr<ContextIndex>> sets[2];
  for (auto& set : sets) {
    std::mt19937 rng(11);
    for (int i = 0; i < kContexts; ++i) {
      set.push_back(MakeContext(SignVectors(kGridPages * (1 + i % 9), &rng), kDim));
    }
    set.push_back(MakeContext(SignVectors(8192, &rng), kDim));  // one larger context
  }
  auto cpu = MakeSelector(Masks(), false);
  auto gpu = MakeSelector(Masks(), true);
  std::mt19937 rng(12);
  for (int step = 0; step < 12; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const std::vector<float> anchors = SignVectors(kContexts + 1, &rng);
    const std::vector<float> appended = SignVectors(kGridPages, &rng);
    std::vector<SelectResult> results[2];
    for (int k = 0; k < 2; ++k) {
      std::vector<SelectRequest> requests;
      for (size_t i = 0; i < sets[k].size(); ++i) {
        SelectRequest r;
        r.context = sets[k][i].get();
        r.anchor = absl::MakeConstSpan(anchors).subspan(i * kDim, kDim);
        r.budget_blocks = 5 + static_cast<int64_t>(i % 7) * 3;
        r.step = step;
        requests.push_back(r);
      }
      results[k].resize(requests.size());
      ASSERT_OK((k == 0 ? cpu : gpu)->SelectBatch(requests, absl::MakeSpan(results[k])));
      // A grid's worth of blocks to every third context, one at a time.
      for (size_t i = 0; i < sets[k].size(); i += 3) {
        for (int64_t p = 0; p < kGridPages; ++p) {
          ASSERT_OK(
              sets[k][i]->tree().Append(absl::MakeConstSpan(appended).subspan(p * kDim, kDim)));
        }
      }
    }
    ASSERT_OK(gpu->last_level_scorer_status()) << gpu->last_level_scorer_status();
    for (size_t i = 0; i < results[0].size(); ++i) {
      ASSERT_EQ(results[1][i].blocks, results[0][i].blocks) << "context " << i;
      ASSERT_EQ(results[1][i].scores, results[0][i].scores) << "context " << i;
      ASSERT_EQ(results[1][i].prefetch, results[0][i].prefetch) << "context " << i;
    }
  }
  EXPECT_EQ(gpu->level_scorer_batches(), 12);
}

TEST_P(SelectConformanceTest, LevelScoresMatchTheCpuWithinRounding) {
  std::unique_ptr<LevelScorer> scorer = NewScorer();
  std::mt19937 rng(13);
  std::vector<std::unique_ptr<ContextIndex>> contexts;
  for (int i = 0; i < 24; ++i) {
    const int32_t dim = i % 3 == 0 ? 64 : kDim;  // two dims in one batch
    contexts.push_back(MakeContext(NormalVectors(1 + 37 * i, dim, &rng), dim));
  }
  for (int step = 0; step < 10; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    std::vector<LevelJob> jobs;
    std::vector<std::vector<float>> anchors(contexts.size());
    std::vector<float> want;
    for (size_t i = 0; i < contexts.size(); ++i) {
      const ContextTree& t = contexts[i]->tree();
      const std::vector<float> raw = NormalVectors(1, t.dim(), &rng);
      anchors[i].resize(t.dim());
      UnitVector(raw.data(), raw.size(), anchors[i].data());
      jobs.push_back({contexts[i].get(), anchors[i].data()});
      std::vector<float> one(t.num_grids() + t.num_chunks() + t.num_pages());
      simd::DotRowsHalf(t.grid_rows(), t.num_grids(), t.dim(), anchors[i].data(), one.data());
      simd::DotRowsHalf(t.chunk_rows(), t.num_chunks(), t.dim(), anchors[i].data(),
                        one.data() + t.num_grids());
      simd::DotRowsHalf(t.page_rows(), t.num_pages(), t.dim(), anchors[i].data(),
                        one.data() + t.num_grids() + t.num_chunks());
      want.insert(want.end(), one.begin(), one.end());
    }
    std::vector<float> got(want.size());
    absl::Status status = scorer->ScoreLevels(jobs, got.data());
    ASSERT_OK(status) << status;
    int reported = 0;
    for (size_t r = 0; r < want.size(); ++r) {
      if (!(std::fabs(got[r] - want[r]) <= 1e-5f) && reported++ < 5) {
        ADD_FAILURE() << "row " << r << ": gpu " << got[r] << ", cpu " << want[r];
      }
    }
    // Partial chunks, appended one block at a time, and a new segment.
    for (size_t i = 0; i < contexts.size(); ++i) {
      const int32_t dim = contexts[i]->tree().dim();
      for (int a = 0; a < static_cast<int>(i % 5); ++a) {
        ASSERT_OK(contexts[i]->tree().Append(NormalVectors(1, dim, &rng)));
      }
      if (step == 4) {
        ASSERT_OK(contexts[i]->tree().AddSegment(NormalVectors(3, dim, &rng)));
      }
    }
  }
}

// Median microseconds of one SelectBatch over `requests`, after one
// warm-up batch; steps run first_step, first_step + 1, ...
double TimeBatch(Selector* selector, std::vector<SelectRequest> requests, int64_t first_step,
                 int reps) {
  std::vector<SelectResult> results(requests.size());
  std::vector<double> us;
  for (int rep = 0; rep <= reps; ++rep) {
    for (SelectRequest& r : requests) r.step = first_step + rep;
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_OK(selector->SelectBatch(requests, absl::MakeSpan(results)));
    const auto t1 = std::chrono::steady_clock::now();
    if (rep > 0) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

TEST_P(SelectConformanceTest, TimingOfBatchesOnTheGpuAndTheCpu) {
  if (!is_cuda()) GTEST_SKIP() << "timed on the GPU only";
  struct Case {
    const char* name;
    int contexts;
    int64_t pages;
  };
  constexpr int kReps = 20;
  for (const Case& c : {Case{"B64_N4096", 64, 4096}, Case{"B1_N65536", 1, 65536}}) {
    std::mt19937 rng(14);
    std::vector<std::unique_ptr<ContextIndex>> contexts;
    for (int i = 0; i < c.contexts; ++i) {
      contexts.push_back(MakeContext(SignVectors(c.pages, &rng), kDim));
    }
    const std::vector<float> anchors = SignVectors(c.contexts, &rng);
    std::vector<SelectRequest> requests;
    for (int i = 0; i < c.contexts; ++i) {
      SelectRequest r;
      r.context = contexts[i].get();
      r.anchor = absl::MakeConstSpan(anchors).subspan(i * kDim, kDim);
      r.budget_blocks = c.pages / 8;
      requests.push_back(r);
    }
    SelectorOptions gemm = Masks();
    gemm.algorithm = SelectAlgorithm::kGemm;
    auto descent_cpu = MakeSelector(Masks(), false);
    auto gemm_cpu = MakeSelector(gemm, false);
    auto gpu = MakeSelector(gemm, true);
    // The three share the contexts, one after another (steps keep rising).
    const double cpu_descent_us = TimeBatch(descent_cpu.get(), requests, 0, kReps);
    const double cpu_gemm_us = TimeBatch(gemm_cpu.get(), requests, 100, kReps);
    const double gpu_us = TimeBatch(gpu.get(), requests, 200, kReps);
    EXPECT_EQ(gpu->level_scorer_batches(), kReps + 1);
    std::printf("Select %s (budget 1/8): cpu descent %.1f us, cpu one-pass %.1f us, gpu %.1f us\n",
                c.name, cpu_descent_us, cpu_gemm_us, gpu_us);
    std::printf("RESULT select_cpu_descent_us_%s=%.1f\n", c.name, cpu_descent_us);
    std::printf("RESULT select_cpu_gemm_us_%s=%.1f\n", c.name, cpu_gemm_us);
    std::printf("RESULT select_gpu_us_%s=%.1f\n", c.name, gpu_us);
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, SelectConformanceTest,
    ::testing::Values(Backend{"Host",
                              []() -> absl::StatusOr<std::unique_ptr<LevelScorer>> {
                                return NewMirroredLevelScorer(NewHostRowBackend());
                              }},
                      Backend{"Cuda",
                              []() -> absl::StatusOr<std::unique_ptr<LevelScorer>> {
                                return NewCudaLevelScorer(0);
                              }}),
    [](const ::testing::TestParamInfo<Backend>& info) { return info.param.name; });

}  // namespace
}  // namespace kvtier::index
