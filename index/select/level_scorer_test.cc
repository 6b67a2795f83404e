// The mirrored level scorer and the Selector's use of it, on the host
// backend (bitwise the CPU pass's kernel), so the mirroring is checked
// without a GPU: incremental appends, growth, new segments, several dims in
// one batch, errors, contexts shared by several scorers. The CUDA backend
// runs the same checks against the CPU in tests/gpu/select_conformance_test.cc.
#include "index/select/level_scorer.h"

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "index/kernels/simd.h"
#include "index/kernels/unit_vector.h"
#include "index/select/gpu_scoring.h"
#include "index/select/selector.h"
#include "tests/testutil/status_matchers.h"

using ::kvtier::testing::StatusIs;

namespace kvtier::index {
namespace {

std::vector<float> RandomRows(int64_t n, int32_t dim, std::mt19937* rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n) * dim);
  for (float& x : v) x = dist(*rng);
  return v;
}

std::unique_ptr<ContextIndex> MakeContext(int32_t dim, int64_t pages, std::mt19937* rng,
                                          int32_t pages_per_chunk = 4,
                                          int32_t chunks_per_grid = 4) {
  TreeOptions o;
  o.dim = dim;
  o.pages_per_chunk = pages_per_chunk;
  o.chunks_per_grid = chunks_per_grid;
  auto ctx = ContextIndex::Create(o);
  EXPECT_OK(ctx);
  EXPECT_OK((*ctx)->tree().AddSegment(RandomRows(pages, dim, rng)));
  return std::move(*ctx);
}

// What the CPU pass computes: dots of the unit anchor with every level.
std::vector<float> CpuLevels(const ContextTree& t, const std::vector<float>& unit) {
  std::vector<float> out(t.num_grids() + t.num_chunks() + t.num_pages());
  const size_t D = t.dim();
  simd::DotRowsHalf(t.grid_rows(), t.num_grids(), D, unit.data(), out.data());
  simd::DotRowsHalf(t.chunk_rows(), t.num_chunks(), D, unit.data(), out.data() + t.num_grids());
  simd::DotRowsHalf(t.page_rows(), t.num_pages(), D, unit.data(),
                    out.data() + t.num_grids() + t.num_chunks());
  return out;
}

std::vector<float> Unit(const std::vector<float>& v) {
  std::vector<float> u(v.size());
  UnitVector(v.data(), v.size(), u.data());
  return u;
}

// Wraps the host backend: counts the rows written and fails on request.
class CountingBackend final : public RowBackend {
 public:
  struct Shared {
    int64_t rows_written = 0;
    int64_t tables_made = 0;
    bool fail_next_score = false;
    bool fail_next_write = false;
  };
  explicit CountingBackend(Shared* shared) : host_(NewHostRowBackend()), shared_(shared) {}
  uint64_t family() const override { return host_->family(); }
  std::string name() const override { return "counting"; }
  absl::StatusOr<std::unique_ptr<Table>> NewTable(int32_t dim, int64_t capacity) override {
    ++shared_->tables_made;
    return host_->NewTable(dim, capacity);
  }
  absl::Status QueueWrite(Table* table, int64_t first, const uint16_t* rows,
                          int64_t count) override {
    if (shared_->fail_next_write) {
      shared_->fail_next_write = false;
      return absl::InternalError("injected write failure");
    }
    shared_->rows_written += count;
    return host_->QueueWrite(table, first, rows, count);
  }
  absl::Status Score(absl::Span<const float> anchors, int32_t dim,
                     absl::Span<const Segment> segments, float* out) override {
    if (shared_->fail_next_score) {
      shared_->fail_next_score = false;
      // A failed device run may leave its tables half written.
      return absl::InternalError("injected scoring failure");
    }
    return host_->Score(anchors, dim, segments, out);
  }
  void DiscardQueued() override { host_->DiscardQueued(); }

 private:
  std::unique_ptr<RowBackend> host_;
  Shared* shared_;
};

std::unique_ptr<Selector> MakeSelector(const SelectorOptions& o) {
  auto s = Selector::Create(o);
  EXPECT_OK(s) << s.status();
  return std::move(*s);
}

