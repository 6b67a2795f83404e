// CompactContext, ListContextVersions, DropContextVersion end to end: the
// daemon in-process, real gRPC over its Unix socket, real RocksDB and
// io_uring underneath. The compacted blocks are checked against
// index::CompactHead applied directly to the same keys and values.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "client/client.h"
#include "daemon/compaction/head_codec.h"
#include "daemon/config.h"
#include "daemon/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/kernels/simd.h"
#include "index/selkv.h"
#include "tests/integration/test_daemon.h"
#include "tests/integration/tiny_profile.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

namespace kvtier {
namespace {

using ::testing::HasSubstr;
using testing::StatusIs;

constexpr int kLayers = 2, kHeads = 2, kTokens = 16, kDim = 32;

index::BlockLayout Shape() {
  index::BlockLayout s;
  s.num_layers = kLayers;
  s.num_kv_heads = kHeads;
  s.head_dim = kDim;
  s.block_size_tokens = kTokens;
  s.dtype = index::Dtype::kFp16;
  return s;
}

std::string RandomPayload(uint64_t seed) {
  std::string out(testing::kTinyBlockBytes, '\0');
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  auto* h = reinterpret_cast<uint16_t*>(out.data());
  for (size_t i = 0; i < out.size() / 2; ++i) h[i] = index::simd::FloatToHalf(dist(rng));
  return out;
}

class CompactionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Start();
    auto registered = client_->RegisterProfile(testing::TinyProfile());
    ASSERT_OK(registered);
    profile_id_ = registered->profile_id();
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
  }
  void Start() {
    auto daemon = testing::StartTestDaemon(dir_, {"index.head_weights_min_blocks=1000"});
    ASSERT_OK(daemon);
    server_ = std::move(daemon->server);
    client_ = std::move(daemon->client);
  }
  void Restart() {
    client_.reset();
    server_.reset();
    Start();
  }

  // Stores `n` random blocks; returns their ids.
  std::vector<std::string> PutBlocks(int n, const std::string& prefix) {
    v1::PutBlocksRequest req;
    req.set_profile_id(profile_id_);
    std::vector<std::string> ids;
    for (int b = 0; b < n; ++b) {
      const std::string id = prefix + std::to_string(b);
      payloads_.push_back(RandomPayload(std::hash<std::string>()(id)));
      v1::BlockPut* put = req.add_blocks();
      put->set_block_id(id);
      put->set_data(payloads_.back());
      ids.push_back(id);
    }
    auto resp = client_->PutBlocks({req});
    EXPECT_OK(resp);
    return ids;
  }

  uint64_t Open(const std::vector<std::string>& ids) {
    grpc::ClientContext ctx;
    v1::OpenContextRequest req;
    req.set_profile_id(profile_id_);
    for (const std::string& id : ids) req.add_segments()->add_block_ids(id);
    v1::OpenContextResponse resp;
    grpc::Status st = client_->kvtier_stub()->OpenContext(&ctx, req, &resp);
    EXPECT_OK(st) << st.error_message();
    return resp.context_id();
  }

  absl::StatusOr<v1::CompactContextResponse> Compact(uint64_t context_id, float rho,
                                                     const std::vector<float>& queries = {}) {
    v1::CompactContextRequest req;
    req.set_context_id(context_id);
    req.set_retention(rho);
    for (float q : queries) req.add_observation_queries(q);
    return client_->CompactContext(req);
  }

  std::vector<v1::BlockResult> Get(const google::protobuf::RepeatedPtrField<std::string>& ids) {
    v1::GetBlocksRequest req;
    req.set_profile_id(profile_id_);
    for (const std::string& id : ids) req.add_block_ids(id);
    auto results = client_->GetBlocks(req);
    EXPECT_OK(results);
    return results.ok() ? *results : std::vector<v1::BlockResult>{};
  }

