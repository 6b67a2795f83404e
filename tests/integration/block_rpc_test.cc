// Block RPCs end to end: real daemon in-process, real gRPC over a Unix
// socket, real RocksDB / shared memory / io_uring underneath.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>

#include "client/chain_hash.h"
#include "client/client.h"
#include "client/shm/shm_mapping.h"
#include "daemon/config.h"
#include "daemon/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_daemon.h"
#include "tests/integration/tiny_profile.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

namespace kvtier {
namespace {

using ::testing::HasSubstr;

using testing::StatusIs;

// Small tiers; two NVMe files.
const std::vector<std::string> kTiers = {
    "tiers.device.capacity_bytes=256KiB", "tiers.host.capacity_bytes=512KiB",
    "tiers.host.staging_bytes=256KiB", "tiers.nvme.file_count=2",
    "tiers.nvme.file_size_bytes=4MiB"};

class BlockRpcTest : public ::testing::Test {
 protected:
  void SetUp() override { Start({}); }

  void Start(const std::vector<std::string>& extra) {
    std::vector<std::string> overrides = kTiers;
    overrides.insert(overrides.end(),
                     {"limits.max_batch_blocks=64", "leases.default_ttl_ms=60000"});
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    auto daemon = testing::StartTestDaemon(dir_, overrides);
    ASSERT_OK(daemon);
    server_ = std::move(daemon->server);
    client_ = std::move(daemon->client);
    auto registered = client_->RegisterProfile(testing::TinyProfile());
    ASSERT_OK(registered);
    profile_id_ = registered->profile_id();
    EXPECT_EQ(registered->block_size_bytes(), testing::kTinyBlockBytes);
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
  }

  static std::string Bytes(uint64_t seed) {
    std::string s(8192, '\0');
    std::mt19937_64 rng(seed);
    for (char& c : s) c = static_cast<char>(rng());
    return s;
  }

  // Ids of a chain of n blocks, as an engine would compute them.
  std::vector<std::string> Chain(int n, uint32_t salt = 0) {
    std::vector<uint32_t> tokens(16 * n);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i + salt);
    std::vector<std::string> ids;
    for (const BlockId& id : ChainHashSequence(profile_id_, tokens, 16)) ids.push_back(ToBytes(id));
    return ids;
  }

  absl::StatusOr<v1::PutBlocksResponse> Put(const std::vector<std::string>& ids, int first_seed,
                                            bool durable = false) {
    v1::PutBlocksRequest req;
    req.set_profile_id(profile_id_);
    req.set_durable(durable);
    for (size_t i = 0; i < ids.size(); ++i) {
      v1::BlockPut* b = req.add_blocks();
      b->set_block_id(ids[i]);
      b->set_data(Bytes(first_seed + i));
    }
    return client_->PutBlocks({req});
  }

