// Client::PutBlockData / GetBlockData against a real daemon over a Unix
// socket: blocks sent from and read into the caller's memory, interoperable
// with the protobuf calls, with per-block statuses for misses, wrong
// destination sizes and checksum mismatches. Blocks of 256 KiB in messages
// of several MiB make gRPC hand the daemon (and the client) payloads split
// across many slices.
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <xxhash.h>

#include "client/client.h"
#include "daemon/server.h"
#include "gtest/gtest.h"
#include "tests/integration/test_daemon.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

namespace kvtier {
namespace {

using testing::StatusIs;

// 4 layers x K,V x 8 KV heads x 16 tokens x 128 dims x fp16 = 256 KiB.
constexpr uint64_t kBlockBytes = 256 << 10;

v1::ModelProfile Profile() {
  v1::ModelProfile profile;
  profile.set_name("block-data");
  profile.set_revision("1");
  profile.set_num_layers(4);
  profile.set_num_kv_heads(8);
  profile.set_head_dim(128);
  profile.set_block_size_tokens(16);
  profile.set_dtype(v1::DTYPE_FP16);
  return profile;
}

// Finite fp16 values (exponent below the maximum), seeded per block.
std::vector<uint8_t> Payload(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> data(kBlockBytes);
  for (size_t i = 0; i < data.size(); i += 2) {
    const uint16_t h = static_cast<uint16_t>((rng() & 0x3bff) | ((rng() & 1) << 15));
    std::memcpy(&data[i], &h, 2);
  }
  return data;
}

class BlockDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = testing::StartTestDaemon(
        dir_, {"tiers.host.capacity_bytes=32MiB", "tiers.host.staging_bytes=1MiB",
               "tiers.nvme.file_size_bytes=32MiB"});
    ASSERT_OK(daemon);
    server_ = std::move(daemon->server);
    client_ = std::move(daemon->client);
    auto registered = client_->RegisterProfile(Profile());
    ASSERT_OK(registered);
    ASSERT_EQ(registered->block_size_bytes(), kBlockBytes);
    profile_id_ = registered->profile_id();
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
  }

  // n blocks "<tag>-<i>" with Payload(seed + i).
  void Make(const std::string& tag, int n, uint32_t seed) {
    for (int i = 0; i < n; ++i) {
      ids_.push_back(tag + "-" + std::to_string(i));
      payloads_.push_back(Payload(seed + i));
    }
  }
  std::vector<BlockData> Blocks(size_t first, size_t n) const {
    std::vector<BlockData> blocks;
    for (size_t i = first; i < first + n; ++i) blocks.push_back({ids_[i], payloads_[i]});
    return blocks;
  }

  ::kvtier::testing::ScopedTempDir tmp_{"bdt"};
  const std::string dir_ = tmp_.path();
  std::unique_ptr<daemon::Server> server_;
  std::unique_ptr<Client> client_;
  uint64_t profile_id_ = 0;
  std::vector<std::string> ids_;
  std::vector<std::vector<uint8_t>> payloads_;
};

TEST_F(BlockDataTest, PutAndGetFromCallerMemoryRoundTrip) {
  Make("rt", 24, 100);
  PutDataOptions options;
  options.message_blocks = 10;  // 3 messages of at most 10 blocks (2.5 MiB)
  auto put = client_->PutBlockData(profile_id_, Blocks(0, 24), options);
  ASSERT_OK(put);
  EXPECT_EQ(put->messages_received(), 3u);
  ASSERT_EQ(put->results_size(), 24);
  EXPECT_EQ(put->blocks_stored(), 24u);
  EXPECT_EQ(put->bytes_stored(), 24 * kBlockBytes);
  for (int i = 0; i < 24; ++i) {
    EXPECT_EQ(put->results(i).block_id(), ids_[i]);
    EXPECT_EQ(put->results(i).status().code(), 0) << put->results(i).status().message();
    EXPECT_FALSE(put->results(i).existed());
  }

  // Read back into fresh buffers, in calls of 7 ids.
  std::vector<std::vector<uint8_t>> out(24, std::vector<uint8_t>(kBlockBytes, 0xEE));
  std::vector<BlockDestination> dst;
  for (int i = 0; i < 24; ++i) dst.push_back({ids_[i], absl::MakeSpan(out[i])});
  auto got = client_->GetBlockData(profile_id_, dst, /*ids_per_call=*/7);
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), 24u);
  for (int i = 0; i < 24; ++i) {
    EXPECT_OK((*got)[i].status) << i << ": " << (*got)[i].status;
    EXPECT_NE((*got)[i].tier, v1::TIER_UNSPECIFIED);
    EXPECT_TRUE(out[i] == payloads_[i]) << "block " << i << " differs";
  }

  // The protobuf call reads the same bytes, and a repeat put finds them.
  v1::GetBlocksRequest req;
  req.set_profile_id(profile_id_);
  req.set_mode(v1::RETURN_MODE_BYTES);
  req.add_block_ids(ids_[5]);
  auto typed = client_->GetBlocks(req);
  ASSERT_OK(typed);
  ASSERT_EQ(typed->size(), 1u);
  EXPECT_TRUE(std::memcmp((*typed)[0].data().data(), payloads_[5].data(), kBlockBytes) == 0);
  auto again = client_->PutBlockData(profile_id_, Blocks(0, 3));
  ASSERT_OK(again);
  for (const v1::PutResult& r : again->results()) EXPECT_TRUE(r.existed());
}

