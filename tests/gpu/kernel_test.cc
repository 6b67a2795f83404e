// Kernel results equal the CPU references (tests/gpu/kernel_reference.h)
// within fp tolerance; selections equal exactly. Skips without a device.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gpu/cuda/kernels.h"
#include "gtest/gtest.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/gpu/half.h"
#include "tests/gpu/kernel_reference.h"

namespace kvtier::gpu::testing {
namespace {

// Random values in [-2, 2) stored as `type`; returns the raw bytes.
std::vector<std::byte> RandomElements(ElementType type, int64_t count, std::mt19937* rng) {
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<std::byte> bytes(static_cast<size_t>(count) * ElementSizeBytes(type));
  for (int64_t i = 0; i < count; ++i) {
    const float x = dist(*rng);
    if (type == ElementType::kFp32) {
      std::memcpy(bytes.data() + i * 4, &x, 4);
    } else {
      const uint16_t h = type == ElementType::kFp16 ? FloatToHalf(x) : FloatToBf16(x);
      std::memcpy(bytes.data() + i * 2, &h, 2);
    }
  }
  return bytes;
}

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want, float tolerance,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float allowed = tolerance * std::max(1.0f, std::fabs(want[i]));
    if (!(std::fabs(got[i] - want[i]) <= allowed) && reported++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
    }
  }
}

const char* TypeName(ElementType type) {
  return type == ElementType::kFp16 ? "fp16" : type == ElementType::kBf16 ? "bf16" : "fp32";
}

class KernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KVTIER_SKIP_WITHOUT_DEVICE();
    KVTIER_ASSERT_CUDA(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  cudaStream_t stream_ = nullptr;
};

// ---- pooling ----------------------------------------------------------

struct PoolCase {
  KvBlockShape shape;
  bool all_outputs;
};

