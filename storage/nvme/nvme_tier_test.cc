#include "storage/nvme/nvme_tier.h"

#include <xxhash.h>

#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "storage/env/aligned_buffer.h"
#include "storage/nvme/nvme_test_util.h"
#include "tests/testutil/status_matchers.h"

using ::kvtier::testing::StatusIs;

namespace kvtier {
namespace {

using ::kvtier::testing::RandomBytes;

class NvmeTierTest : public testing::NvmeTierFixture {
 protected:
  // Writes `data` and reads it back through an unaligned and an aligned
  // buffer.
  void ExpectReadsBack(const NvmeLocation& location, const std::vector<uint8_t>& data) {
    std::vector<uint8_t> out(data.size());
    ASSERT_OK(tier_->Read(location, NvmeChecksum(data), absl::MakeSpan(out)))
        << location.ToString();
    ASSERT_EQ(out, data) << location.ToString();
  }
};

TEST(NvmeChecksumTest, IsPlainXxh3) {
  // Callers may compute the checksum with XXH3_64bits directly.
  for (uint64_t size : {0, 1, 240, 4096, 1 << 20}) {
    const auto data = RandomBytes(size, size);
    EXPECT_EQ(NvmeChecksum(data), XXH3_64bits(data.data(), data.size())) << size;
  }
}

TEST_F(NvmeTierTest, RoundTripsManySizesThroughStagingAndInPlace) {
  const std::vector<uint64_t> sizes = {
      4096, 1, 5000, 65536, 100001, 256 * 1024, 1 << 20, (1 << 20) + 123, 2 << 20};
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<absl::Span<const uint8_t>> spans;
  for (size_t i = 0; i < sizes.size(); ++i) {
    payloads.push_back(RandomBytes(sizes[i], i));
  }
  for (const auto& payload : payloads) spans.push_back(payload);
  // The same sizes again from aligned memory: the in-place path.
  std::vector<AlignedBuffer> aligned;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] % 4096 != 0) continue;
    aligned.push_back(std::move(AlignedBuffer::Allocate(sizes[i])).value());
    std::memcpy(aligned.back().data(), payloads[i].data(), sizes[i]);
    spans.push_back(aligned.back().span());
  }

  auto locations = tier_->WriteBatch(spans);
  ASSERT_EQ(locations.size(), spans.size());
  for (size_t i = 0; i < spans.size(); ++i) {
    ASSERT_OK(locations[i]) << locations[i].status();
    EXPECT_EQ(locations[i]->length_bytes, spans[i].size());
    EXPECT_EQ(locations[i]->offset_bytes % 4096, 0u);
  }
  for (size_t i = 0; i < payloads.size(); ++i) {
    ExpectReadsBack(*locations[i], payloads[i]);
  }
  // Aligned reads of the aligned writes (in place both ways).
  for (size_t i = payloads.size(), a = 0; i < spans.size(); ++i, ++a) {
    auto out = AlignedBuffer::Allocate(spans[i].size());
    ASSERT_OK(tier_->Read(*locations[i], NvmeChecksum(spans[i]), out->span()));
    EXPECT_EQ(std::memcmp(out->data(), aligned[a].data(), spans[i].size()), 0);
  }
  ASSERT_OK(tier_->Sync());

  const NvmeTierStats stats = tier_->stats();
  EXPECT_EQ(stats.writes, spans.size());
  EXPECT_EQ(stats.reads, spans.size());
  EXPECT_GT(stats.zero_copy_ops, 0u);
  EXPECT_GT(stats.staged_ops, 0u);
  EXPECT_EQ(stats.blocks, spans.size());
  EXPECT_EQ(stats.checksum_failures, 0u);
  EXPECT_GE(stats.syncs, 1u);
  EXPECT_EQ(stats.direct_io, options_.use_odirect);
  if (stats.registered_buffers) {
    EXPECT_GT(stats.queue.fixed_buffer_ops, 0u);
  }
}

