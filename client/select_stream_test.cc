// The C++ client's context, Select stream, staged put and Admin calls
// against a real daemon (in process, real gRPC over its Unix socket, real
// RocksDB).
#include "client/select_stream.h"

#include <filesystem>
#include <string>
#include <vector>

#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_daemon.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

using ::kvtier::testing::StatusIs;

namespace kvtier {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kLayers = 2, kKvHeads = 1, kDim = 16, kTokens = 16;
constexpr size_t kBlockBytes = size_t{kLayers} * 2 * kKvHeads * kTokens * kDim * 2;

class ClientCallsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = testing::StartTestDaemon(dir_, {"tiers.device.backend=shm"});
    ASSERT_OK(daemon) << daemon.status();
    server_ = std::move(daemon->server);
    client_ = std::move(daemon->client);
    v1::ModelProfile p;
    p.set_name("client-calls");
    p.set_num_layers(kLayers);
    p.set_num_kv_heads(kKvHeads);
    p.set_head_dim(kDim);
    p.set_block_size_tokens(kTokens);
    p.set_dtype(v1::DTYPE_FP16);
    auto reg = client_->RegisterProfile(p);
    ASSERT_OK(reg) << reg.status();
    profile_id_ = reg->profile_id();
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
  }

  // Puts n blocks through the staging file; each is filled with 0x3c00
  // (fp16 1.0) plus its index in the first byte.
  std::vector<std::string> PutStaged(int n) {
    std::vector<std::string> ids, payloads;
    for (int i = 0; i < n; ++i) {
      ids.push_back("b" + std::to_string(i));
      std::string bytes(kBlockBytes, '\0');
      for (size_t j = 0; j < bytes.size(); j += 2) bytes[j + 1] = 0x3c;
      bytes[0] = static_cast<char>(i);
      payloads.push_back(bytes);
    }
    std::vector<BlockData> blocks;
    for (int i = 0; i < n; ++i) {
      blocks.push_back(
          {ids[i], {reinterpret_cast<const uint8_t*>(payloads[i].data()), payloads[i].size()}});
    }
    PutDataOptions options;
    options.message_blocks = 2;  // several messages
    auto put = client_->PutBlocksStaged(profile_id_, blocks, options);
    EXPECT_OK(put) << put.status();
    if (put.ok()) {
      EXPECT_EQ(put->results_size(), n);
      for (const auto& r : put->results()) EXPECT_EQ(r.status().code(), 0) << r.status().message();
    }
    payloads_ = payloads;
    return ids;
  }

  uint64_t Open(const std::vector<std::string>& ids) {
    v1::OpenContextRequest open;
    open.set_profile_id(profile_id_);
    for (const auto& id : ids) open.add_segments()->add_block_ids(id);
    auto opened = client_->OpenContext(open);
    EXPECT_OK(opened) << opened.status();
    return opened.ok() ? opened->context_id() : 0;
  }

  static v1::ContextSelect Entry(uint64_t context_id, uint32_t max_blocks) {
    v1::ContextSelect e;
    e.set_context_id(context_id);
    e.set_scorer(v1::SCORER_RECENCY);
    e.set_max_blocks(max_blocks);
    return e;
  }

  ::kvtier::testing::ScopedTempDir tmp_{"client-calls"};
  const std::string dir_ = tmp_.path();
  std::unique_ptr<daemon::Server> server_;
  std::unique_ptr<Client> client_;
  uint64_t profile_id_ = 0;
  std::vector<std::string> payloads_;
};