class PoolKeysTest : public KernelTest {
 protected:
  // Places num_blocks random blocks in an arena in reverse order with a gap
  // after each, pools them, and compares every output with the reference.
  void RunCase(const PoolCase& c, int num_blocks) {
    SCOPED_TRACE(std::string(TypeName(c.shape.dtype)) + " L=" + std::to_string(c.shape.num_layers) +
                 " H=" + std::to_string(c.shape.num_kv_heads) + " T=" +
                 std::to_string(c.shape.block_tokens) + " D=" + std::to_string(c.shape.head_dim));
    std::mt19937 rng(c.shape.head_dim * 31 + num_blocks);
    const KvBlockShape& s = c.shape;
    const uint64_t block_bytes = s.BlockBytes();
    const uint64_t slot_bytes = block_bytes + 256;
    std::vector<std::byte> arena(slot_bytes * num_blocks);
    std::vector<uint64_t> offsets(num_blocks);
    std::vector<std::vector<std::byte>> blocks;
    for (int b = 0; b < num_blocks; ++b) {
      blocks.push_back(RandomElements(s.dtype, s.BlockElements(), &rng));
      offsets[b] = (num_blocks - 1 - b) * slot_bytes;
      std::memcpy(arena.data() + offsets[b], blocks[b].data(), block_bytes);
    }
    std::vector<float> weights(static_cast<size_t>(s.num_layers) * s.num_kv_heads);
    std::uniform_real_distribution<float> wdist(0.1f, 3.0f);
    for (float& w : weights) w = wdist(rng);

    const size_t nd = static_cast<size_t>(num_blocks) * s.head_dim;
    const size_t nld = nd * s.num_layers;
    DeviceBuffer d_arena(arena.size()), d_offsets(offsets.size() * 8),
        d_weights(weights.size() * 4), d_mean(nd * 4), d_wmean(nd * 4), d_min(nd * 4),
        d_max(nd * 4), d_lmean(nld * 4), d_lmin(nld * 4), d_lmax(nld * 4), d_flags(num_blocks * 4);
    KVTIER_ASSERT_CUDA(d_arena.Upload(arena.data(), arena.size()));
    KVTIER_ASSERT_CUDA(d_offsets.Upload(offsets.data(), offsets.size() * 8));
    KVTIER_ASSERT_CUDA(d_weights.Upload(weights.data(), weights.size() * 4));

    PoolKeysParams p;
    p.shape = s;
    p.arena = d_arena.get<std::byte>();
    p.arena_bytes = arena.size();
    p.block_offsets = d_offsets.get<uint64_t>();
    p.num_blocks = num_blocks;
    p.mean = d_mean.get<float>();
    p.flags = d_flags.get<uint32_t>();
    if (c.all_outputs) {
      p.head_weights = d_weights.get<float>();
      p.weighted_mean = d_wmean.get<float>();
      p.min = d_min.get<float>();
      p.max = d_max.get<float>();
      p.layer_mean = d_lmean.get<float>();
      p.layer_min = d_lmin.get<float>();
      p.layer_max = d_lmax.get<float>();
    }
    GpuStatus status = PoolKeys(p, stream_);
    ASSERT_TRUE(status.ok()) << status.ToString();
    KVTIER_ASSERT_CUDA(cudaStreamSynchronize(stream_));

    std::vector<float> mean, wmean, mn, mx, lmean, lmin, lmax;
    std::vector<uint32_t> flags;
    KVTIER_ASSERT_CUDA(d_mean.Download(&mean, nd));
    KVTIER_ASSERT_CUDA(d_flags.Download(&flags, num_blocks));
    if (c.all_outputs) {
      KVTIER_ASSERT_CUDA(d_wmean.Download(&wmean, nd));
      KVTIER_ASSERT_CUDA(d_min.Download(&mn, nd));
      KVTIER_ASSERT_CUDA(d_max.Download(&mx, nd));
      KVTIER_ASSERT_CUDA(d_lmean.Download(&lmean, nld));
      KVTIER_ASSERT_CUDA(d_lmin.Download(&lmin, nld));
      KVTIER_ASSERT_CUDA(d_lmax.Download(&lmax, nld));
    }
    const int D = s.head_dim;
    const size_t LD = static_cast<size_t>(s.num_layers) * D;
    for (int b = 0; b < num_blocks; ++b) {
      EXPECT_EQ(flags[b], kPoolOk) << "block " << b;
      PoolReference ref = PoolKeysReference(s, blocks[b].data(), weights);
      auto part = [](const std::vector<float>& v, size_t from, size_t n) {
        return std::vector<float>(v.begin() + from, v.begin() + from + n);
      };
      const std::string tag = " of block " + std::to_string(b);
      ExpectNear(part(mean, b * D, D), ref.mean, 1e-5f, "mean" + tag);
      if (!c.all_outputs) continue;
      ExpectNear(part(wmean, b * D, D), ref.weighted_mean, 1e-5f, "weighted_mean" + tag);
      // Extremes are element values: exact.
      EXPECT_EQ(part(mn, b * D, D), ref.min) << "min" << tag;
      EXPECT_EQ(part(mx, b * D, D), ref.max) << "max" << tag;
      ExpectNear(part(lmean, b * LD, LD), ref.layer_mean, 1e-5f, "layer_mean" + tag);
      EXPECT_EQ(part(lmin, b * LD, LD), ref.layer_min) << "layer_min" << tag;
      EXPECT_EQ(part(lmax, b * LD, LD), ref.layer_max) << "layer_max" << tag;
    }
  }
};

TEST_F(PoolKeysTest, MatchesReferenceForEveryDtype) {
  for (ElementType type : {ElementType::kFp16, ElementType::kBf16, ElementType::kFp32}) {
    RunCase({KvBlockShape{3, 2, 16, 128, type}, /*all_outputs=*/true}, 7);
  }
}

TEST_F(PoolKeysTest, MatchesReferenceForOddShapes) {
  // D not a power of two (5 row groups of 80), fewer tokens than row groups,
  // one dim, and the widest head.
  RunCase({KvBlockShape{2, 3, 5, 80, ElementType::kFp16}, true}, 5);
  RunCase({KvBlockShape{4, 1, 3, 64, ElementType::kBf16}, true}, 3);
  RunCase({KvBlockShape{2, 2, 17, 1, ElementType::kFp32}, true}, 4);
  RunCase({KvBlockShape{1, 2, 4, 1024, ElementType::kFp16}, true}, 2);
}

TEST_F(PoolKeysTest, MeanOnlyMatchesReference) {
  RunCase({KvBlockShape{4, 8, 16, 128, ElementType::kFp16}, /*all_outputs=*/false}, 64);
}

