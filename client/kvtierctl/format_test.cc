#include "client/kvtierctl/format.h"

#include "gtest/gtest.h"

namespace kvtier::ctl {
namespace {

TEST(FormatTest, HumanBytes) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(HumanBytes(256ull << 20), "256 MiB");
  EXPECT_EQ(HumanBytes(2ull << 30), "2 GiB");
}

TEST(FormatTest, HumanDuration) {
  EXPECT_EQ(HumanDuration(0), "0s");
  EXPECT_EQ(HumanDuration(65), "1m5s");
  EXPECT_EQ(HumanDuration(3725), "1h2m5s");
  EXPECT_EQ(HumanDuration(90061), "1d1h1m1s");
}

}  // namespace
}  // namespace kvtier::ctl
