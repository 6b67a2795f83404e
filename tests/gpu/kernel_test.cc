// Kernel results equal the CPU references (tests/gpu/kernel_reference.h)
// within fp tolerance; selections equal exactly. Skips without a device.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gpu/cuda/cuda_device_ops.h"
#include "gpu/cuda/kernels.h"
#include "gtest/gtest.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/gpu/half.h"
#include "tests/gpu/kernel_reference.h"
#include "tests/testutil/status_matchers.h"

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
    ASSERT_OK(status) << status.ToString();
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
  ASSERT_OK(PoolKeys(p, stream_));
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
    ASSERT_OK(status) << status.ToString();
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

TEST_F(ScoreLevelsTest, NonFiniteRowsAndAnchorsScoreNaNLikeTheReference) {
  for (int32_t anchors : {2, 12}) {  // the small-batch and the tiled kernel
    SCOPED_TRACE("B=" + std::to_string(anchors));
    const int64_t rows = 70;
    const int32_t dim = 40;
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> levels(rows * dim), anchor_values(anchors * dim);
    for (float& x : levels) x = dist(rng);
    for (float& x : anchor_values) x = dist(rng);
    levels[5 * dim + 7] = std::numeric_limits<float>::quiet_NaN();
    levels[6 * dim] = std::numeric_limits<float>::infinity();
    levels[69 * dim + 39] = -std::numeric_limits<float>::infinity();
    anchor_values[1 * dim + 3] = std::numeric_limits<float>::infinity();
    for (ScoreKind kind : {ScoreKind::kCosineUnit, ScoreKind::kDot}) {
      DeviceBuffer d_levels(levels.size() * 4), d_anchors(anchor_values.size() * 4),
          d_scores(static_cast<size_t>(anchors) * rows * 4);
      KVTIER_ASSERT_CUDA(d_levels.Upload(levels.data(), levels.size() * 4));
      KVTIER_ASSERT_CUDA(d_anchors.Upload(anchor_values.data(), anchor_values.size() * 4));
      ScoreParams p;
      p.levels = d_levels.get();
      p.num_rows = rows;
      p.row_stride = dim;
      p.dim = dim;
      p.anchors = d_anchors.get<float>();
      p.num_anchors = anchors;
      p.kind = kind;
      p.scores = d_scores.get<float>();
      ASSERT_OK(ScoreLevels(p, stream_));
      KVTIER_ASSERT_CUDA(cudaStreamSynchronize(stream_));
      std::vector<float> got;
      KVTIER_ASSERT_CUDA(d_scores.Download(&got, static_cast<size_t>(anchors) * rows));
      const auto want = ScoreReference(levels.data(), ElementType::kFp32, rows, dim, dim,
                                       anchor_values, anchors, kind);
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(std::isnan(got[i]), std::isnan(want[i])) << "score " << i;
      }
      EXPECT_TRUE(std::isnan(got[5]) && std::isnan(got[6]) && std::isnan(got[69]));
      EXPECT_TRUE(std::isnan(got[rows + 0])) << "anchor 1 holds Inf";
    }
  }
}