  ::kvtier::testing::ScopedTempDir tmp_{"brt"};
  const std::string dir_ = tmp_.path();
  std::unique_ptr<daemon::Server> server_;
  std::unique_ptr<Client> client_;
  uint64_t profile_id_ = 0;
};

TEST_F(BlockRpcTest, RegisterProfileIsIdempotentAndChecked) {
  auto profile = client_->GetProfile(profile_id_);
  ASSERT_OK(profile);
  auto again = client_->RegisterProfile(profile->profile());
  ASSERT_OK(again);
  EXPECT_EQ(again->profile_id(), profile_id_);
  EXPECT_FALSE(again->created());
  v1::ModelProfile other = profile->profile();
  other.set_head_dim(64);
  EXPECT_THAT(client_->RegisterProfile(other), StatusIs(absl::StatusCode::kAlreadyExists));
  other.set_num_layers(0);
  auto bad = client_->RegisterProfile(other);
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(bad.status().message(), HasSubstr("profile.num_layers"));
  EXPECT_THAT(client_->GetProfile(999), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(BlockRpcTest, PutGetLookupAcrossEveryTier) {
  // 100 blocks = 800 KiB: more than the host tier (512 KiB), so some live
  // only on NVMe; handles put some into the device tier.
  auto ids = Chain(100);
  for (int start = 0; start < 100; start += 25) {
    auto put = Put({ids.begin() + start, ids.begin() + start + 25}, start);
    ASSERT_OK(put);
    for (const auto& r : put->results()) ASSERT_EQ(r.status().code(), 0) << r.status().message();
  }
  v1::LookupRequest lookup;
  lookup.set_profile_id(profile_id_);
  for (int i = 0; i < 60; ++i) lookup.add_block_ids(ids[i]);
  lookup.add_block_ids(Chain(1, 7777)[0]);  // never stored
  auto found = client_->Lookup(lookup);
  ASSERT_OK(found);
  EXPECT_EQ(found->prefix_blocks(), 60u);
  EXPECT_FALSE(found->entries(60).present());
  bool saw_nvme = false, saw_host = false;
  for (int i = 0; i < 60; ++i) {
    saw_nvme |= found->entries(i).tier() == v1::TIER_NVME;
    saw_host |= found->entries(i).tier() == v1::TIER_HOST;
  }
  EXPECT_TRUE(saw_nvme);
  EXPECT_TRUE(saw_host);

  // Handles for the first 8 blocks: promoted to the device arena.
  v1::GetBlocksRequest handles;
  handles.set_profile_id(profile_id_);
  handles.set_mode(v1::RETURN_MODE_HANDLES);
  for (int i = 0; i < 8; ++i) handles.add_block_ids(ids[i]);
  uint64_t lease = 0;
  auto pinned = client_->GetBlocks(handles, &lease);
  ASSERT_OK(pinned);
  ASSERT_NE(lease, 0u);
  auto arena = client_->OpenArena();
  ASSERT_OK(arena);
  std::string err;
  auto view = client::ShmArenaView::Open(client_->ArenaSource(*arena), arena->size_bytes(), &err);
  ASSERT_NE(view, nullptr) << err;
  for (int i = 0; i < 8; ++i) {
    const auto& r = (*pinned)[i];
    ASSERT_EQ(r.status().code(), 0) << r.status().message();
    EXPECT_EQ(r.tier(), v1::TIER_DEVICE);
    EXPECT_EQ(r.handle().arena_id(), arena->arena_id());
    auto bytes = view->Slot(r.handle().offset_bytes(), r.handle().size_bytes());
    ASSERT_FALSE(bytes.empty()) << err;
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()), Bytes(i));
  }
  v1::ReleaseRequest release;
  release.set_lease_id(lease);
  auto released = client_->Release(release);
  ASSERT_OK(released);
  EXPECT_EQ(released->blocks_unpinned(), 8u);

  // Bytes of every block, bit-exact, from whatever tier holds it.
  v1::GetBlocksRequest get;
  get.set_profile_id(profile_id_);
  for (int i = 0; i < 64; ++i) get.add_block_ids(ids[i]);
  auto got = client_->GetBlocks(get);
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), 64u);
  for (int i = 0; i < 64; ++i) {
    ASSERT_EQ((*got)[i].status().code(), 0) << (*got)[i].status().message();
    EXPECT_EQ((*got)[i].data(), Bytes(i)) << i;
  }
  // Every tier stayed within its capacity.
  auto stats = client_->Stats();
  ASSERT_OK(stats);
  for (const auto& t : stats->tiers()) EXPECT_LE(t.used_bytes(), t.capacity_bytes());
}