  // Checks the stored compacted blocks against CompactHead on the originals.
  void ExpectMatchesDirect(const v1::CompactContextResponse& resp, float rho,
                           const std::vector<float>& queries) {
    const index::BlockLayout shape = Shape();
    const int64_t tokens = static_cast<int64_t>(payloads_.size()) * kTokens;
    const int32_t kept = index::KeptSlots(static_cast<int32_t>(tokens), rho);
    ASSERT_EQ(resp.version().tokens(), static_cast<uint32_t>(kept));
    const int64_t blocks = (kept + kTokens - 1) / kTokens;
    ASSERT_EQ(resp.version().block_ids_size(), blocks);
    std::vector<v1::BlockResult> got = Get(resp.version().block_ids());
    ASSERT_EQ(static_cast<int64_t>(got.size()), blocks);
    std::vector<absl::string_view> originals(payloads_.begin(), payloads_.end());
    std::vector<absl::string_view> compacted;
    for (const v1::BlockResult& r : got) {
      ASSERT_EQ(r.status().code(), 0) << r.status().message();
      ASSERT_TRUE(r.has_compacted());
      compacted.push_back(r.data());
    }
    std::vector<float> keys(tokens * kDim), values(tokens * kDim);
    std::vector<float> got_keys(blocks * kTokens * kDim), got_values(got_keys.size());
    const int64_t rows = queries.empty() ? 0 : queries.size() / (kLayers * kHeads * kDim);
    for (int l = 0; l < kLayers; ++l) {
      for (int h = 0; h < kHeads; ++h) {
        daemon::GatherHead(shape, originals, {l, h}, keys.data(), values.data());
        index::HeadKv head;
        head.num_tokens = static_cast<int32_t>(tokens);
        head.head_dim = kDim;
        head.keys = keys;
        head.values = values;
        if (rows > 0) {
          head.queries =
              absl::MakeConstSpan(queries.data() + (l * kHeads + h) * rows * kDim, rows * kDim);
        }
        index::CompactOptions options;
        options.rho = rho;
        options.importance = rows > 0 ? index::Importance::kSnapKV : index::Importance::kKeyDiff;
        auto want = index::CompactHead(head, options);
        ASSERT_OK(want);
        daemon::GatherHead(shape, compacted, {l, h}, got_keys.data(), got_values.data());
        for (int64_t s = 0; s < blocks * kTokens; ++s) {
          const v1::CompactedSlots& slots = got[s / kTokens].compacted();
          const int i = static_cast<int>((l * kHeads + h) * kTokens + s % kTokens);
          if (s >= kept) {  // padding
            EXPECT_EQ(slots.positions(i), -1);
            EXPECT_EQ(slots.logit_bias(i), -std::numeric_limits<float>::infinity());
            continue;
          }
          EXPECT_EQ(slots.positions(i), want->positions[s]) << "l" << l << " h" << h << " s" << s;
          EXPECT_FLOAT_EQ(slots.logit_bias(i), want->bias[s]);
          EXPECT_EQ(slots.merged(i), static_cast<uint32_t>(want->merged[s]));
          for (int d = 0; d < kDim; ++d) {
            // Stored as fp16: the direct result rounded the same way.
            EXPECT_EQ(got_keys[s * kDim + d],
                      index::simd::HalfToFloat(index::simd::FloatToHalf(want->keys[s * kDim + d])));
            EXPECT_EQ(
                got_values[s * kDim + d],
                index::simd::HalfToFloat(index::simd::FloatToHalf(want->values[s * kDim + d])));
          }
        }
      }
    }
  }

  ::kvtier::testing::ScopedTempDir tmp_{"compact"};
  const std::string dir_ = tmp_.path();
  std::unique_ptr<daemon::Server> server_;
  std::unique_ptr<Client> client_;
  uint64_t profile_id_ = 0;
  std::vector<std::string> payloads_;
};