TEST_F(PoolKeysTest, FlagsNonFiniteKeysAndBlocksOutsideTheArena) {
  const KvBlockShape s{2, 2, 4, 32, ElementType::kFp32};
  const uint64_t block_bytes = s.BlockBytes();
  std::vector<float> arena(2 * s.BlockElements(), 0.25f);
  arena[s.KeyIndex(1, 1, 3, 31)] = std::numeric_limits<float>::quiet_NaN();  // block 0
  // Blocks: 0 (NaN), 1 (fine), one past the end, one misaligned.
  const std::vector<uint64_t> offsets = {0, block_bytes, 2 * block_bytes - 4, 2};
  const int n = static_cast<int>(offsets.size());
  DeviceBuffer d_arena(arena.size() * 4), d_offsets(n * 8), d_mean(n * 32 * 4),
      d_lmean(n * 2 * 32 * 4), d_flags(n * 4);
  KVTIER_ASSERT_CUDA(d_arena.Upload(arena.data(), arena.size() * 4));
  KVTIER_ASSERT_CUDA(d_offsets.Upload(offsets.data(), n * 8));
  PoolKeysParams p;
  p.shape = s;
  p.arena = d_arena.get<std::byte>();
  p.arena_bytes = arena.size() * 4;
  p.block_offsets = d_offsets.get<uint64_t>();
  p.num_blocks = n;
  p.mean = d_mean.get<float>();
  p.layer_mean = d_lmean.get<float>();
  p.flags = d_flags.get<uint32_t>();
  ASSERT_TRUE(PoolKeys(p, stream_).ok());
  KVTIER_ASSERT_CUDA(cudaStreamSynchronize(stream_));
  std::vector<uint32_t> flags;
  std::vector<float> mean;
  KVTIER_ASSERT_CUDA(d_flags.Download(&flags, n));
  KVTIER_ASSERT_CUDA(d_mean.Download(&mean, n * 32));
  EXPECT_EQ(flags,
            (std::vector<uint32_t>{kPoolNonFinite, kPoolOk, kPoolBadOffset, kPoolBadOffset}));
  EXPECT_FLOAT_EQ(mean[32], 0.25f);
  EXPECT_TRUE(std::isnan(mean[2 * 32]));
  EXPECT_TRUE(std::isnan(mean[3 * 32 + 5]));
}

// ---- scoring ----------------------------------------------------------

struct ScoreCase {
  ElementType type;
  int64_t rows;
  int32_t dim;
  int64_t stride;
  int32_t anchors;
  ScoreKind kind;
};

class ScoreLevelsTest : public KernelTest {
 protected:
  void RunCase(const ScoreCase& c) {
    SCOPED_TRACE(std::string(TypeName(c.type)) + " N=" + std::to_string(c.rows) +
                 " D=" + std::to_string(c.dim) + " B=" + std::to_string(c.anchors) +
                 (c.kind == ScoreKind::kDot ? " dot" : " cosine"));
    std::mt19937 rng(static_cast<uint32_t>(c.rows * 7 + c.dim + c.anchors));
    auto levels = RandomElements(c.type, c.rows * c.stride, &rng);
    // Row 3 is all zeros: cosine must give 0.5, not NaN.
    const size_t elem = ElementSizeBytes(c.type);
    std::memset(levels.data() + 3 * c.stride * elem, 0, c.dim * elem);
    std::vector<float> anchors(static_cast<size_t>(c.anchors) * c.dim);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (float& x : anchors) x = dist(rng);

    DeviceBuffer d_levels(levels.size()), d_anchors(anchors.size() * 4),
        d_scores(static_cast<size_t>(c.anchors) * c.rows * 4);
    KVTIER_ASSERT_CUDA(d_levels.Upload(levels.data(), levels.size()));
    KVTIER_ASSERT_CUDA(d_anchors.Upload(anchors.data(), anchors.size() * 4));
    ScoreParams p;
    p.levels = d_levels.get();
    p.levels_type = c.type;
    p.num_rows = c.rows;
    p.row_stride = c.stride;
    p.dim = c.dim;
    p.anchors = d_anchors.get<float>();
    p.num_anchors = c.anchors;
    p.kind = c.kind;
    p.scores = d_scores.get<float>();
    GpuStatus status = ScoreLevels(p, stream_);
    ASSERT_TRUE(status.ok()) << status.ToString();
    KVTIER_ASSERT_CUDA(cudaStreamSynchronize(stream_));
    std::vector<float> got;
    KVTIER_ASSERT_CUDA(d_scores.Download(&got, static_cast<size_t>(c.anchors) * c.rows));
    const auto want =
        ScoreReference(levels.data(), c.type, c.rows, c.stride, c.dim, anchors, c.anchors, c.kind);
    // fp32 accumulation of D terms against a double reference.
    ExpectNear(got, want, c.kind == ScoreKind::kDot ? 1e-5f * c.dim : 1e-5f, "scores");
    if (c.kind == ScoreKind::kCosineUnit) {
      for (int a = 0; a < c.anchors; ++a) EXPECT_EQ(got[a * c.rows + 3], 0.5f);
    }
  }
};