// An unrelated failed call earlier on the thread leaves an error in the
// thread's last-error slot; launches must report only their own outcome.
TEST_F(ScoreLevelsTest, LaunchReportsOnlyItsOwnError) {
  const int64_t rows = 64;
  const int32_t dim = 32;
  std::vector<float> levels(rows * dim, 0.5f), anchor(dim, 1.0f);
  DeviceBuffer d_levels(levels.size() * 4), d_anchor(dim * 4), d_scores(rows * 4), d_indices(8 * 4);
  KVTIER_ASSERT_CUDA(d_levels.Upload(levels.data(), levels.size() * 4));
  KVTIER_ASSERT_CUDA(d_anchor.Upload(anchor.data(), dim * 4));
  ScoreParams p;
  p.levels = d_levels.get();
  p.num_rows = rows;
  p.row_stride = dim;
  p.dim = dim;
  p.anchors = d_anchor.get<float>();
  p.num_anchors = 1;
  p.scores = d_scores.get<float>();
  TopKParams t;
  t.scores = d_scores.get<float>();
  t.num_rows = rows;
  t.num_anchors = 1;
  t.k = 8;
  t.indices = d_indices.get<int32_t>();
  ASSERT_EQ(cudaSetDevice(-1), cudaErrorInvalidDevice);  // leaves a last error behind
  GpuStatus status = ScoreLevels(p, stream_);
  EXPECT_OK(status) << status.ToString();
  ASSERT_EQ(cudaSetDevice(-1), cudaErrorInvalidDevice);
  status = TopK(t, stream_);
  EXPECT_OK(status) << status.ToString();
  cudaGetLastError();
  KVTIER_ASSERT_CUDA(cudaStreamSynchronize(stream_));
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

// Checks a top-K result against the reference on the same scores: exactly
// the reference's rows (ties to the lowest rows), in the documented order
// (rows above the k-th value ascending, then rows equal to it ascending),
// and the values of those rows (values may be null: then only the rows).
void ExpectTopKMatches(const std::vector<float>& scores, int64_t rows, int32_t anchors, int32_t k,
                       const std::vector<int32_t>& indices, const std::vector<float>* values) {
  const TopKReference ref = TopKReferenceSelect(scores, rows, anchors, k);
  auto same = [](float x, float y) { return x == y || (std::isnan(x) && std::isnan(y)); };
  for (int a = 0; a < anchors; ++a) {
    const float* row = scores.data() + static_cast<size_t>(a) * rows;
    const float kth = ref.values[static_cast<size_t>(a) * k + k - 1];
    std::vector<int32_t> greater, equal;
    for (int i = 0; i < k; ++i) {
      const int32_t r = ref.indices[static_cast<size_t>(a) * k + i];
      (same(row[r], kth) ? equal : greater).push_back(r);
    }
    std::sort(greater.begin(), greater.end());
    std::sort(equal.begin(), equal.end());
    std::vector<int32_t> want = greater;
    want.insert(want.end(), equal.begin(), equal.end());
    const std::vector<int32_t> got(indices.begin() + static_cast<size_t>(a) * k,
                                   indices.begin() + static_cast<size_t>(a + 1) * k);
    ASSERT_EQ(got, want) << "anchor " << a;
    if (values == nullptr) continue;
    for (int i = 0; i < k; ++i) {
      ASSERT_TRUE(same(row[got[i]], (*values)[static_cast<size_t>(a) * k + i]))
          << "anchor " << a << " slot " << i;
    }
  }
}

class TopKTest : public KernelTest {
 protected:
  void Check(const std::vector<float>& scores, int64_t rows, int32_t anchors, int32_t k) {
    SCOPED_TRACE("N=" + std::to_string(rows) + " B=" + std::to_string(anchors) +
                 " K=" + std::to_string(k));
    DeviceBuffer d_scores(scores.size() * 4), d_indices(static_cast<size_t>(anchors) * k * 4),
        d_values(static_cast<size_t>(anchors) * k * 4);
    KVTIER_ASSERT_CUDA(d_scores.Upload(scores.data(), scores.size() * 4));
    TopKParams p;
    p.scores = d_scores.get<float>();
    p.num_rows = rows;
    p.num_anchors = anchors;
    p.k = k;
    p.indices = d_indices.get<int32_t>();
    p.values = d_values.get<float>();
    // Twice: the second run must give the same bytes as the first.
    std::vector<int32_t> first;
    for (int run = 0; run < 2; ++run) {
      GpuStatus status = TopK(p, stream_);
      ASSERT_OK(status) << status.ToString();
      KVTIER_ASSERT_CUDA(cudaStreamSynchronize(stream_));
      std::vector<int32_t> indices;
      std::vector<float> values;
      KVTIER_ASSERT_CUDA(d_indices.Download(&indices, static_cast<size_t>(anchors) * k));
      KVTIER_ASSERT_CUDA(d_values.Download(&values, static_cast<size_t>(anchors) * k));
      ExpectTopKMatches(scores, rows, anchors, k, indices, &values);
      if (run == 0) first = indices;
      if (run == 1) {
        EXPECT_EQ(indices, first) << "two runs differ";
      }
    }
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

TEST_F(TopKTest, AllEqualScoresGiveTheLowestRows) {
  // Every score ties: the selection is rows 0..k-1, across every slice of
  // the cluster.
  for (int64_t rows : {int64_t{1000}, int64_t{70'000}, int64_t{300'000}}) {
    std::vector<float> scores(rows, 0.75f);
    scores[rows / 2] = -0.0f;  // below 0.75
    for (int32_t k : {1, 999, 4097}) {
      if (k > rows) continue;
      Check(scores, rows, 1, k);
    }
  }
  std::vector<float> zeros(5000, 0.0f);
  for (size_t i = 0; i < zeros.size(); i += 3) zeros[i] = -0.0f;  // -0.0 ties with +0.0
  Check(zeros, 5000, 1, 1234);
}

TEST_F(TopKTest, SizesFromOneCtaToAFullCluster) {
  int device = 0;
  KVTIER_ASSERT_CUDA(cudaGetDevice(&device));
  std::mt19937 rng(8);
  std::uniform_int_distribution<int> level(0, 999);  // many ties, many distinct values
  for (int64_t rows : {int64_t{100}, int64_t{8192}, int64_t{65'536}, int64_t{1 << 20}}) {
    std::printf("N=%lld: %d CTAs per anchor\n", static_cast<long long>(rows),
                TopKCtasPerAnchor(rows, device));
    std::vector<float> scores(rows * 2);
    for (float& x : scores) x = 0.001f * level(rng);
    for (int32_t k : {1, 64, static_cast<int32_t>(rows / 8), static_cast<int32_t>(rows)}) {
      if (k < 1) continue;
      Check(scores, rows, 2, k);
    }
  }
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
      d_scores(rows * anchors * 4), d_indices(anchors * k * 4);
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
  ASSERT_OK(ScoreLevels(s, stream_));
  ASSERT_OK(TopK(t, stream_));
  KVTIER_ASSERT_CUDA(cudaStreamSynchronize(stream_));
  std::vector<float> scores;
  std::vector<int32_t> indices;
  KVTIER_ASSERT_CUDA(d_scores.Download(&scores, rows * anchors));
  KVTIER_ASSERT_CUDA(d_indices.Download(&indices, anchors * k));
  const auto want_scores = ScoreReference(levels.data(), ElementType::kFp16, rows, dim, dim,
                                          anchor_values, anchors, ScoreKind::kCosineUnit);
  ExpectNear(scores, want_scores, 1e-5f, "scores");
  // The selection equals the reference top-K of the GPU's own scores,
  // ties at rank K included.
  ExpectTopKMatches(scores, rows, anchors, k, indices, nullptr);
}

// ---- segmented scoring ------------------------------------------------

TEST_F(KernelTest, ScoreSegmentsMatchesReference) {
  for (int32_t dim : {128, 33}) {  // the half2 path and the scalar path
    SCOPED_TRACE("D=" + std::to_string(dim));
    std::mt19937 rng(dim);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    const std::vector<int64_t> sizes = {1, 300, 17, 5000, 2, 64};
    const int32_t anchors = 4;
    std::vector<std::vector<uint16_t>> host(sizes.size());
    std::vector<DeviceBuffer> tables;
    std::vector<SegmentReference> ref;
    std::vector<RowSegment> segments;
    int64_t total = 0;
    for (size_t s = 0; s < sizes.size(); ++s) {
      host[s].resize(sizes[s] * dim);
      for (uint16_t& h : host[s]) h = FloatToHalf(dist(rng));
      tables.emplace_back(host[s].size() * 2);
      KVTIER_ASSERT_CUDA(tables.back().Upload(host[s].data(), host[s].size() * 2));
      const int32_t anchor = static_cast<int32_t>((s * 3) % anchors);
      ref.push_back({host[s].data(), sizes[s], anchor});
      RowSegment seg;
      seg.rows = tables.back().get<uint16_t>();
      seg.num_rows = sizes[s];
      seg.out_offset = total;
      seg.anchor = anchor;
      segments.push_back(seg);
      total += sizes[s];
    }
    std::vector<float> anchor_values(anchors * dim);
    for (float& x : anchor_values) x = dist(rng);
    DeviceBuffer d_segments(segments.size() * sizeof(RowSegment)),
        d_anchors(anchor_values.size() * 4), d_scores(total * 4);
    KVTIER_ASSERT_CUDA(d_segments.Upload(segments.data(), segments.size() * sizeof(RowSegment)));
    KVTIER_ASSERT_CUDA(d_anchors.Upload(anchor_values.data(), anchor_values.size() * 4));
    SegmentScoreParams p;
    p.segments = d_segments.get<RowSegment>();
    p.num_segments = static_cast<int32_t>(segments.size());
    p.total_rows = total;
    p.anchors = d_anchors.get<float>();
    p.num_anchors = anchors;
    p.dim = dim;
    p.scores = d_scores.get<float>();
    GpuStatus status = ScoreSegments(p, stream_);
    ASSERT_OK(status) << status.ToString();
    KVTIER_ASSERT_CUDA(cudaStreamSynchronize(stream_));
    std::vector<float> got;
    KVTIER_ASSERT_CUDA(d_scores.Download(&got, total));
    ExpectNear(got, ScoreSegmentsReference(ref, anchor_values, dim), 1e-5f * dim, "scores");
  }
}

// ---- ordering of kernels after copies ---------------------------------

// A kernel that pools blocks just promoted must run after the promotion on
// the device: OrderStreamAfter makes the stream wait for the copy's fence
// (a host Wait alone would not order the kernel).
TEST_F(KernelTest, PoolingAfterOrderStreamAfterSeesThePromotedBytes) {
  const KvBlockShape shape{2, 2, 16, 64, ElementType::kFp32};
  const uint64_t block_bytes = shape.BlockBytes();
  CudaDeviceOpsOptions options;
  options.arena_bytes = 4 * block_bytes;
  std::unique_ptr<CudaDeviceOps> ops;
  GpuStatus status = CudaDeviceOps::Create(options, &ops);
  ASSERT_OK(status) << status.ToString();
  HostBuffer host;
  ASSERT_OK(ops->AllocHost(block_bytes, &host));
  auto* keys = static_cast<float*>(host.data);
  for (int64_t i = 0; i < shape.BlockElements(); ++i) keys[i] = 2.0f;

  DeviceBuffer d_offsets(8), d_mean(shape.head_dim * 4), d_flags(4);
  const uint64_t offset = block_bytes;  // slot 1, zero until promoted
  KVTIER_ASSERT_CUDA(d_offsets.Upload(&offset, 8));
  PoolKeysParams p;
  p.shape = shape;
  p.arena = static_cast<const std::byte*>(ops->arena_base());
  p.arena_bytes = options.arena_bytes;
  p.block_offsets = d_offsets.get<uint64_t>();
  p.num_blocks = 1;
  p.mean = d_mean.get<float>();
  p.flags = d_flags.get<uint32_t>();

  // The promotion is held back; the kernel is queued behind it.
  ops->PauseDirectionForTesting(CopyDirection::kToArena, true);
  Fence fence;
  const HostToArenaCopy copy{host.data, offset, block_bytes};
  ASSERT_OK(ops->SubmitToArena({&copy, 1}, &fence));
  ASSERT_OK(ops->OrderStreamAfter(fence, stream_));
  ASSERT_OK(PoolKeys(p, stream_));
  EXPECT_EQ(cudaStreamQuery(stream_), cudaErrorNotReady) << "the kernel ran before the copy";
  ops->PauseDirectionForTesting(CopyDirection::kToArena, false);
  KVTIER_ASSERT_CUDA(cudaStreamSynchronize(stream_));
  ASSERT_OK(ops->Wait(fence, kWaitForever));
  std::vector<float> mean;
  KVTIER_ASSERT_CUDA(d_mean.Download(&mean, shape.head_dim));
  EXPECT_EQ(mean, std::vector<float>(shape.head_dim, 2.0f));
  // A finished fence orders nothing and is fine to pass again.
  EXPECT_OK(ops->OrderStreamAfter(fence, stream_));
  EXPECT_EQ(ops->OrderStreamAfter(Fence{fence.value + 100}, stream_).code,
            GpuStatus::kInvalidArgument);
  EXPECT_OK(ops->OrderCopiesAfter(stream_));
}

}  // namespace
}  // namespace kvtier::gpu::testing