// GetBlocks in bytes mode over many response messages (3 blocks fit in
// each), found and missing ids interleaved: the daemon reuses a response's
// buffers from message to message, so a missing block must come back empty,
// never with the bytes an earlier message carried in its place.
TEST_F(BlockRpcTest, GetBlocksOverManyMessagesNeverCarriesEarlierBytes) {
  TearDown();
  Start({"server.max_message_bytes=96KiB"});
  const std::vector<std::string> ids = Chain(40);
  std::vector<std::string> stored;
  for (size_t i = 0; i < ids.size(); i += 2) stored.push_back(ids[i]);
  for (size_t j = 0; j < stored.size(); j += 8) {  // 8 blocks per put message
    const std::vector<std::string> part(stored.begin() + j,
                                        stored.begin() + std::min(stored.size(), j + 8));
    auto put = Put(part, static_cast<int>(j));
    ASSERT_OK(put);
  }
  v1::GetBlocksRequest get;
  get.set_profile_id(profile_id_);
  for (const std::string& id : ids) get.add_block_ids(id);
  auto got = client_->GetBlocks(get);
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const v1::BlockResult& r = (*got)[i];
    EXPECT_EQ(r.block_id(), ids[i]);
    if (i % 2 == 0) {
      EXPECT_EQ(r.status().code(), 0) << i << ": " << r.status().message();
      EXPECT_EQ(r.data(), Bytes(i / 2)) << i;
    } else {
      EXPECT_EQ(r.status().code(), grpc::StatusCode::NOT_FOUND) << i;
      EXPECT_TRUE(r.data().empty()) << i << ": " << r.data().size() << " bytes";
    }
  }
}

