#include "index/context_tree.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "index/kernels/simd.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::index {
namespace {

std::vector<float> RandomVectors(int64_t n, int32_t dim, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n * dim);
  for (float& x : v) x = normal(rng);
  return v;
}

std::vector<double> Unit(const float* v, int32_t dim) {
  double n2 = 0;
  for (int32_t d = 0; d < dim; ++d) n2 += double{v[d]} * v[d];
  std::vector<double> u(dim);
  for (int32_t d = 0; d < dim; ++d) u[d] = v[d] / std::sqrt(n2);
  return u;
}

TreeOptions SmallOptions() {
  TreeOptions o;
  o.dim = 8;
  o.pages_per_chunk = 4;
  o.chunks_per_grid = 2;
  return o;
}

TEST(ContextTreeTest, SegmentsStartNewChunksAndGrids) {
  auto tree = ContextTree::Create(SmallOptions());
  ASSERT_OK(tree);
  ContextTree& t = **tree;
  ASSERT_OK(t.AddSegment(RandomVectors(10, 8, 1)));
  ASSERT_OK(t.AddSegment(RandomVectors(5, 8, 2)));
  EXPECT_EQ(t.num_pages(), 15);
  EXPECT_EQ(t.num_segments(), 2);
  EXPECT_EQ(t.SegmentFirstPage(1), 10);
  // Segment 0: chunks of 4, 4, 2 pages in grids {0, 1}, {2}; segment 1:
  // chunks of 4, 1 in grid {3, 4}.
  ASSERT_EQ(t.num_chunks(), 5);
  ASSERT_EQ(t.num_grids(), 3);
  const int64_t first_page[] = {0, 4, 8, 10, 14, 15};
  for (int c = 0; c <= 5; ++c) EXPECT_EQ(t.ChunkFirstPage(c), first_page[c]);
  const int64_t first_chunk[] = {0, 2, 3, 5};
  for (int g = 0; g <= 3; ++g) EXPECT_EQ(t.GridFirstChunk(g), first_chunk[g]);
}

TEST(ContextTreeTest, LevelMeansAreMeansOfUnitChildren) {
  auto tree = ContextTree::Create(SmallOptions());
  ASSERT_OK(tree);
  ContextTree& t = **tree;
  const std::vector<float> v = RandomVectors(11, 8, 3);
  ASSERT_OK(t.AddSegment(v));
  std::vector<std::vector<double>> chunk_means;
  for (int64_t c = 0; c < t.num_chunks(); ++c) {
    std::vector<double> ref(8, 0.0);
    const int64_t p0 = t.ChunkFirstPage(c), p1 = t.ChunkFirstPage(c + 1);
    for (int64_t p = p0; p < p1; ++p) {
      const std::vector<double> u = Unit(&v[p * 8], 8);
      for (int d = 0; d < 8; ++d) ref[d] += u[d] / (p1 - p0);
    }
    const std::vector<float> got = t.ChunkMean(c);
    for (int d = 0; d < 8; ++d) EXPECT_NEAR(got[d], ref[d], 1e-6);
    chunk_means.push_back(ref);
  }
  for (int64_t g = 0; g < t.num_grids(); ++g) {
    std::vector<double> ref(8, 0.0);
    const int64_t c0 = t.GridFirstChunk(g), c1 = t.GridFirstChunk(g + 1);
    for (int64_t c = c0; c < c1; ++c) {
      for (int d = 0; d < 8; ++d) ref[d] += chunk_means[c][d] / (c1 - c0);
    }
    const std::vector<float> got = t.GridMean(g);
    for (int d = 0; d < 8; ++d) EXPECT_NEAR(got[d], ref[d], 1e-6);
  }
  // Default rows are the means themselves, in fp16.
  for (int64_t c = 0; c < t.num_chunks(); ++c) {
    for (int d = 0; d < 8; ++d) {
      EXPECT_NEAR(simd::HalfToFloat(t.chunk_rows()[c * 8 + d]), chunk_means[c][d], 1e-3);
    }
  }
  std::vector<double> ctx(8, 0.0);
  for (int64_t p = 0; p < 11; ++p) {
    const std::vector<double> u = Unit(&v[p * 8], 8);
    for (int d = 0; d < 8; ++d) ctx[d] += u[d] / 11;
  }
  const std::vector<float> got = t.ContextMean();
  for (int d = 0; d < 8; ++d) EXPECT_NEAR(got[d], ctx[d], 1e-6);
}