TEST_F(NvmeTierTest, ConcurrentBatchesFromSeveralThreads) {
  constexpr int kThreads = 4;
  constexpr int kBlocksPerThread = 24;
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::vector<uint8_t>> payloads;
      std::vector<absl::Span<const uint8_t>> spans;
      for (int i = 0; i < kBlocksPerThread; ++i) {
        payloads.push_back(RandomBytes(20000 + 4096 * i, t * 1000 + i));
      }
      for (const auto& p : payloads) spans.push_back(p);
      auto locations = tier_->WriteBatch(spans);
      std::vector<std::vector<uint8_t>> outs(kBlocksPerThread);
      std::vector<NvmeReadRequest> reads;
      for (int i = 0; i < kBlocksPerThread; ++i) {
        if (!locations[i].ok()) {
          ++failures[t];
          continue;
        }
        outs[i].resize(payloads[i].size());
        reads.push_back({*locations[i], NvmeChecksum(payloads[i]), absl::MakeSpan(outs[i])});
      }
      for (const absl::Status& s : tier_->ReadBatch(reads)) {
        if (!s.ok()) ++failures[t];
      }
      for (int i = 0; i < kBlocksPerThread; ++i) {
        if (outs[i] != payloads[i]) ++failures[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << t;
  EXPECT_EQ(tier_->stats().blocks, uint64_t{kThreads} * kBlocksPerThread);
}

TEST_F(NvmeTierTest, CapacityIsAHardLimit) {
  const uint64_t capacity = uint64_t{options_.num_files} * options_.file_size_bytes;
  const auto block = RandomBytes(1 << 20, 7);
  uint64_t written = 0;
  for (;;) {
    auto location = tier_->Write(block);
    if (!location.ok()) {
      EXPECT_THAT(location.status(), StatusIs(absl::StatusCode::kResourceExhausted));
      EXPECT_NE(location.status().message().find(absl::StrCat("capacity_bytes=", capacity)),
                absl::string_view::npos)
          << location.status();
      break;
    }
    written += block.size();
    ASSERT_LE(written, capacity);
  }
  EXPECT_EQ(written, capacity);
  EXPECT_EQ(tier_->stats().used_bytes, capacity);
  EXPECT_EQ(tier_->stats().capacity_bytes, capacity);
}

TEST_F(NvmeTierTest, FreedSpaceIsReused) {
  const auto a = RandomBytes(10000, 1);
  const auto b = RandomBytes(10000, 2);
  auto first = tier_->Write(a);
  ASSERT_OK(first);
  const uint64_t used = tier_->stats().used_bytes;
  EXPECT_EQ(used, 12288u);
  ASSERT_OK(tier_->Free(*first));
  EXPECT_EQ(tier_->stats().used_bytes, 0u);
  EXPECT_THAT(tier_->Free(*first), StatusIs(absl::StatusCode::kNotFound))
      << "double free is refused";

  // Fill both files to one block each so the freed range is the fit.
  auto second = tier_->Write(b);
  ASSERT_OK(second);
  auto third = tier_->Write(b);
  ASSERT_OK(third);
  EXPECT_TRUE(*second == *first || *third == *first)
      << "freed extent reused: " << first->ToString() << " vs " << second->ToString() << ", "
      << third->ToString();
  ExpectReadsBack(*second, b);
  ExpectReadsBack(*third, b);
}

TEST_F(NvmeTierTest, RestartWithReserveKeepsDataReadable) {
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<NvmeLocation> locations;
  for (int i = 0; i < 12; ++i) {
    payloads.push_back(RandomBytes(30000 * (i + 1), 100 + i));
    auto location = tier_->Write(payloads.back());
    ASSERT_OK(location);
    locations.push_back(*location);
  }
  ASSERT_OK(tier_->Sync());
  const uint64_t used = tier_->stats().used_bytes;

  Reopen();
  EXPECT_EQ(tier_->stats().used_bytes, 0u);
  for (const NvmeLocation& location : locations) {
    ASSERT_OK(tier_->Reserve(location)) << location.ToString();
  }
  EXPECT_EQ(tier_->stats().used_bytes, used);
  EXPECT_THAT(tier_->Reserve(locations[3]), StatusIs(absl::StatusCode::kAlreadyExists));
  for (size_t i = 0; i < locations.size(); ++i) {
    ExpectReadsBack(locations[i], payloads[i]);
  }
  // New blocks do not land on reserved ones.
  auto fresh = tier_->Write(RandomBytes(50000, 9));
  ASSERT_OK(fresh);
  for (const NvmeLocation& location : locations) {
    if (location.file_index != fresh->file_index) continue;
    const bool disjoint =
        fresh->offset_bytes >= location.offset_bytes + RoundUpToDirectIo(location.length_bytes) ||
        location.offset_bytes >= fresh->offset_bytes + RoundUpToDirectIo(fresh->length_bytes);
    EXPECT_TRUE(disjoint) << fresh->ToString() << " " << location.ToString();
  }
}

TEST_F(NvmeTierTest, FlippedByteOnDiskIsDataLoss) {
  const auto data = RandomBytes(70000, 3);
  auto location = tier_->Write(data);
  ASSERT_OK(location);
  ASSERT_OK(tier_->Sync());

  // Corrupt one byte in the middle of the block behind the tier's back.
  BlockFileOptions raw;
  raw.size_bytes = options_.file_size_bytes;
  raw.create_if_missing = false;
  raw.direct_io = false;
  auto file = Env::Default()->OpenBlockFile(tier_->FilePaths()[location->file_index], raw);
  ASSERT_OK(file);
  uint8_t byte = 0;
  const uint64_t at = location->offset_bytes + 12345;
  ASSERT_OK((*file)->ReadAt(at, absl::MakeSpan(&byte, 1)));
  byte ^= 0x40;
  ASSERT_OK((*file)->WriteAt(at, absl::MakeConstSpan(&byte, 1)));
  ASSERT_OK((*file)->Sync());

  std::vector<uint8_t> out(data.size(), 0xee);
  absl::Status status = tier_->Read(*location, NvmeChecksum(data), absl::MakeSpan(out));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kDataLoss)) << status;
  EXPECT_NE(status.message().find(location->ToString()), absl::string_view::npos) << status;
  EXPECT_EQ(out, std::vector<uint8_t>(data.size(), 0)) << "no bytes handed back";
  EXPECT_EQ(tier_->stats().checksum_failures, 1u);
}