TEST_F(CompactionTest, CompactedBlocksMatchADirectComputationAndOriginalsAreDemoted) {
  const std::vector<std::string> ids = PutBlocks(8, "c-");
  const uint64_t context = Open(ids);
  auto resp = Compact(context, 0.3f);  // 128 tokens -> 39 slots: 3 blocks, 9 padding slots
  ASSERT_OK(resp);
  EXPECT_FALSE(resp->existed());
  EXPECT_EQ(resp->version().version(), 1u);
  EXPECT_EQ(resp->context_key().size(), 16u);
  EXPECT_EQ(resp->version().importance(), v1::COMPACT_IMPORTANCE_KEYDIFF);
  ExpectMatchesDirect(*resp, 0.3f, {});
  // The compacted blocks are retained (never evicted by the cache); the
  // originals are not.
  auto stats = client_->Stats();
  ASSERT_OK(stats);
  EXPECT_EQ(stats->retained_bytes(), uint64_t{3} * kLayers * 2 * kHeads * kTokens * kDim * 2);

  v1::LookupRequest lookup;
  lookup.set_profile_id(profile_id_);
  for (const std::string& id : ids) lookup.add_block_ids(id);
  auto where = client_->Lookup(lookup);
  ASSERT_OK(where);
  for (const v1::LookupEntry& e : where->entries()) {
    EXPECT_TRUE(e.present());
    EXPECT_EQ(e.tier(), v1::TIER_NVME) << "originals are demoted, not deleted";
  }
  // Originals read back bit-exact from NVMe.
  std::vector<v1::BlockResult> back = Get(lookup.block_ids());
  for (size_t b = 0; b < back.size(); ++b) {
    EXPECT_EQ(back[b].data(), payloads_[b]);
    EXPECT_FALSE(back[b].has_compacted());
  }

  // The same compaction again is the stored one.
  auto again = Compact(context, 0.3f);
  ASSERT_OK(again);
  EXPECT_TRUE(again->existed());
  EXPECT_EQ(again->version().block_ids(0), resp->version().block_ids(0));
}

TEST_F(CompactionTest, ObservationQueriesSelectBySnapKv) {
  const std::vector<std::string> ids = PutBlocks(4, "q-");
  std::vector<float> queries(kLayers * kHeads * 3 * kDim);
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& q : queries) q = dist(rng);
  auto resp = Compact(Open(ids), 0.5f, queries);
  ASSERT_OK(resp);
  EXPECT_EQ(resp->version().importance(), v1::COMPACT_IMPORTANCE_SNAPKV);
  ExpectMatchesDirect(*resp, 0.5f, queries);
}

TEST_F(CompactionTest, BadInputGetsClearStatusesAndNothingIsStored) {
  const std::vector<std::string> ids = PutBlocks(2, "b-");
  const uint64_t context = Open(ids);
  for (float rho : {0.0f, 1.5f, -0.1f, std::numeric_limits<float>::quiet_NaN()}) {
    auto r = Compact(context, rho);
    ASSERT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument)) << rho;
    EXPECT_THAT(r.status().message(), HasSubstr("retention"));
  }
  v1::CompactContextRequest snapkv;
  snapkv.set_context_id(context);
  snapkv.set_retention(0.5f);
  snapkv.set_importance(v1::COMPACT_IMPORTANCE_SNAPKV);
  auto r = client_->CompactContext(snapkv);
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(r.status().message(), HasSubstr("importance"));
  r = Compact(context, 0.5f, std::vector<float>(7, 1.0f));
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(r.status().message(), HasSubstr("observation_queries"));
  std::vector<float> nan_queries(kLayers * kHeads * kDim, 1.0f);
  nan_queries[3] = std::nanf("");
  r = Compact(context, 0.5f, nan_queries);
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument));
  r = Compact(context + 1, 0.5f);
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(r.status().message(), HasSubstr("context_id"));

  v1::ListContextVersionsRequest list;
  list.set_profile_id(profile_id_);
  auto versions = client_->ListContextVersions(list);
  ASSERT_OK(versions);
  EXPECT_EQ(versions->versions_size(), 0) << "failed calls store nothing";
  list.set_context_key(std::string(16, 'x'));
  EXPECT_THAT(client_->ListContextVersions(list), StatusIs(absl::StatusCode::kNotFound));
  // A key that no context can have (context keys are 16 bytes) is refused
  // by its length, whatever its size, before anything is looked up.
  for (size_t bytes : {size_t{1}, size_t{17}, size_t{4096}}) {
    list.set_context_key(std::string(bytes, 'y'));
    EXPECT_THAT(client_->ListContextVersions(list),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("context_key: ")));
    v1::DropContextVersionRequest drop;
    drop.set_profile_id(profile_id_);
    drop.set_context_key(std::string(bytes, 'y'));
    drop.set_version(1);
    EXPECT_THAT(client_->DropContextVersion(drop),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("16 bytes")));
  }
}