TEST(ContextTreeTest, AppendEqualsRebuild) {
  const std::vector<float> doc = RandomVectors(6, 8, 4);
  const std::vector<float> run = RandomVectors(13, 8, 5);
  auto built = ContextTree::Create(SmallOptions());
  auto grown = ContextTree::Create(SmallOptions());
  ASSERT_OK(built);
  ASSERT_OK(grown);
  ASSERT_OK((*built)->AddSegment(doc));
  ASSERT_OK((*built)->AddSegment(run));
  ASSERT_OK((*grown)->AddSegment(doc));
  ASSERT_OK((*grown)->AddSegment(absl::MakeConstSpan(run).subspan(0, 8)));
  for (int64_t p = 1; p < 13; ++p) {
    ASSERT_OK((*grown)->Append(absl::MakeConstSpan(run).subspan(p * 8, 8)));
  }
  const ContextTree& a = **built;
  const ContextTree& b = **grown;
  ASSERT_EQ(a.num_pages(), b.num_pages());
  ASSERT_EQ(a.num_chunks(), b.num_chunks());
  ASSERT_EQ(a.num_grids(), b.num_grids());
  EXPECT_EQ(0, std::memcmp(a.page_rows(), b.page_rows(), a.num_pages() * 8 * sizeof(uint16_t)));
  EXPECT_EQ(0, std::memcmp(a.chunk_rows(), b.chunk_rows(), a.num_chunks() * 8 * sizeof(uint16_t)));
  EXPECT_EQ(0, std::memcmp(a.grid_rows(), b.grid_rows(), a.num_grids() * 8 * sizeof(uint16_t)));
  for (int64_t c = 0; c < a.num_chunks(); ++c) {
    EXPECT_EQ(a.ChunkMean(c), b.ChunkMean(c));
  }
}

TEST(ContextTreeTest, AppendToEmptyTreeStartsASegment) {
  auto tree = ContextTree::Create(SmallOptions());
  ASSERT_OK(tree);
  const std::vector<float> v = RandomVectors(1, 8, 6);
  ASSERT_OK((*tree)->Append(v));
  EXPECT_EQ((*tree)->num_segments(), 1);
  EXPECT_EQ((*tree)->num_grids(), 1);
  EXPECT_GT((*tree)->MemoryBytes(), 8u * 2);
}

TEST(ContextTreeTest, KeepsSummariesForFlatScorers) {
  TreeOptions o = SmallOptions();
  o.keep_summaries = true;
  auto tree = ContextTree::Create(o);
  ASSERT_OK(tree);
  EXPECT_EQ((*tree)->AddSegment(RandomVectors(2, 8, 7)).code(),
            absl::StatusCode::kFailedPrecondition);
  BlockSummary s;
  s.dim = 8;
  s.mean.assign(8, 1.0f);
  s.min.assign(8, 0.0f);
  s.max.assign(8, 2.0f);
  s.radius = 1.5f;
  std::vector<BlockSummary> pages(3, s);
  ASSERT_OK((*tree)->AddSegment(pages));
  ASSERT_OK((*tree)->Append(s));
  const SummaryView v = (*tree)->summaries();
  EXPECT_EQ(v.num_blocks, 4);
  EXPECT_EQ(v.radius[3], 1.5f);
  BlockSummary no_bounds = s;
  no_bounds.min.clear();
  no_bounds.max.clear();
  EXPECT_FALSE((*tree)->Append(no_bounds).ok());
  EXPECT_EQ((*tree)->num_pages(), 4);  // unchanged on error
}

TEST(ContextTreeTest, BadInputNamesTheField) {
  TreeOptions o = SmallOptions();
  o.pages_per_chunk = 0;
  EXPECT_NE(ContextTree::Create(o).status().message().find("options.pages_per_chunk"),
            std::string::npos);
  auto tree = ContextTree::Create(SmallOptions());
  ASSERT_OK(tree);
  EXPECT_NE((*tree)->AddSegment(std::vector<float>{}).message().find("segment is empty"),
            std::string::npos);
  EXPECT_NE((*tree)->AddSegment(std::vector<float>(12, 1.0f)).message().find("multiple of dim"),
            std::string::npos);
  std::vector<float> v = RandomVectors(2, 8, 8);
  v[9] = INFINITY;
  EXPECT_NE((*tree)->AddSegment(v).message().find("vectors[9]"), std::string::npos);
  EXPECT_NE((*tree)->Append(std::vector<float>(7, 1.0f)).message().find("vector has 7"),
            std::string::npos);
  EXPECT_EQ((*tree)->num_pages(), 0);
}

}  // namespace
}  // namespace kvtier::index
