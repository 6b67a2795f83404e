// The kernel's results equal the CPU reference (tests/gpu/kernel_reference.h)
// within fp tolerance, and device work is ordered after promotions. Skips
// without a device.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
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

// ---- ordering of device work after copies -----------------------------

// Device work that reads blocks just promoted must run after the promotion
// on the device: OrderStreamAfter makes the stream wait for the copy's
// fence (a host Wait alone would not order the stream). The reader here is
// a device-to-device copy out of the promoted slot, queued on the stream.
TEST_F(KernelTest, StreamOrderedAfterAPromotionSeesThePromotedBytes) {
  const uint64_t block_bytes = 64 * 1024;
  CudaDeviceOpsOptions options;
  options.arena_bytes = 4 * block_bytes;
  std::unique_ptr<CudaDeviceOps> ops;
  GpuStatus status = CudaDeviceOps::Create(options, &ops);
  ASSERT_OK(status) << status.ToString();
  HostBuffer host;
  ASSERT_OK(ops->AllocHost(block_bytes, &host));
  std::memset(host.data, 0x5a, block_bytes);

  DeviceBuffer d_read(block_bytes);
  const uint64_t offset = block_bytes;  // slot 1, zero until promoted
  const auto* slot = static_cast<const std::byte*>(ops->arena_base()) + offset;

  // The promotion is held back; the reader is queued behind it.
  ops->PauseDirectionForTesting(CopyDirection::kToArena, true);
  Fence fence;
  const HostToArenaCopy copy{host.data, offset, block_bytes};
  ASSERT_OK(ops->SubmitToArena({&copy, 1}, &fence));
  ASSERT_OK(ops->OrderStreamAfter(fence, stream_));
  KVTIER_ASSERT_CUDA(
      cudaMemcpyAsync(d_read.get(), slot, block_bytes, cudaMemcpyDeviceToDevice, stream_));
  EXPECT_EQ(cudaStreamQuery(stream_), cudaErrorNotReady) << "the reader ran before the copy";
  ops->PauseDirectionForTesting(CopyDirection::kToArena, false);
  KVTIER_ASSERT_CUDA(cudaStreamSynchronize(stream_));
  ASSERT_OK(ops->Wait(fence, kWaitForever));
  std::vector<uint8_t> read;
  KVTIER_ASSERT_CUDA(d_read.Download(&read, block_bytes));
  EXPECT_EQ(read, std::vector<uint8_t>(block_bytes, 0x5a));
  // A finished fence orders nothing and is fine to pass again.
  EXPECT_OK(ops->OrderStreamAfter(fence, stream_));
  EXPECT_EQ(ops->OrderStreamAfter(Fence{fence.value + 100}, stream_).code,
            GpuStatus::kInvalidArgument);
  EXPECT_OK(ops->OrderCopiesAfter(stream_));
}

}  // namespace
}  // namespace kvtier::gpu::testing
