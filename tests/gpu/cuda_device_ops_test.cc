// CUDA-specific parts of the device tier beyond the DeviceOps contract:
// option validation, the backend factory, the cudaError_t conversion and
// the kernels' shape checks. Everything here that needs no device runs on
// every machine; the rest skips without one.
#include "gpu/cuda/cuda_device_ops.h"

#include <unistd.h>

#include <set>
#include <string>
#include <vector>

#include "gpu/cuda/device_ops_factory.h"
#include "gpu/device_probe.h"
#include "gtest/gtest.h"

#ifdef KVTIER_HAVE_CUDA
#include "gpu/cuda/cuda_status.h"
#include "gpu/cuda/kernels.h"
#include "tests/testutil/status_matchers.h"
#endif

namespace kvtier::gpu {
namespace {

bool HaveDevice() { return ProbeDevices().device_count > 0; }

std::string ShmPath() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return "/dev/shm/kvtier-cuda-test-" + std::to_string(getpid()) + "-" + info->name();
}

TEST(CudaDeviceOpsOptionsTest, BadOptionsNameTheField) {
  CudaDeviceOpsOptions options;
  options.arena_bytes = 0;
  std::unique_ptr<CudaDeviceOps> ops;
  GpuStatus status = CudaDeviceOps::Create(options, &ops);
  EXPECT_EQ(status.code, GpuStatus::kInvalidArgument);
  EXPECT_NE(status.message.find("arena_bytes"), std::string::npos) << status.message;
  options.arena_bytes = kMaxCudaArenaBytes + 1;
  EXPECT_EQ(CudaDeviceOps::Create(options, &ops).code, GpuStatus::kInvalidArgument);
  options.arena_bytes = 1 << 20;
  options.max_inflight_batches = 0;
  status = CudaDeviceOps::Create(options, &ops);
  EXPECT_NE(status.message.find("max_inflight_batches"), std::string::npos) << status.message;
  options.max_inflight_batches = 16;
  options.device_ordinal = -1;
  status = CudaDeviceOps::Create(options, &ops);
  EXPECT_NE(status.message.find("device_ordinal"), std::string::npos) << status.message;
  EXPECT_EQ(ops, nullptr);
}

TEST(CudaDeviceOpsTest, WithoutDeviceCreateIsUnavailable) {
  if (HaveDevice()) GTEST_SKIP() << "a device is present";
  CudaDeviceOpsOptions options;
  options.arena_bytes = 1 << 20;
  std::unique_ptr<DeviceOps> ops;
  GpuStatus status = NewCudaDeviceOps(options, &ops);
  EXPECT_EQ(status.code, GpuStatus::kUnavailable) << status.ToString();
  EXPECT_EQ(ops, nullptr);
}

TEST(CudaDeviceOpsTest, OrdinalBeyondVisibleDevicesIsRefused) {
  if (!HaveDevice()) GTEST_SKIP() << ProbeDevices().description;
  CudaDeviceOpsOptions options;
  options.arena_bytes = 1 << 20;
  options.device_ordinal = 4096;
  std::unique_ptr<DeviceOps> ops;
  GpuStatus status = NewCudaDeviceOps(options, &ops);
  EXPECT_EQ(status.code, GpuStatus::kInvalidArgument) << status.ToString();
}

TEST(CudaDeviceOpsTest, OneArenaPerDeviceAllOrNothing) {
  if (!HaveDevice()) GTEST_SKIP() << ProbeDevices().description;
  const int count = ProbeDevices().device_count;
  std::vector<int> ordinals;
  for (int i = 0; i < count; ++i) ordinals.push_back(i);
  CudaDeviceOpsOptions options;
  options.arena_bytes = 1 << 20;
  std::vector<std::unique_ptr<DeviceOps>> arenas;
  ASSERT_OK(NewCudaDeviceOpsPerDevice(ordinals, options, &arenas));
  ASSERT_EQ(arenas.size(), ordinals.size());
  std::set<uint64_t> ids;
  for (size_t i = 0; i < arenas.size(); ++i) {
    EXPECT_EQ(arenas[i]->arena().device_ordinal, ordinals[i]);
    ids.insert(arenas[i]->arena().arena_id);
  }
  EXPECT_EQ(ids.size(), arenas.size());

  ordinals.push_back(4096);
  std::vector<std::unique_ptr<DeviceOps>> none;
  GpuStatus status = NewCudaDeviceOpsPerDevice(ordinals, options, &none);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message.find("device 4096"), std::string::npos) << status.message;
  EXPECT_TRUE(none.empty());
}