class LevelScorerTest : public ::testing::Test {
 protected:
  // Scores every context (anchor i for context i) and checks the result
  // against the CPU pass bitwise.
  void ExpectMatchesCpu(LevelScorer* scorer, const std::vector<ContextIndex*>& contexts,
                        const std::vector<std::vector<float>>& anchors) {
    std::vector<LevelJob> jobs;
    std::vector<float> want;
    for (size_t i = 0; i < contexts.size(); ++i) {
      jobs.push_back({contexts[i], anchors[i].data()});
      const std::vector<float> one = CpuLevels(contexts[i]->tree(), anchors[i]);
      want.insert(want.end(), one.begin(), one.end());
    }
    std::vector<float> got(want.size(), -7.0f);
    ASSERT_OK(scorer->ScoreLevels(jobs, got.data()));
    ASSERT_EQ(got, want);
  }
};

TEST_F(LevelScorerTest, MirrorFollowsAppendsSegmentsAndGrowth) {
  std::mt19937 rng(1);
  // Two dims in one batch, contexts from one page to past several growths.
  std::vector<std::unique_ptr<ContextIndex>> owned;
  owned.push_back(MakeContext(64, 1, &rng));
  owned.push_back(MakeContext(128, 30, &rng));
  owned.push_back(MakeContext(64, 200, &rng, 16, 16));
  owned.push_back(MakeContext(128, 5, &rng, 3, 2));
  std::vector<ContextIndex*> contexts;
  std::vector<std::vector<float>> anchors;
  for (auto& c : owned) {
    contexts.push_back(c.get());
    anchors.push_back(Unit(RandomRows(1, c->tree().dim(), &rng)));
  }
  CountingBackend::Shared shared;
  auto scorer = NewMirroredLevelScorer(std::make_unique<CountingBackend>(&shared));
  std::uniform_int_distribution<int> appends(0, 5);
  for (int step = 0; step < 60; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    ExpectMatchesCpu(scorer.get(), contexts, anchors);
    if (HasFatalFailure()) return;
    for (size_t i = 0; i < owned.size(); ++i) {
      const int32_t dim = owned[i]->tree().dim();
      for (int a = appends(rng); a > 0; --a) {
        ASSERT_OK(owned[i]->tree().Append(RandomRows(1, dim, &rng)));
      }
      if (step % 17 == 5) {  // a new document
        ASSERT_OK(owned[i]->tree().AddSegment(RandomRows(7, dim, &rng)));
      }
    }
  }
  // Incremental: far fewer rows were sent than 60 full uploads would send.
  int64_t total_rows = 0;
  for (auto& c : owned) {
    total_rows += c->tree().num_grids() + c->tree().num_chunks() + c->tree().num_pages();
  }
  EXPECT_LT(shared.rows_written, 8 * total_rows);
  EXPECT_LT(shared.tables_made, 60);
}

TEST_F(LevelScorerTest, FailuresMarkTheCopiesStaleAndResendInFull) {
  std::mt19937 rng(2);
  auto ctx = MakeContext(32, 100, &rng);
  const std::vector<float> anchor = Unit(RandomRows(1, 32, &rng));
  CountingBackend::Shared shared;
  auto scorer = NewMirroredLevelScorer(std::make_unique<CountingBackend>(&shared));
  ExpectMatchesCpu(scorer.get(), {ctx.get()}, {anchor});
  const ContextTree& t = ctx->tree();
  const int64_t all_rows = t.num_grids() + t.num_chunks() + t.num_pages();
  EXPECT_EQ(shared.rows_written, all_rows);

  ASSERT_OK(ctx->tree().Append(RandomRows(1, 32, &rng)));
  shared.fail_next_score = true;
  std::vector<float> out(all_rows + 3);
  const LevelJob job{ctx.get(), anchor.data()};
  absl::Status status = scorer->ScoreLevels({&job, 1}, out.data());
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInternal));
  EXPECT_NE(status.message().find("injected"), std::string::npos) << status;
  shared.rows_written = 0;
  ExpectMatchesCpu(scorer.get(), {ctx.get()}, {anchor});
  EXPECT_EQ(shared.rows_written, t.num_grids() + t.num_chunks() + t.num_pages())
      << "after a failure every row is sent again";

  ASSERT_OK(ctx->tree().Append(RandomRows(1, 32, &rng)));
  shared.fail_next_write = true;
  EXPECT_FALSE(scorer->ScoreLevels({&job, 1}, out.data()).ok());
  ExpectMatchesCpu(scorer.get(), {ctx.get()}, {anchor});
}

