#include "index/kernels/int8_dot.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier::index {
namespace {

// Every kernel the CPU has gives the portable loop's integers, for every
// dimension from 1 to 300 (so every body/tail split), strides wider than
// the rows, counts around the 4-row blocking, and the extremes +-127.
TEST(Int8DotTest, EveryKernelGivesThePortableSums) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> value(-127, 127);
  std::vector<std::string> kernels = {"portable"};
  for (const char* isa : {"avx2", "avx512vnni"}) {
    if (SetInt8DotIsaForTest(isa)) kernels.push_back(isa);
  }
  SetInt8DotIsaForTest("");
  for (int32_t dim = 1; dim <= 300; ++dim) {
    const size_t stride = static_cast<size_t>(dim) + (dim % 3) * 16;
    for (int64_t count : {1, 3, 4, 5, 9}) {
      std::vector<int8_t> rows(stride * count), q(dim);
      for (auto& v : rows) v = static_cast<int8_t>(value(rng));
      for (auto& v : q) v = static_cast<int8_t>(value(rng));
      if (dim % 7 == 0) {  // extremes: the largest possible products
        for (auto& v : rows) v = (&v - rows.data()) % 2 ? 127 : -127;
        for (auto& v : q) v = (&v - q.data()) % 3 ? -127 : 127;
      }
      std::vector<int32_t> want(count);
      for (int64_t r = 0; r < count; ++r) {
        int64_t s = 0;
        for (int32_t d = 0; d < dim; ++d) s += int64_t{q[d]} * rows[r * stride + d];
        want[r] = static_cast<int32_t>(s);
      }
      for (const std::string& isa : kernels) {
        ASSERT_TRUE(SetInt8DotIsaForTest(isa));
        std::vector<int32_t> got(count, -1);
        DotRowsS8(rows.data(), count, stride, dim, q.data(), got.data());
        EXPECT_EQ(got, want) << isa << " dim " << dim << " count " << count;
      }
    }
  }
  SetInt8DotIsaForTest("");
}

TEST(Int8DotTest, UnknownKernelIsRefused) {
  EXPECT_FALSE(SetInt8DotIsaForTest("sse9"));
  EXPECT_TRUE(SetInt8DotIsaForTest("portable"));
  EXPECT_EQ(Int8DotIsa(), "portable");
  EXPECT_TRUE(SetInt8DotIsaForTest(""));
}

}  // namespace
}  // namespace kvtier::index