TEST_F(ScoreLevelsTest, SmallBatchMatchesReference) {
  for (ElementType type : {ElementType::kFp32, ElementType::kFp16}) {
    for (ScoreKind kind : {ScoreKind::kCosineUnit, ScoreKind::kDot}) {
      RunCase({type, 1000, 128, 128, 1, kind});
      RunCase({type, 777, 80, 96, 3, kind});
      RunCase({type, 513, 128, 130, 8, kind});
    }
  }
}

TEST_F(ScoreLevelsTest, TiledBatchMatchesReference) {
  for (ElementType type : {ElementType::kFp32, ElementType::kFp16}) {
    for (ScoreKind kind : {ScoreKind::kCosineUnit, ScoreKind::kDot}) {
      RunCase({type, 1000, 128, 128, 9, kind});
      RunCase({type, 333, 80, 81, 40, kind});
      RunCase({type, 64, 33, 33, 65, kind});
    }
  }
}

// ---- top-K ------------------------------------------------------------

// Checks a top-K result against the reference on the same scores: the same
// multiset of values per anchor, and distinct valid indices whose scores
// are the returned values (values may be null: then only the indices).
void ExpectTopKMatches(const std::vector<float>& scores, int64_t rows, int32_t anchors, int32_t k,
                       const std::vector<int32_t>& indices, const std::vector<float>* values) {
  const TopKReference ref = TopKReferenceSelect(scores, rows, anchors, k);
  auto same = [](float x, float y) { return x == y || (std::isnan(x) && std::isnan(y)); };
  for (int a = 0; a < anchors; ++a) {
    std::vector<float> got;
    std::set<int32_t> seen;
    for (int i = 0; i < k; ++i) {
      const int32_t index = indices[static_cast<size_t>(a) * k + i];
      ASSERT_GE(index, 0);
      ASSERT_LT(index, rows);
      EXPECT_TRUE(seen.insert(index).second) << "row " << index << " returned twice";
      const float score = scores[static_cast<size_t>(a) * rows + index];
      got.push_back(score);
      if (values != nullptr) {
        EXPECT_TRUE(same(score, (*values)[static_cast<size_t>(a) * k + i])) << "row " << index;
      }
    }
    std::sort(got.begin(), got.end(), [](float x, float y) {
      if (std::isnan(x) != std::isnan(y)) return std::isnan(y);
      return x > y;
    });
    for (int i = 0; i < k; ++i) {
      ASSERT_TRUE(same(got[i], ref.values[static_cast<size_t>(a) * k + i]))
          << "anchor " << a << " rank " << i << ": got " << got[i] << ", want "
          << ref.values[static_cast<size_t>(a) * k + i];
    }
  }
}

class TopKTest : public KernelTest {
 protected:
  void Check(const std::vector<float>& scores, int64_t rows, int32_t anchors, int32_t k) {
    SCOPED_TRACE("N=" + std::to_string(rows) + " B=" + std::to_string(anchors) +
                 " K=" + std::to_string(k));
    DeviceBuffer d_scores(scores.size() * 4), d_indices(static_cast<size_t>(anchors) * k * 4),
        d_values(static_cast<size_t>(anchors) * k * 4), d_work(TopKWorkspaceBytes(anchors));
    KVTIER_ASSERT_CUDA(d_scores.Upload(scores.data(), scores.size() * 4));
    TopKParams p;
    p.scores = d_scores.get<float>();
    p.num_rows = rows;
    p.num_anchors = anchors;
    p.k = k;
    p.indices = d_indices.get<int32_t>();
    p.values = d_values.get<float>();
    p.workspace = d_work.get();
    p.workspace_bytes = d_work.size_bytes();
    // Twice on the same workspace: the second run must not see the first.
    for (int run = 0; run < 2; ++run) {
      GpuStatus status = TopK(p, stream_);
      ASSERT_TRUE(status.ok()) << status.ToString();
    }
    KVTIER_ASSERT_CUDA(cudaStreamSynchronize(stream_));
    std::vector<int32_t> indices;
    std::vector<float> values;
    KVTIER_ASSERT_CUDA(d_indices.Download(&indices, static_cast<size_t>(anchors) * k));
    KVTIER_ASSERT_CUDA(d_values.Download(&values, static_cast<size_t>(anchors) * k));
    ExpectTopKMatches(scores, rows, anchors, k, indices, &values);
  }
};