TEST_F(BlockDataTest, ProtobufPutsReadBackDirectly) {
  Make("pb", 4, 200);
  v1::PutBlocksRequest req;
  req.set_profile_id(profile_id_);
  for (int i = 0; i < 4; ++i) {
    v1::BlockPut* b = req.add_blocks();
    b->set_block_id(ids_[i]);
    b->set_data(payloads_[i].data(), payloads_[i].size());
  }
  ASSERT_OK(client_->PutBlocks({req}));
  std::vector<std::vector<uint8_t>> out(4, std::vector<uint8_t>(kBlockBytes));
  std::vector<BlockDestination> dst;
  for (int i = 0; i < 4; ++i) dst.push_back({ids_[i], absl::MakeSpan(out[i])});
  auto got = client_->GetBlockData(profile_id_, dst);
  ASSERT_OK(got);
  for (int i = 0; i < 4; ++i) {
    EXPECT_OK((*got)[i].status) << (*got)[i].status;
    EXPECT_TRUE(out[i] == payloads_[i]) << i;
  }
}

TEST_F(BlockDataTest, PerBlockStatusesForMissesSizesAndChecksums) {
  Make("st", 3, 300);
  std::vector<BlockData> blocks = Blocks(0, 3);
  blocks[0].xxh3 = XXH3_64bits(payloads_[0].data(), kBlockBytes);      // right
  blocks[1].xxh3 = XXH3_64bits(payloads_[1].data(), kBlockBytes) ^ 1;  // wrong
  const std::vector<uint8_t> short_payload(100, 1);
  blocks[2].data = short_payload;
  auto put = client_->PutBlockData(profile_id_, blocks);
  ASSERT_OK(put);
  ASSERT_EQ(put->results_size(), 3);
  EXPECT_EQ(put->results(0).status().code(), 0);
  EXPECT_EQ(put->results(1).status().code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(put->results(2).status().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(put->results(2).status().message().find("data"), std::string::npos);
  EXPECT_EQ(put->blocks_stored(), 1u);

  std::vector<uint8_t> a(kBlockBytes), small(kBlockBytes - 1, 0x5A), missing(kBlockBytes);
  std::vector<BlockDestination> dst = {{ids_[0], absl::MakeSpan(a)},
                                       {ids_[0], absl::MakeSpan(small)},
                                       {"nope", absl::MakeSpan(missing)}};
  auto got = client_->GetBlockData(profile_id_, dst);
  ASSERT_OK(got);
  EXPECT_OK((*got)[0].status) << (*got)[0].status;
  EXPECT_TRUE(a == payloads_[0]);
  EXPECT_THAT((*got)[1].status, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_NE((*got)[1].status.message().find("blocks[1].dst"), std::string::npos)
      << (*got)[1].status;
  EXPECT_EQ(small, std::vector<uint8_t>(kBlockBytes - 1, 0x5A)) << "a refused dst was written";
  EXPECT_THAT((*got)[2].status, StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(BlockDataTest, BadCallsNameTheField) {
  EXPECT_THAT(client_->PutBlockData(profile_id_, {}), StatusIs(absl::StatusCode::kInvalidArgument));
  Make("bad", 1, 400);
  PutDataOptions zero;
  zero.message_blocks = 0;
  auto st = client_->PutBlockData(profile_id_, Blocks(0, 1), zero).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(st.message().find("options.message_blocks"), std::string::npos) << st;
  // The daemon's own checks come back as the call's status.
  st = client_->PutBlockData(profile_id_ + 1, Blocks(0, 1)).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kNotFound)) << st;  // not the caller's profile
  EXPECT_NE(st.message().find("profile_id"), std::string::npos) << st;
  std::vector<uint8_t> out(kBlockBytes);
  std::vector<BlockDestination> dst = {{ids_[0], absl::MakeSpan(out)}};
  EXPECT_THAT(client_->GetBlockData(profile_id_, dst, 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(client_->GetBlockData(profile_id_ + 1, dst), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace kvtier