TEST_F(CompactionTest, AContextInUseBySelectIsRefusedUntilReleased) {
  const std::vector<std::string> ids = PutBlocks(4, "s-");
  const uint64_t context = Open(ids);
  grpc::ClientContext ctx;
  auto stream = client_->kvtier_stub()->Select(&ctx);
  v1::SelectRequest req;
  req.set_request_id(1);
  v1::ContextSelect* sel = req.add_contexts();
  sel->set_context_id(context);
  sel->set_scorer(v1::SCORER_RECENCY);
  sel->set_max_blocks(2);
  sel->set_step(1);
  ASSERT_TRUE(stream->Write(req));
  v1::SelectResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_EQ(resp.contexts(0).status().code(), 0) << resp.contexts(0).status().message();
  ASSERT_GT(resp.contexts(0).blocks_size(), 0);

  auto refused = Compact(context, 0.5f);
  ASSERT_THAT(refused, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(refused.status().message(), HasSubstr("in use by Select"));

  v1::ReleaseRequest release;
  release.set_context_id(context);
  ASSERT_OK(client_->Release(release));
  auto done = Compact(context, 0.5f);
  EXPECT_OK(done);
  stream->WritesDone();
  EXPECT_OK(stream->Finish());
}

TEST_F(CompactionTest, VersionsSurviveARestartAndDropsNeverLoseTheLastCopy) {
  const std::vector<std::string> ids = PutBlocks(4, "d-");
  const uint64_t context = Open(ids);
  auto v1c = Compact(context, 0.25f);
  ASSERT_OK(v1c);
  const std::string key = v1c->context_key();

  Restart();
  v1::ListContextVersionsRequest list;
  list.set_profile_id(profile_id_);
  list.set_context_key(key);
  auto versions = client_->ListContextVersions(list);
  ASSERT_OK(versions);
  ASSERT_EQ(versions->versions_size(), 2);
  EXPECT_EQ(versions->versions(0).version(), 0u);
  EXPECT_EQ(versions->versions(0).tokens(), 4u * kTokens);
  EXPECT_EQ(versions->versions(1).version(), 1u);
  std::vector<v1::BlockResult> got = Get(v1c->version().block_ids());
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].has_compacted()) << "slots survive the restart";

  // Drop the only compacted version: allowed (the originals remain), then
  // the originals may not go.
  v1::DropContextVersionRequest drop;
  drop.set_profile_id(profile_id_);
  drop.set_context_key(key);
  drop.set_version(1);
  auto dropped = client_->DropContextVersion(drop);
  ASSERT_OK(dropped);
  EXPECT_EQ(dropped->blocks_deleted(), 1u);
  EXPECT_EQ(Get(v1c->version().block_ids())[0].status().code(),
            static_cast<int>(absl::StatusCode::kNotFound));
  drop.set_version(0);
  auto only_copy = client_->DropContextVersion(drop);
  ASSERT_THAT(only_copy, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(only_copy.status().message(), HasSubstr("only copy"));

  // Compact again (version 2), drop the originals, then version 2 stays.
  const uint64_t reopened = Open(ids);
  auto v2c = Compact(reopened, 0.5f);
  ASSERT_OK(v2c);
  EXPECT_EQ(v2c->version().version(), 2u);
  auto originals = client_->DropContextVersion(drop);
  ASSERT_OK(originals);
  EXPECT_EQ(originals->blocks_deleted(), 4u);
  drop.set_version(2);
  auto last = client_->DropContextVersion(drop);
  ASSERT_THAT(last, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(last.status().message(), HasSubstr("last copy"));
  for (const v1::BlockResult& r : Get(v2c->version().block_ids())) {
    EXPECT_EQ(r.status().code(), 0);
  }
  versions = client_->ListContextVersions(list);
  ASSERT_OK(versions);
  ASSERT_EQ(versions->versions_size(), 3) << "dropped versions keep their records";
  EXPECT_TRUE(versions->versions(0).dropped());
  EXPECT_EQ(versions->versions(0).block_ids_size(), 4) << "the originals' ids stay listed";
  EXPECT_TRUE(versions->versions(1).dropped());
  EXPECT_EQ(versions->versions(1).block_ids_size(), 0);
  EXPECT_FALSE(versions->versions(2).dropped());
  drop.set_version(1);
  auto again = client_->DropContextVersion(drop);
  ASSERT_OK(again);
  EXPECT_EQ(again->blocks_deleted(), 0u) << "dropping twice deletes nothing more";
}

}  // namespace
}  // namespace kvtier
