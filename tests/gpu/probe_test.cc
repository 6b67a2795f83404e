#include "gpu/device_probe.h"
#include "gtest/gtest.h"

namespace kvtier::gpu {
namespace {

TEST(DeviceProbeTest, ReportsCountAndReason) {
  DeviceProbe probe = ProbeDevices();
  EXPECT_GE(probe.device_count, 0);
  EXPECT_FALSE(probe.description.empty());
#ifndef KVTIER_HAVE_CUDA
  EXPECT_FALSE(probe.cuda_compiled);
  EXPECT_EQ(probe.device_count, 0);
#else
  EXPECT_TRUE(probe.cuda_compiled);
#endif
  if (probe.device_count > 0) {
    EXPECT_NE(probe.description.find("cuda:0"), std::string::npos);
  }
}

}  // namespace
}  // namespace kvtier::gpu