TEST(DeviceOpsFactoryTest, PicksBackendAndExplainsWhy) {
  DeviceTierOptions options;
  options.arena_bytes = 1 << 20;
  options.shm_path = ShmPath();
  std::unique_ptr<DeviceOps> ops;
  std::string why;

  options.backend = DeviceBackend::kShm;
  ASSERT_OK(NewDeviceOps(options, &ops, &why));
  EXPECT_EQ(ops->arena().backend, kShmArenaBackend);
  EXPECT_EQ(why, "configured: shm");
  ops.reset();

  options.backend = DeviceBackend::kAuto;
  ASSERT_OK(NewDeviceOps(options, &ops, &why));
  if (HaveDevice()) {
    EXPECT_EQ(ops->arena().backend, "cuda:0");
  } else {
    EXPECT_EQ(ops->arena().backend, kShmArenaBackend);
    EXPECT_NE(why.find("no CUDA device"), std::string::npos) << why;
  }
  ops.reset();

  options.backend = DeviceBackend::kCuda;
  GpuStatus status = NewDeviceOps(options, &ops, &why);
  if (HaveDevice()) {
    ASSERT_OK(status) << status.ToString();
    EXPECT_EQ(ops->arena().backend, "cuda:0");
  } else {
    EXPECT_EQ(status.code, GpuStatus::kUnavailable) << status.ToString();
    EXPECT_EQ(ops, nullptr);
  }
}

TEST(DeviceOpsFactoryTest, ArenaIdIsPassedThrough) {
  DeviceTierOptions options;
  options.backend = DeviceBackend::kShm;
  options.arena_bytes = 1 << 16;
  options.arena_id = 0x1234;
  options.shm_path = ShmPath();
  std::unique_ptr<DeviceOps> ops;
  ASSERT_OK(NewDeviceOps(options, &ops, nullptr));
  EXPECT_EQ(ops->arena().arena_id, 0x1234u);
}

#ifdef KVTIER_HAVE_CUDA

TEST(CudaStatusTest, MapsErrorClasses) {
  EXPECT_OK(CudaErrorToGpuStatus(cudaSuccess, "x"));
  GpuStatus oom = CudaErrorToGpuStatus(cudaErrorMemoryAllocation, "cudaMalloc arena");
  EXPECT_EQ(oom.code, GpuStatus::kOutOfMemory);
  EXPECT_EQ(oom.message.rfind("cudaMalloc arena: cudaErrorMemoryAllocation: ", 0), 0u)
      << oom.message;
  EXPECT_EQ(CudaErrorToGpuStatus(cudaErrorInvalidValue, "x").code, GpuStatus::kInvalidArgument);
  EXPECT_EQ(CudaErrorToGpuStatus(cudaErrorHostMemoryAlreadyRegistered, "x").code,
            GpuStatus::kInvalidArgument);
  EXPECT_EQ(CudaErrorToGpuStatus(cudaErrorNoDevice, "x").code, GpuStatus::kUnavailable);
  EXPECT_EQ(CudaErrorToGpuStatus(cudaErrorInsufficientDriver, "x").code, GpuStatus::kUnavailable);
  EXPECT_EQ(CudaErrorToGpuStatus(cudaErrorIllegalAddress, "x").code, GpuStatus::kInternal);
  EXPECT_EQ(CudaErrorToGpuStatus(cudaErrorLaunchFailure, "x").code, GpuStatus::kInternal);
  EXPECT_TRUE(IsNoDeviceError(cudaErrorNoDevice));
  EXPECT_FALSE(IsNoDeviceError(cudaErrorIllegalAddress));
}

// Shape checks run on the host, before any launch, so they need no device.
TEST(KernelShapeCheckTest, ScoreSegmentsNamesTheBadField) {
  static float buffer[4];
  static RowSegment segment;
  SegmentScoreParams g;
  g.segments = &segment;
  g.num_segments = 1;
  g.total_rows = 4;
  g.anchors = buffer;
  g.num_anchors = 1;
  g.dim = 1;
  g.scores = buffer;
  ASSERT_OK(CheckSegmentScoreParams(g));
  SegmentScoreParams bad_g = g;
  bad_g.num_segments = 0;
  EXPECT_NE(CheckSegmentScoreParams(bad_g).message.find("num_segments"), std::string::npos);
  bad_g = g;
  bad_g.dim = kMaxScoreDim + 1;
  EXPECT_NE(CheckSegmentScoreParams(bad_g).message.find("dim"), std::string::npos);
  bad_g = g;
  bad_g.segments = nullptr;
  EXPECT_NE(CheckSegmentScoreParams(bad_g).message.find("segments"), std::string::npos);
  // A failed check launches nothing: the wrapper returns before CUDA.
  EXPECT_EQ(ScoreSegments(bad_g, nullptr).code, GpuStatus::kInvalidArgument);
}

#endif  // KVTIER_HAVE_CUDA

}  // namespace
}  // namespace kvtier::gpu