TEST_F(BlockRpcTest, BadInputGetsFieldNamedErrors) {
  auto ids = Chain(2);
  v1::PutBlocksRequest req;
  req.set_profile_id(profile_id_);
  req.add_blocks()->set_data(Bytes(1));  // no id
  auto* b = req.add_blocks();
  b->set_block_id(std::string(40, 'x'));  // id too long
  b->set_data(Bytes(1));
  b = req.add_blocks();
  b->set_block_id(ids[0]);
  b->set_data("short");                    // wrong size
  req.add_blocks()->set_block_id(ids[1]);  // no source
  auto put = client_->PutBlocks({req});
  ASSERT_OK(put);
  ASSERT_EQ(put->results_size(), 4);
  EXPECT_EQ(put->results(0).status().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(put->results(0).status().message(), HasSubstr("block_id"));
  EXPECT_THAT(put->results(1).status().message(), HasSubstr("block_id"));
  EXPECT_EQ(put->results(2).status().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(put->results(2).status().message(), HasSubstr("data"));
  EXPECT_THAT(put->results(3).status().message(), HasSubstr("blocks[3]"));

  v1::PutBlocksRequest unknown;
  unknown.set_profile_id(4242);
  auto* u = unknown.add_blocks();
  u->set_block_id(ids[0]);
  u->set_data(Bytes(0));
  auto st = client_->PutBlocks({unknown}).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kNotFound));  // not a profile of the caller's
  EXPECT_THAT(st.message(), HasSubstr("profile_id"));

  v1::GetBlocksRequest get;
  get.set_profile_id(profile_id_);
  EXPECT_THAT(client_->GetBlocks(get).status().message(), HasSubstr("block_ids"));
  for (int i = 0; i < 65; ++i) get.add_block_ids(ids[0]);
  EXPECT_THAT(client_->GetBlocks(get), StatusIs(absl::StatusCode::kInvalidArgument));
  v1::ReleaseRequest release;
  release.set_lease_id(12345);
  EXPECT_THAT(client_->Release(release), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(BlockRpcTest, DifferentBytesUnderSameIdAreRefused) {
  auto ids = Chain(1);
  ASSERT_OK(Put(ids, 1));
  auto again = Put(ids, 2);
  ASSERT_OK(again);
  EXPECT_EQ(again->results(0).status().code(), grpc::StatusCode::ALREADY_EXISTS);
  auto same = Put(ids, 1);
  ASSERT_OK(same);
  EXPECT_EQ(same->results(0).status().code(), 0);
  EXPECT_TRUE(same->results(0).existed());
  v1::GetBlocksRequest get;
  get.set_profile_id(profile_id_);
  get.add_block_ids(ids[0]);
  auto got = client_->GetBlocks(get);
  ASSERT_OK(got);
  EXPECT_EQ((*got)[0].data(), Bytes(1));
}

TEST_F(BlockRpcTest, StagingSlotPathStoresWithoutBytesInTheMessage) {
  auto slots = client_->ReserveSlots(profile_id_, 2);
  ASSERT_OK(slots);
  std::string err;
  auto staging = client::ShmStagingFile::Open(client_->StagingSource(*slots),
                                              slots->staging_size_bytes(), &err);
  ASSERT_NE(staging, nullptr) << err;
  auto ids = Chain(2);
  v1::PutBlocksRequest req;
  req.set_profile_id(profile_id_);
  req.set_durable(true);
  for (int i = 0; i < 2; ++i) {
    const auto& slot = slots->slots(i);
    std::string data = Bytes(100 + i);
    ASSERT_TRUE(staging->Write(slot.offset_bytes(), slot.size_bytes(),
                               std::as_bytes(std::span<const char>(data.data(), data.size())),
                               &err))
        << err;
    auto* b = req.add_blocks();
    b->set_block_id(ids[i]);
    *b->mutable_slot() = slot;
  }
  auto put = client_->PutBlocks({req});
  ASSERT_OK(put);
  for (const auto& r : put->results()) {
    EXPECT_EQ(r.status().code(), 0) << r.status().message();
    EXPECT_TRUE(r.durable());
  }
  v1::GetBlocksRequest get;
  get.set_profile_id(profile_id_);
  for (const auto& id : ids) get.add_block_ids(id);
  auto got = client_->GetBlocks(get);
  ASSERT_OK(got);
  EXPECT_EQ((*got)[0].data(), Bytes(100));
  EXPECT_EQ((*got)[1].data(), Bytes(101));
}

TEST_F(BlockRpcTest, DeleteRefusesPinnedBlocks) {
  auto ids = Chain(2);
  ASSERT_OK(Put(ids, 0));
  v1::GetBlocksRequest handles;
  handles.set_profile_id(profile_id_);
  handles.set_mode(v1::RETURN_MODE_HANDLES);
  handles.add_block_ids(ids[0]);
  uint64_t lease = 0;
  ASSERT_OK(client_->GetBlocks(handles, &lease));
  v1::DeleteBlocksRequest del;
  del.set_profile_id(profile_id_);
  del.add_block_ids(ids[0]);
  del.add_block_ids(ids[1]);
  del.add_block_ids(Chain(1, 99)[0]);
  auto deleted = client_->DeleteBlocks(del);
  ASSERT_OK(deleted);
  EXPECT_EQ(deleted->statuses(0).code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(deleted->statuses(1).code(), 0);
  EXPECT_EQ(deleted->statuses(2).code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(BlockRpcTest, DurableBlocksSurviveDaemonRestart) {
  auto ids = Chain(10);
  auto put = Put(ids, 50, /*durable=*/true);
  ASSERT_OK(put);
  for (const auto& r : put->results()) EXPECT_TRUE(r.durable());
  std::string socket = server_->socket_path();
  client_.reset();
  server_->Shutdown();
  server_.reset();
  auto daemon = testing::StartTestDaemon(dir_, kTiers);
  ASSERT_OK(daemon);
  server_ = std::move(daemon->server);
  ASSERT_EQ(server_->socket_path(), socket);
  client_ = std::move(daemon->client);
  v1::GetBlocksRequest get;
  get.set_profile_id(profile_id_);
  for (const auto& id : ids) get.add_block_ids(id);
  auto got = client_->GetBlocks(get);
  ASSERT_OK(got);
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ((*got)[i].status().code(), 0) << (*got)[i].status().message();
    EXPECT_EQ((*got)[i].data(), Bytes(50 + i));
    EXPECT_EQ((*got)[i].tier(), v1::TIER_NVME);
  }
}

}  // namespace
}  // namespace kvtier