TEST_F(LevelScorerTest, ContextSharedByTwoScorersStaysInSync) {
  std::mt19937 rng(3);
  auto ctx = MakeContext(16, 50, &rng);
  const std::vector<float> anchor = Unit(RandomRows(1, 16, &rng));
  auto a = NewMirroredLevelScorer(NewHostRowBackend());
  auto b = NewMirroredLevelScorer(NewHostRowBackend());
  for (int step = 0; step < 20; ++step) {
    ExpectMatchesCpu(step % 2 == 0 ? a.get() : b.get(), {ctx.get()}, {anchor});
    for (int i = 0; i < step % 4; ++i) ASSERT_OK(ctx->tree().Append(RandomRows(1, 16, &rng)));
  }
}

// Three copies of the same contexts, selected by the CPU descent, the CPU
// one-pass algorithm and a Selector scoring on the host backend: the same
// blocks, scores and prefetch at every step, while blocks are appended.
TEST(SelectorLevelScorerTest, SelectsWhatTheCpuSelects) {
  constexpr int kContexts = 5;
  std::vector<std::unique_ptr<ContextIndex>> sets[3];
  for (auto& set : sets) {
    std::mt19937 rng(4);  // same seed: identical contexts
    for (int i = 0; i < kContexts; ++i) set.push_back(MakeContext(64, 40 + 90 * i, &rng, 8, 4));
  }
  SelectorOptions descent;
  descent.grid_keep_fraction = 0.5;
  descent.chunk_keep_fraction = 0.5;
  descent.page_keep_fraction = 0.25;
  SelectorOptions gemm = descent;
  gemm.algorithm = SelectAlgorithm::kGemm;
  SelectorOptions device = descent;
  int64_t made = 0;
  device.level_scorer = [&made]() -> absl::StatusOr<std::unique_ptr<LevelScorer>> {
    ++made;
    return NewMirroredLevelScorer(NewHostRowBackend());
  };
  std::unique_ptr<Selector> selectors[3] = {MakeSelector(descent), MakeSelector(gemm),
                                            MakeSelector(device)};
  EXPECT_EQ(made, 1);
  ASSERT_NE(selectors[2]->level_scorer(), nullptr);
  EXPECT_EQ(selectors[2]->level_scorer()->name(), "host");

  std::mt19937 rng(5);
  for (int step = 0; step < 25; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const std::vector<float> anchor = RandomRows(1, 64, &rng);
    const std::vector<float> appended = RandomRows(kContexts, 64, &rng);
    std::vector<SelectResult> results[3];
    for (int k = 0; k < 3; ++k) {
      std::vector<SelectRequest> requests;
      for (int i = 0; i < kContexts; ++i) {
        SelectRequest r;
        r.context = sets[k][i].get();
        r.anchor = anchor;
        // Context 1 is ranked by recency: a batch mixes both kinds.
        r.scorer = i == 1 ? ScorerKind::kRecency : ScorerKind::kKeyKey;
        r.budget_blocks = 6 + i;
        r.step = step;
        requests.push_back(r);
      }
      results[k].resize(requests.size());
      ASSERT_OK(selectors[k]->SelectBatch(requests, absl::MakeSpan(results[k])));
      for (int i = 0; i < kContexts; ++i) {
        ASSERT_OK(sets[k][i]->tree().Append(absl::MakeConstSpan(appended).subspan(i * 64, 64)));
      }
    }
    for (int i = 0; i < kContexts; ++i) {
      for (int k = 1; k < 3; ++k) {
        EXPECT_EQ(results[k][i].blocks, results[0][i].blocks) << "context " << i << " k " << k;
        EXPECT_EQ(results[k][i].scores, results[0][i].scores) << "context " << i;
        EXPECT_EQ(results[k][i].prefetch, results[0][i].prefetch) << "context " << i;
        EXPECT_EQ(results[k][i].candidates, results[0][i].candidates) << "context " << i;
      }
      EXPECT_EQ(results[2][i].rows_scored, results[1][i].rows_scored) << "context " << i;
    }
  }
  EXPECT_EQ(selectors[2]->level_scorer_batches(), 25);
  EXPECT_OK(selectors[2]->last_level_scorer_status());
}