TEST_F(ClientCallsTest, StagedPutsReadBackAndAppendGrowsTheContext) {
  std::vector<std::string> ids = PutStaged(5);
  std::vector<std::string> got(ids.size(), std::string(kBlockBytes, '\0'));
  std::vector<BlockDestination> dst;
  for (size_t i = 0; i < ids.size(); ++i) {
    dst.push_back({ids[i], {reinterpret_cast<uint8_t*>(got[i].data()), got[i].size()}});
  }
  auto read = client_->GetBlockData(profile_id_, dst);
  ASSERT_OK(read) << read.status();
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_OK((*read)[i].status) << (*read)[i].status;
    EXPECT_EQ(got[i], payloads_[i]) << ids[i];
  }
  const uint64_t ctx = Open({ids[0], ids[1], ids[2]});
  auto appended = client_->AppendBlocks(ctx, {ids[3], ids[4]});
  ASSERT_OK(appended) << appended.status();
  EXPECT_EQ(appended->num_blocks(), 5u);
  auto contexts = client_->ListContexts();
  ASSERT_OK(contexts) << contexts.status();
  ASSERT_EQ(contexts->contexts_size(), 1);
  EXPECT_EQ(contexts->contexts(0).context_id(), ctx);
  EXPECT_OK(client_->CloseContext(ctx));
  EXPECT_THAT(client_->CloseContext(ctx), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(ClientCallsTest, StagedPutRefusesABlockOfTheWrongSize) {
  std::string small(kBlockBytes - 2, '\0');
  BlockData block{"short", {reinterpret_cast<const uint8_t*>(small.data()), small.size()}};
  auto put = client_->PutBlocksStaged(profile_id_, {&block, 1});
  EXPECT_THAT(put.status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(put.status().message(), HasSubstr("blocks[0].data"));
}

TEST_F(ClientCallsTest, PipelinedRequestsAreAnsweredInOrder) {
  const uint64_t ctx = Open(PutStaged(6));
  auto stream = client_->OpenSelectStream();
  // Three requests in flight before the first answer is read; the second
  // names a context that does not exist next to one that does.
  auto first = stream->Send({Entry(ctx, 2)});
  auto second = stream->Send({Entry(ctx, 3), Entry(ctx + 1000, 2)});
  auto third = stream->Send({Entry(ctx, 4)});
  ASSERT_OK(first);
  ASSERT_OK(second);
  ASSERT_OK(third);
  EXPECT_EQ(*first, 1u);
  EXPECT_EQ(*third, 3u);
  EXPECT_EQ(stream->outstanding(), 3u);
  for (int want : {2, 3, 4}) {
    auto sel = stream->Receive();
    ASSERT_OK(sel) << sel.status();
    ASSERT_OK((*sel)[0].status) << (*sel)[0].status;
    EXPECT_EQ((*sel)[0].blocks.size(), want);  // the budget of that request
    if (want == 3) {
      ASSERT_EQ(sel->size(), 2u);
      EXPECT_THAT((*sel)[1].status, StatusIs(absl::StatusCode::kNotFound));
      EXPECT_THAT((*sel)[1].status.message(), HasSubstr("contexts[1]"));
    }
  }
  EXPECT_THAT(stream->Receive().status(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_OK(stream->Close());
  v1::ReleaseRequest release;
  release.set_context_id(ctx);
  auto released = client_->Release(release);
  ASSERT_OK(released) << released.status();
  EXPECT_EQ(released->blocks_unpinned(), 4u);  // the last Select's set
}

TEST_F(ClientCallsTest, BadAnchorsAreRefusedBeforeSending) {
  const uint64_t ctx = Open(PutStaged(2));
  auto stream = client_->OpenSelectStream();
  v1::ContextSelect e = Entry(ctx, 2);
  for (uint32_t i = 0; i < kDim + 1; ++i) e.add_anchor(0.5f);  // neither dim nor layers*dim
  auto sent = stream->Send({Entry(ctx, 2), e});
  EXPECT_THAT(sent.status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(sent.status().message(), HasSubstr("contexts[1].anchor"));
  v1::ContextSelect no_id;
  EXPECT_THAT(stream->Send({no_id}).status().message(), HasSubstr("contexts[0].context_id"));
  EXPECT_THAT(stream->Send({}).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(stream->outstanding(), 0u);
  EXPECT_OK(stream->Close());
}

TEST_F(ClientCallsTest, CancelledStreamReportsCancelled) {
  auto stream = client_->OpenSelectStream();
  stream->Cancel();
  EXPECT_THAT(stream->Close(), StatusIs(absl::StatusCode::kCancelled));
}

TEST_F(ClientCallsTest, AdminCalls) {
  std::vector<std::string> ids = PutStaged(3);
  auto profiles = client_->ListProfiles();
  ASSERT_OK(profiles) << profiles.status();
  ASSERT_EQ(profiles->profiles_size(), 1);
  v1::ListBlocksRequest list;
  list.set_profile_id(profile_id_);
  list.set_limit(10);
  auto blocks = client_->ListBlocks(list);
  ASSERT_OK(blocks) << blocks.status();
  EXPECT_EQ(blocks->blocks_size(), 3);
  int progress_messages = 0;
  auto drained =
      client_->Drain(v1::DrainRequest(), [&](const v1::DrainProgress&) { ++progress_messages; });
  ASSERT_OK(drained) << drained.status();
  EXPECT_GE(progress_messages, 1);
  EXPECT_EQ(drained->blocks_done(), drained->blocks_total());
  auto verified = client_->Verify(v1::VerifyRequest());
  ASSERT_OK(verified) << verified.status();
  EXPECT_EQ(verified->corrupt_blocks(), 0u);
  v1::EvictRequest evict;
  evict.set_profile_id(profile_id_);
  evict.add_block_ids(ids[0]);
  evict.add_block_ids("missing");
  auto evicted = client_->Evict(evict);
  ASSERT_OK(evicted) << evicted.status();
  ASSERT_EQ(evicted->statuses_size(), 2);
  EXPECT_OK(FromItemStatus(evicted->statuses(0), "block_ids[0]"));
  absl::Status missing = FromItemStatus(evicted->statuses(1), "block_ids[1]");
  EXPECT_THAT(missing, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(missing.message(), HasSubstr("block_ids[1]: "));
}

}  // namespace
}  // namespace kvtier