TEST_F(NvmeTierTest, BadArgumentsNameTheField) {
  EXPECT_THAT(tier_->Write({}).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  const auto too_big = RandomBytes(options_.max_block_bytes + 1, 1);
  EXPECT_THAT(tier_->Write(too_big).status(), StatusIs(absl::StatusCode::kInvalidArgument));

  std::vector<uint8_t> out(100);
  absl::Status status = tier_->Read({7, 0, 100}, 0, absl::MakeSpan(out));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(status.message().find("file_index"), absl::string_view::npos);
  status = tier_->Read({0, 100, 100}, 0, absl::MakeSpan(out));
  EXPECT_NE(status.message().find("offset_bytes"), absl::string_view::npos);
  status = tier_->Read({0, 0, 99}, 0, absl::MakeSpan(out));
  EXPECT_NE(status.message().find("out has 100 bytes"), absl::string_view::npos);
  EXPECT_THAT(tier_->Free({0, 0, 4096}), StatusIs(absl::StatusCode::kNotFound));

  NvmeTierOptions bad = options_;
  bad.num_files = 0;
  EXPECT_NE(NvmeTier::Open(bad).status().message().find("num_files"), absl::string_view::npos);
  bad = options_;
  bad.file_size_bytes = 5000;
  EXPECT_NE(NvmeTier::Open(bad).status().message().find("file_size_bytes"),
            absl::string_view::npos);
  bad = options_;
  bad.max_block_bytes = bad.staging_bytes + 1;
  EXPECT_NE(NvmeTier::Open(bad).status().message().find("max_block_bytes"),
            absl::string_view::npos);
}

TEST_F(NvmeTierTest, ReopenWithAnotherFileSizeIsRefused) {
  tier_.reset();
  NvmeTierOptions other = options_;
  other.file_size_bytes *= 2;
  EXPECT_THAT(NvmeTier::Open(other).status(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(NvmeTierTest, OrphanFilesAreRemovedAndForeignOnesReported) {
  // Files of an earlier, larger configuration and a foreign file.
  tier_.reset();
  NvmeTierOptions larger = options_;
  larger.num_files = 4;
  ASSERT_OK(NvmeTier::Open(larger));
  ASSERT_OK(Env::Default()->CreateDir(options_.directory + "/catalog", false));
  Reopen();

  auto report = tier_->RemoveOrphanFiles();
  ASSERT_OK(report) << report.status();
  EXPECT_EQ(report->removed, (std::vector<std::string>{"nvme-002.dat", "nvme-003.dat"}));
  EXPECT_EQ(report->foreign, std::vector<std::string>{"catalog"});
  auto names = Env::Default()->ListDir(options_.directory);
  EXPECT_EQ(*names, (std::vector<std::string>{"catalog", "nvme-000.dat", "nvme-001.dat"}));
}

}  // namespace
}  // namespace kvtier