TEST(SelectorLevelScorerTest, FailureFallsBackToTheCpuAndIsReported) {
  std::mt19937 rng(6);
  auto a = MakeContext(32, 300, &rng);
  std::mt19937 rng2(6);
  auto b = MakeContext(32, 300, &rng2);
  CountingBackend::Shared shared;
  SelectorOptions device;
  device.level_scorer = [&shared]() -> absl::StatusOr<std::unique_ptr<LevelScorer>> {
    return NewMirroredLevelScorer(std::make_unique<CountingBackend>(&shared));
  };
  auto cpu = MakeSelector(SelectorOptions());
  auto dev = MakeSelector(device);
  const std::vector<float> anchor = RandomRows(1, 32, &rng);
  for (int step = 0; step < 4; ++step) {
    shared.fail_next_score = step == 1;
    SelectRequest r;
    r.anchor = anchor;
    r.budget_blocks = 20;
    r.step = step;
    SelectResult want, got;
    r.context = a.get();
    ASSERT_OK(cpu->Select(r, &want));
    r.context = b.get();
    ASSERT_OK(dev->Select(r, &got)) << "a scorer failure never fails Select";
    EXPECT_EQ(got.blocks, want.blocks);
    EXPECT_EQ(got.scores, want.scores);
    EXPECT_EQ(dev->last_level_scorer_status().ok(), step != 1);
  }
  EXPECT_EQ(dev->level_scorer_batches(), 3);
}

TEST(SelectorLevelScorerTest, FactoryErrorsAndSmallBatchesStayOnTheCpu) {
  SelectorOptions o;
  o.level_scorer = []() -> absl::StatusOr<std::unique_ptr<LevelScorer>> {
    return absl::UnavailableError("no device here");
  };
  auto selector = MakeSelector(o);
  EXPECT_EQ(selector->level_scorer(), nullptr);
  EXPECT_THAT(selector->level_scorer_create_status(), StatusIs(absl::StatusCode::kUnavailable));

  std::mt19937 rng(7);
  auto ctx = MakeContext(16, 100, &rng);
  SelectorOptions small;
  small.level_scorer = []() -> absl::StatusOr<std::unique_ptr<LevelScorer>> {
    return NewMirroredLevelScorer(NewHostRowBackend());
  };
  small.level_scorer_min_rows = 1000;  // the context stacks ~100 + 25 + 7 rows
  auto gated = MakeSelector(small);
  SelectRequest r;
  r.context = ctx.get();
  const std::vector<float> anchor = RandomRows(1, 16, &rng);
  r.anchor = anchor;
  r.budget_blocks = 10;
  SelectResult out;
  ASSERT_OK(gated->Select(r, &out));
  EXPECT_EQ(gated->level_scorer_batches(), 0);
  EXPECT_EQ(ctx->attachment(), nullptr) << "nothing was mirrored";

  small.level_scorer_min_rows = -1;
  EXPECT_FALSE(Selector::Create(small).ok());
}

TEST(GpuScoringTest, WithoutADeviceTheCudaScorerIsUnavailable) {
  absl::StatusOr<std::unique_ptr<LevelScorer>> scorer = NewCudaLevelScorer(0);
  if (scorer.ok()) GTEST_SKIP() << "a CUDA device is present (tests/gpu covers it)";
  EXPECT_THAT(scorer.status(), StatusIs(absl::StatusCode::kUnavailable)) << scorer.status();
}

}  // namespace
}  // namespace kvtier::index