TEST_F(TopKTest, DistinctScoresAcrossManyTiles) {
  const int64_t rows = 100'000;
  const int32_t anchors = 3;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> scores(rows * anchors);
  for (float& x : scores) x = dist(rng);
  for (int32_t k : {1, 17, 1000, 4096, 99'999}) Check(scores, rows, anchors, k);
}

TEST_F(TopKTest, TiesNegativesAndInfinities) {
  const int64_t rows = 20'000;
  std::mt19937 rng(6);
  std::uniform_int_distribution<int> level(-8, 8);
  std::vector<float> scores(rows * 2);
  for (float& x : scores) x = 0.125f * level(rng);  // 17 distinct values
  scores[10] = std::numeric_limits<float>::infinity();
  scores[11] = -std::numeric_limits<float>::infinity();
  scores[rows + 5] = -0.0f;
  for (int32_t k : {1, 500, 1177, 10'000, static_cast<int32_t>(rows)}) Check(scores, rows, 2, k);
}

TEST_F(TopKTest, NanRanksLast) {
  const int64_t rows = 5000;
  std::vector<float> scores(rows);
  for (int64_t i = 0; i < rows; ++i) {
    scores[i] = i % 10 == 0 ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(i);
  }
  Check(scores, rows, 1, 4500);  // exactly the non-NaN rows
  Check(scores, rows, 1, 4000);
}

TEST_F(TopKTest, ScoreThenSelectOnOneStream) {
  // The serving path: 64K stacked level vectors, D = 128, two anchors.
  const int64_t rows = 65'536;
  const int32_t dim = 128, anchors = 2, k = 1024;
  std::mt19937 rng(7);
  auto levels = RandomElements(ElementType::kFp16, rows * dim, &rng);
  std::vector<float> anchor_values(anchors * dim);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& x : anchor_values) x = dist(rng);
  DeviceBuffer d_levels(levels.size()), d_anchors(anchor_values.size() * 4),
      d_scores(rows * anchors * 4), d_indices(anchors * k * 4), d_work(TopKWorkspaceBytes(anchors));
  KVTIER_ASSERT_CUDA(d_levels.Upload(levels.data(), levels.size()));
  KVTIER_ASSERT_CUDA(d_anchors.Upload(anchor_values.data(), anchor_values.size() * 4));
  ScoreParams s;
  s.levels = d_levels.get();
  s.levels_type = ElementType::kFp16;
  s.num_rows = rows;
  s.row_stride = dim;
  s.dim = dim;
  s.anchors = d_anchors.get<float>();
  s.num_anchors = anchors;
  s.scores = d_scores.get<float>();
  TopKParams t;
  t.scores = d_scores.get<float>();
  t.num_rows = rows;
  t.num_anchors = anchors;
  t.k = k;
  t.indices = d_indices.get<int32_t>();
  t.workspace = d_work.get();
  t.workspace_bytes = d_work.size_bytes();
  ASSERT_TRUE(ScoreLevels(s, stream_).ok());
  ASSERT_TRUE(TopK(t, stream_).ok());
  KVTIER_ASSERT_CUDA(cudaStreamSynchronize(stream_));
  std::vector<float> scores;
  std::vector<int32_t> indices;
  KVTIER_ASSERT_CUDA(d_scores.Download(&scores, rows * anchors));
  KVTIER_ASSERT_CUDA(d_indices.Download(&indices, anchors * k));
  const auto want_scores = ScoreReference(levels.data(), ElementType::kFp16, rows, dim, dim,
                                          anchor_values, anchors, ScoreKind::kCosineUnit);
  ExpectNear(scores, want_scores, 1e-5f, "scores");
  // The selection equals the reference top-K of the GPU's own scores (as a
  // multiset of values, so exact ties at rank K may pick either row).
  ExpectTopKMatches(scores, rows, anchors, k, indices, nullptr);
}

}  // namespace
}  // namespace kvtier::gpu::testing
