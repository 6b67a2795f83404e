// Contexts and Select end to end: the daemon in-process, real gRPC over its
// Unix socket, real RocksDB / shared memory / io_uring underneath, block
// summaries computed at put time from the payloads.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "client/client.h"
#include "client/shm/shm_mapping.h"
#include "daemon/config.h"
#include "daemon/select_handler.h"
#include "daemon/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/kernels/simd.h"
#include "tests/integration/test_daemon.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/synthetic.h"
#include "tests/testutil/temp_dir.h"

namespace kvtier {
namespace {

using ::testing::HasSubstr;
using testing::StatusIs;
using SelectStream = grpc::ClientReaderWriter<v1::SelectRequest, v1::SelectResponse>;

// 2 layers x (k|v) x 2 kv heads x 16 tokens x 32 dims x fp16 = 8 KiB.
constexpr int kLayers = 2, kHeads = 2, kTokens = 16, kDim = 32;
constexpr size_t kBlockBytes = size_t{kLayers} * 2 * kHeads * kTokens * kDim * 2;

// A payload whose every key is v (plus a little noise): its v_b is ~v.
std::string Payload(const float* v, uint64_t seed) {
  std::string out(kBlockBytes, '\0');
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.02f);
  auto* h = reinterpret_cast<uint16_t*>(out.data());
  size_t i = 0;
  for (int l = 0; l < kLayers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      for (int head = 0; head < kHeads * kTokens; ++head) {
        for (int d = 0; d < kDim; ++d) {
          const float x = kv == 0 ? v[d] + noise(rng) : 25.0f * noise(rng);
          h[i++] = index::simd::FloatToHalf(x);
        }
      }
    }
  }
  return out;
}

class SelectTest : public ::testing::Test {
 protected:
  void SetUp() override { Start({}); }

  void Start(const std::vector<std::string>& extra) {
    tmp_ = std::make_unique<::kvtier::testing::ScopedTempDir>("sel");
    dir_ = tmp_->path();
    std::vector<std::string> overrides = {
        "limits.max_batch_blocks=256", "index.head_weights_min_blocks=16",
        "leases.default_ttl_ms=60000",
        // The key-key path with the design's masks and stability settings,
        // which these tests exercise (the shipped defaults differ:
        // docs/QUALITY.md).
        "select.default_scorer=keykey", "index.pages_per_chunk=16", "select.page_keep_fraction=0.1",
        "select.local_blocks=4", "select.window_steps=20", "select.theta=0.5",
        "select.stability_weight=0.3"};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    auto daemon = testing::StartTestDaemon(dir_, overrides);
    ASSERT_OK(daemon);
    server_ = std::move(daemon->server);
    client_ = std::move(daemon->client);
    v1::ModelProfile profile;
    profile.set_name("select-test");
    profile.set_revision("1");
    profile.set_num_layers(kLayers);
    profile.set_num_kv_heads(kHeads);
    profile.set_head_dim(kDim);
    profile.set_block_size_tokens(kTokens);
    profile.set_dtype(v1::DTYPE_FP16);
    auto registered = client_->RegisterProfile(profile);
    ASSERT_OK(registered);
    ASSERT_EQ(registered->block_size_bytes(), kBlockBytes);
    profile_id_ = registered->profile_id();
    auto arena = client_->OpenArena();
    ASSERT_OK(arena);
    std::string err;
    arena_ = client::ShmArenaView::Open(client_->ArenaSource(*arena), arena->size_bytes(), &err);
    ASSERT_NE(arena_, nullptr) << err;
  }

  void TearDown() override {
    arena_.reset();
    client_.reset();
    server_.reset();
    tmp_.reset();
  }

  // Stores one block per vector of ctx under ids "<prefix>-<i>".
  std::vector<std::string> PutContext(const testing::SyntheticContext& ctx,
                                      const std::string& prefix) {
    std::vector<std::string> ids;
    v1::PutBlocksRequest req;
    req.set_profile_id(profile_id_);
    std::vector<v1::PutBlocksRequest> reqs;
    for (int64_t b = 0; b < ctx.num_blocks; ++b) {
      std::string id = prefix + "-" + std::to_string(b);
      std::string data = Payload(&ctx.vectors[b * kDim], std::hash<std::string>()(id));
      payloads_[id] = data;
      v1::BlockPut* put = req.add_blocks();
      put->set_block_id(id);
      put->set_data(std::move(data));
      ids.push_back(id);
      if (req.blocks_size() == 64) {
        reqs.push_back(req);
        req.clear_blocks();
      }
    }
    if (req.blocks_size() > 0) reqs.push_back(req);
    auto put = client_->PutBlocks(reqs);
    EXPECT_OK(put);
    if (put.ok()) {
      for (const auto& r : put->results()) EXPECT_EQ(r.status().code(), 0) << r.status().message();
    }
    return ids;
  }

  static testing::SyntheticContext Synthetic(int64_t blocks, uint64_t seed, int planted = 8) {
    testing::SyntheticContextOptions o;
    o.num_blocks = blocks;
    o.dim = kDim;
    o.num_planted = planted;
    o.planted_noise = 0.2f;
    o.topic_run_min = 8;
    o.topic_run_max = 32;
    o.seed = seed;
    return testing::MakeSyntheticContext(o);
  }

  absl::StatusOr<uint64_t> Open(const std::vector<std::vector<std::string>>& segments,
                                uint32_t ttl_ms = 0) {
    grpc::ClientContext ctx;
    v1::OpenContextRequest req;
    req.set_profile_id(profile_id_);
    req.set_lease_ttl_ms(ttl_ms);
    for (const auto& ids : segments) {
      v1::Segment* s = req.add_segments();
      for (const auto& id : ids) s->add_block_ids(id);
    }
    v1::OpenContextResponse resp;
    grpc::Status st = client_->kvtier_stub()->OpenContext(&ctx, req, &resp);
    if (!st.ok()) return FromGrpcStatus(st);
    return resp.context_id();
  }

  static v1::ContextSelect Entry(uint64_t context_id, const std::vector<float>& anchor,
                                 uint32_t max_blocks) {
    v1::ContextSelect e;
    e.set_context_id(context_id);
    for (float x : anchor) e.add_anchor(x);
    e.set_max_blocks(max_blocks);
    return e;
  }

  // Sends one request on a fresh stream and returns its response.
  v1::SelectResponse SelectOnce(const std::vector<v1::ContextSelect>& entries,
                                uint64_t request_id = 1) {
    grpc::ClientContext ctx;
    auto stream = client_->kvtier_stub()->Select(&ctx);
    v1::SelectRequest req;
    req.set_request_id(request_id);
    for (const auto& e : entries) *req.add_contexts() = e;
    v1::SelectResponse resp;
    EXPECT_TRUE(stream->Write(req));
    EXPECT_TRUE(stream->Read(&resp));
    EXPECT_TRUE(stream->WritesDone());
    EXPECT_OK(stream->Finish());
    return resp;
  }

  // Every RESIDENT handle of sel addresses exactly the bytes that were put.
  void ExpectHandlesHoldPutBytes(const v1::ContextSelection& sel) {
    for (const auto& b : sel.blocks()) {
      ASSERT_EQ(b.residency(), v1::RESIDENCY_RESIDENT) << b.block_id();
      auto bytes = arena_->Slot(b.handle().offset_bytes(), b.handle().size_bytes());
      ASSERT_EQ(bytes.size(), kBlockBytes);
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                payloads_.at(b.block_id()))
          << b.block_id();
    }
  }

  uint64_t PinnedBytes() {
    auto stats = client_->Stats();
    EXPECT_OK(stats);
    return stats.ok() ? stats->tiers(0).pinned_bytes() : 0;
  }

  std::unique_ptr<::kvtier::testing::ScopedTempDir> tmp_;
  std::string dir_;
  std::unique_ptr<daemon::Server> server_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<client::ShmArenaView> arena_;
  uint64_t profile_id_ = 0;
  std::map<std::string, std::string> payloads_;
};

std::vector<uint32_t> Positions(const v1::ContextSelection& sel) {
  std::vector<uint32_t> out;
  for (const auto& b : sel.blocks()) out.push_back(b.position());
  return out;
}

TEST_F(SelectTest, FindsPlantedBlocksWithinBudgetAndHandlesHoldTheirBytes) {
  // Every block competes (the masks keep all of them as candidates), so
  // the planted blocks must be the ones chosen. With the default fractions
  // the grid mask keeps one of the two documents at this budget.
  TearDown();
  Start({"select.page_keep_fraction=0.04"});
  auto synthetic = Synthetic(256, 11);
  auto ids = PutContext(synthetic, "doc");
  auto ctx = Open({{ids.begin(), ids.begin() + 128}, {ids.begin() + 128, ids.end()}});
  ASSERT_OK(ctx);
  auto resp = SelectOnce({Entry(*ctx, synthetic.anchor, 16)}, 42);
  EXPECT_EQ(resp.request_id(), 42u);
  ASSERT_EQ(resp.contexts_size(), 1);
  const auto& sel = resp.contexts(0);
  ASSERT_EQ(sel.status().code(), 0) << sel.status().message();
  EXPECT_EQ(sel.context_id(), *ctx);
  std::vector<uint32_t> got = Positions(sel);
  EXPECT_LE(got.size(), 16u);
  EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
  std::set<uint32_t> chosen(got.begin(), got.end());
  EXPECT_TRUE(chosen.count(0)) << "sink";
  for (uint32_t p = 252; p < 256; ++p) EXPECT_TRUE(chosen.count(p)) << "local " << p;
  for (int64_t p : synthetic.planted) EXPECT_TRUE(chosen.count(p)) << "planted " << p;
  for (const auto& b : sel.blocks()) {
    EXPECT_EQ(b.block_id(), ids[b.position()]);
    EXPECT_GE(b.score(), 0.0f);
    EXPECT_LE(b.score(), 1.0f);
  }
  ExpectHandlesHoldPutBytes(sel);
  EXPECT_EQ(PinnedBytes(), got.size() * kBlockBytes);
  auto stats = client_->Stats();
  EXPECT_EQ(stats->open_contexts(), 1u);
  // Head weights were estimated from the stored blocks.
  auto profile = client_->GetProfile(profile_id_);
  ASSERT_OK(profile);
  EXPECT_GE(profile->head_weights_version(), 1u);
  EXPECT_EQ(profile->head_weights_size(), kLayers * kHeads);
}

TEST_F(SelectTest, EachSelectReplacesThePreviousPinsAndReleaseOrCloseFreesThem) {
  auto synthetic = Synthetic(128, 12);
  auto ids = PutContext(synthetic, "doc");
  auto ctx = Open({ids});
  ASSERT_OK(ctx);
  grpc::ClientContext call;
  auto stream = client_->kvtier_stub()->Select(&call);
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal;
  for (int step = 1; step <= 4; ++step) {
    std::vector<float> anchor(kDim);
    for (float& x : anchor) x = normal(rng);
    v1::SelectRequest req;
    req.set_request_id(step);
    *req.add_contexts() = Entry(*ctx, anchor, 12);
    req.mutable_contexts(0)->set_step(step * 10);
    ASSERT_TRUE(stream->Write(req));
    v1::SelectResponse resp;
    ASSERT_TRUE(stream->Read(&resp));
    ASSERT_EQ(resp.request_id(), static_cast<uint64_t>(step));
    ASSERT_EQ(resp.contexts(0).status().code(), 0) << resp.contexts(0).status().message();
    ExpectHandlesHoldPutBytes(resp.contexts(0));
    // Only the latest set stays pinned.
    EXPECT_EQ(PinnedBytes(), resp.contexts(0).blocks_size() * kBlockBytes) << step;
    v1::ListContextsResponse list;
    grpc::ClientContext lc;
    ASSERT_OK(client_->admin_stub()->ListContexts(&lc, {}, &list));
    ASSERT_EQ(list.contexts_size(), 1);
    EXPECT_EQ(list.contexts(0).context_id(), *ctx);
    EXPECT_EQ(list.contexts(0).num_blocks(), 128u);
    EXPECT_EQ(list.contexts(0).pinned_blocks(),
              static_cast<uint32_t>(resp.contexts(0).blocks_size()));
    EXPECT_EQ(list.contexts(0).last_step(), static_cast<uint64_t>(step * 10));
  }
  ASSERT_TRUE(stream->WritesDone());
  ASSERT_OK(stream->Finish());
  // Pins belong to the context, not to the stream.
  EXPECT_EQ(PinnedBytes(), 12 * kBlockBytes);
  v1::ReleaseRequest release;
  release.set_context_id(*ctx);
  auto released = client_->Release(release);
  ASSERT_OK(released);
  EXPECT_EQ(released->blocks_unpinned(), 12u);
  EXPECT_EQ(PinnedBytes(), 0u);
  // Select again, then CloseContext frees the pins too.
  auto resp = SelectOnce({Entry(*ctx, synthetic.anchor, 12)});
  ASSERT_EQ(resp.contexts(0).status().code(), 0);
  EXPECT_EQ(PinnedBytes(), 12 * kBlockBytes);
  grpc::ClientContext cc;
  v1::CloseContextRequest close;
  close.set_context_id(*ctx);
  v1::CloseContextResponse closed;
  ASSERT_OK(client_->kvtier_stub()->CloseContext(&cc, close, &closed));
  EXPECT_EQ(PinnedBytes(), 0u);
  EXPECT_EQ(client_->Stats()->open_contexts(), 0u);
  EXPECT_THAT(client_->Release(release), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(SelectTest, BadEntriesFailAloneAndTheStreamKeepsWorking) {
  auto synthetic = Synthetic(64, 13);
  auto ids = PutContext(synthetic, "doc");
  auto ctx = Open({ids});
  auto other = Open({ids});
  ASSERT_OK(ctx);
  ASSERT_OK(other);
  const std::vector<float>& a = synthetic.anchor;
  std::vector<float> nan_anchor = a;
  nan_anchor[3] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> inf_anchor = a;
  inf_anchor[5] = std::numeric_limits<float>::infinity();
  std::vector<v1::ContextSelect> entries = {
      Entry(*ctx, a, 8),                                                // 0 good
      Entry(*other, std::vector<float>(a.begin(), a.begin() + 16), 8),  // 1 short anchor
      Entry(*other, nan_anchor, 8),                                     // 2 NaN
      Entry(*other, inf_anchor, 8),                                     // 3 Inf
      Entry(*other, a, 0),                                              // 4 budget 0
      Entry(*other, a, 8),     // 5 no budget (cleared below)
      Entry(987654321, a, 8),  // 6 unknown context
      Entry(*ctx, a, 8),       // 7 named twice
      Entry(*other, a, 2),     // 8 below sink + local
      Entry(*other, {}, 8),    // 9 no anchor
  };
  entries[5].clear_max_blocks();
  grpc::ClientContext call;
  auto stream = client_->kvtier_stub()->Select(&call);
  v1::SelectRequest req;
  req.set_request_id(1);
  for (const auto& e : entries) *req.add_contexts() = e;
  ASSERT_TRUE(stream->Write(req));
  v1::SelectResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_EQ(resp.contexts_size(), static_cast<int>(entries.size()));
  struct Want {
    int code;
    const char* field;
  };
  const std::vector<Want> want = {
      {0, ""},
      {grpc::StatusCode::INVALID_ARGUMENT, "contexts[1].anchor: 16 values"},
      {grpc::StatusCode::INVALID_ARGUMENT, "contexts[2].anchor[3]"},
      {grpc::StatusCode::INVALID_ARGUMENT, "contexts[3].anchor[5]"},
      {grpc::StatusCode::INVALID_ARGUMENT, "contexts[4].max_blocks"},
      {grpc::StatusCode::INVALID_ARGUMENT, "contexts[5].max_blocks: no budget"},
      {grpc::StatusCode::NOT_FOUND, "contexts[6].context_id"},
      {grpc::StatusCode::INVALID_ARGUMENT, "contexts[7].context_id"},
      {grpc::StatusCode::INVALID_ARGUMENT, "contexts[8].max_blocks"},
      {grpc::StatusCode::INVALID_ARGUMENT, "contexts[9].anchor: 0 values (required"},
  };
  for (size_t i = 0; i < want.size(); ++i) {
    const auto& sel = resp.contexts(i);
    EXPECT_EQ(sel.status().code(), want[i].code) << i << ": " << sel.status().message();
    EXPECT_THAT(sel.status().message(), HasSubstr(want[i].field)) << i;
    if (i > 0) EXPECT_EQ(sel.blocks_size(), 0) << i;
  }
  EXPECT_EQ(resp.contexts(0).blocks_size(), 8);
  // Steps never go back; the same stream still answers.
  req.Clear();
  req.set_request_id(2);
  *req.add_contexts() = Entry(*other, a, 8);
  req.mutable_contexts(0)->set_step(100);
  ASSERT_TRUE(stream->Write(req));
  ASSERT_TRUE(stream->Read(&resp));
  EXPECT_EQ(resp.contexts(0).status().code(), 0) << resp.contexts(0).status().message();
  req.mutable_contexts(0)->set_step(99);
  req.set_request_id(3);
  ASSERT_TRUE(stream->Write(req));
  ASSERT_TRUE(stream->Read(&resp));
  EXPECT_EQ(resp.request_id(), 3u);
  EXPECT_EQ(resp.contexts(0).status().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(resp.contexts(0).status().message(), HasSubstr("contexts[0].step"));
  // A scorer the contexts were not built for.
  req.mutable_contexts(0)->set_step(0);
  req.mutable_contexts(0)->set_scorer(v1::SCORER_QUEST);
  for (float x : a) req.mutable_contexts(0)->add_query(x);
  ASSERT_TRUE(stream->Write(req));
  ASSERT_TRUE(stream->Read(&resp));
  EXPECT_EQ(resp.contexts(0).status().code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(resp.contexts(0).status().message(), HasSubstr("index.keep_summaries"));
  // Scorers that need no anchor.
  req.mutable_contexts(0)->set_scorer(v1::SCORER_RECENCY);
  req.mutable_contexts(0)->clear_anchor();
  req.mutable_contexts(0)->clear_query();
  ASSERT_TRUE(stream->Write(req));
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_EQ(resp.contexts(0).status().code(), 0) << resp.contexts(0).status().message();
  // Sink, local window, and otherwise the most recent blocks.
  std::vector<uint32_t> recent = Positions(resp.contexts(0));
  ASSERT_EQ(recent.size(), 8u);
  EXPECT_EQ(recent.front(), 0u);
  for (size_t i = 1; i < recent.size(); ++i) EXPECT_GE(recent[i], 48u) << i;
  EXPECT_EQ(recent.back(), 63u);
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_OK(stream->Finish());
}

TEST_F(SelectTest, ResponsesStayInOrderWhenTheClientReadsLate) {
  auto synthetic = Synthetic(64, 14);
  auto ids = PutContext(synthetic, "doc");
  auto ctx = Open({ids});
  ASSERT_OK(ctx);
  grpc::ClientContext call;
  auto stream = client_->kvtier_stub()->Select(&call);
  // More requests than select.max_queued_responses before reading any.
  constexpr int kRequests = 30;
  for (int i = 1; i <= kRequests; ++i) {
    v1::SelectRequest req;
    req.set_request_id(i);
    *req.add_contexts() = Entry(*ctx, synthetic.anchor, 8);
    ASSERT_TRUE(stream->Write(req));
  }
  ASSERT_TRUE(stream->WritesDone());
  v1::SelectResponse resp;
  for (int i = 1; i <= kRequests; ++i) {
    ASSERT_TRUE(stream->Read(&resp)) << i;
    EXPECT_EQ(resp.request_id(), static_cast<uint64_t>(i));
    EXPECT_EQ(resp.contexts(0).status().code(), 0);
  }
  EXPECT_FALSE(stream->Read(&resp));
  EXPECT_OK(stream->Finish());
  // A cancelled stream leaves the daemon serving.
  {
    grpc::ClientContext cancelled;
    auto s = client_->kvtier_stub()->Select(&cancelled);
    v1::SelectRequest req;
    *req.add_contexts() = Entry(*ctx, synthetic.anchor, 8);
    ASSERT_TRUE(s->Write(req));
    cancelled.TryCancel();
    EXPECT_EQ(s->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_EQ(SelectOnce({Entry(*ctx, synthetic.anchor, 8)}).contexts(0).status().code(), 0);
}

TEST_F(SelectTest, ContextRpcsNameWhatIsWrong) {
  auto synthetic = Synthetic(32, 15);
  auto ids = PutContext(synthetic, "doc");
  std::vector<std::string> with_missing = {ids[0], "never-put-1", ids[1], "never-put-2"};
  auto st = Open({with_missing}).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(st.message(), HasSubstr("2 of 4 blocks are not stored"));
  EXPECT_THAT(st.message(),
              HasSubstr("segments[0].block_ids[1] = " + absl::BytesToHexString("never-put-1")));
  EXPECT_THAT(st.message(), HasSubstr("segments[0].block_ids[3]"));
  st = Open({{}}).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument));
  {
    grpc::ClientContext c;
    v1::OpenContextRequest req;
    req.set_profile_id(999);
    req.add_segments()->add_block_ids(ids[0]);
    v1::OpenContextResponse resp;
    EXPECT_EQ(client_->kvtier_stub()->OpenContext(&c, req, &resp).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  // Append: decode-time blocks join the local window.
  auto ctx = Open({{ids.begin(), ids.begin() + 24}});
  ASSERT_OK(ctx);
  {
    grpc::ClientContext c;
    v1::AppendBlocksRequest req;
    req.set_context_id(*ctx);
    for (int i = 24; i < 32; ++i) req.add_block_ids(ids[i]);
    v1::AppendBlocksResponse resp;
    ASSERT_OK(client_->kvtier_stub()->AppendBlocks(&c, req, &resp));
    EXPECT_EQ(resp.num_blocks(), 32u);
  }
  {
    grpc::ClientContext c;
    v1::AppendBlocksRequest req;
    req.set_context_id(*ctx);
    req.add_block_ids("never-put");
    v1::AppendBlocksResponse resp;
    grpc::Status s = client_->kvtier_stub()->AppendBlocks(&c, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(s.error_message(), HasSubstr("block_ids[0]"));
  }
  auto resp = SelectOnce({Entry(*ctx, synthetic.anchor, 8)});
  ASSERT_EQ(resp.contexts(0).status().code(), 0);
  std::set<uint32_t> chosen;
  for (uint32_t p : Positions(resp.contexts(0))) chosen.insert(p);
  for (uint32_t p = 28; p < 32; ++p) EXPECT_TRUE(chosen.count(p)) << p;
  {
    grpc::ClientContext c;
    v1::CloseContextRequest req;
    req.set_context_id(*ctx + 1000);
    v1::CloseContextResponse r;
    EXPECT_EQ(client_->kvtier_stub()->CloseContext(&c, req, &r).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
}

TEST_F(SelectTest, BlocksThatFindNoDeviceSlotArePending) {
  TearDown();
  // 10 device slots only.
  Start({"tiers.device.capacity_bytes=80KiB"});
  auto synthetic = Synthetic(64, 16);
  auto ids = PutContext(synthetic, "doc");
  auto first = Open({ids});
  auto second = Open({ids});
  ASSERT_OK(first);
  ASSERT_OK(second);
  // Sinks + local = 5 of the same blocks in both; 8 distinct + 5 > 10.
  auto a = SelectOnce({Entry(*first, synthetic.anchor, 10)});
  ASSERT_EQ(a.contexts(0).status().code(), 0);
  ExpectHandlesHoldPutBytes(a.contexts(0));
  std::vector<float> away(kDim);
  for (int d = 0; d < kDim; ++d) away[d] = -synthetic.anchor[d];
  auto b = SelectOnce({Entry(*second, away, 10)});
  ASSERT_EQ(b.contexts(0).status().code(), 0) << b.contexts(0).status().message();
  int pending = 0, resident = 0;
  for (const auto& blk : b.contexts(0).blocks()) {
    if (blk.residency() == v1::RESIDENCY_PENDING) {
      ++pending;
      EXPECT_FALSE(blk.has_handle());
    } else {
      ++resident;
      EXPECT_EQ(blk.residency(), v1::RESIDENCY_RESIDENT);
    }
  }
  EXPECT_GT(pending, 0);
  EXPECT_GT(resident, 0);
  // Once the first context lets go, the second one gets every block.
  v1::ReleaseRequest release;
  release.set_context_id(*first);
  ASSERT_OK(client_->Release(release));
  b = SelectOnce({Entry(*second, away, 10)});
  ASSERT_EQ(b.contexts(0).status().code(), 0);
  ExpectHandlesHoldPutBytes(b.contexts(0));
}

// The Select handler never reads NVMe: blocks whose only copy is there come
// back PENDING and are brought into host memory by the prefetcher; with
// wait_ms the handler waits for them and answers them RESIDENT.
// Run with both placements: 16 host blocks, the rest on NVMe; the blocks
// prefetched for one Select (up to 10 here) must not evict each other: under LRU
// they are the most recently used host copies, under KeyDiff they are in
// the tier's newest half, which it never samples.
class SelectPlacementTest : public SelectTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(SelectPlacementTest, NvmeOnlyBlocksArePendingUntilPrefetchedAndWaitMsWaitsForThem) {
  TearDown();
  Start({"tiers.host.capacity_bytes=128KiB", std::string("tiers.placement=") + GetParam()});
  auto synthetic = Synthetic(64, 16);
  auto ids = PutContext(synthetic, "doc");
  auto ctx = Open({ids});
  ASSERT_OK(ctx);
  v1::ContextSelect entry = Entry(*ctx, synthetic.anchor, 10);
  entry.set_step(1);
  auto a = SelectOnce({entry});
  ASSERT_EQ(a.contexts(0).status().code(), 0) << a.contexts(0).status().message();
  int pending = 0;
  for (const auto& blk : a.contexts(0).blocks()) {
    pending += blk.residency() == v1::RESIDENCY_PENDING;
    EXPECT_EQ(blk.has_handle(), blk.residency() == v1::RESIDENCY_RESIDENT);
  }
  EXPECT_GT(pending, 0) << "the first block (a sink) was demoted to NVMe by later puts";
  for (const auto& blk : a.contexts(0).blocks()) {
    if (blk.residency() != v1::RESIDENCY_RESIDENT) continue;
    auto bytes = arena_->Slot(blk.handle().offset_bytes(), blk.handle().size_bytes());
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
              payloads_.at(blk.block_id()));
  }
  entry.set_step(2);
  entry.set_wait_ms(5000);
  auto b = SelectOnce({entry});
  ASSERT_EQ(b.contexts(0).status().code(), 0) << b.contexts(0).status().message();
  for (const auto& blk : b.contexts(0).blocks()) {
    v1::LookupRequest lookup;
    lookup.set_profile_id(profile_id_);
    lookup.add_block_ids(blk.block_id());
    auto where = client_->Lookup(lookup);
    EXPECT_EQ(blk.residency(), v1::RESIDENCY_RESIDENT)
        << blk.position() << " now in tier "
        << (where.ok() ? static_cast<int>(where->entries(0).tier()) : -1);
  }
  ExpectHandlesHoldPutBytes(b.contexts(0));
  entry.set_step(3);
  entry.set_wait_ms(daemon::kMaxSelectWaitMs + 1);
  auto c = SelectOnce({entry});
  EXPECT_EQ(c.contexts(0).status().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(c.contexts(0).status().message().find("wait_ms"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Placements, SelectPlacementTest,
                         ::testing::Values("lru", "keydiff", "stability"));

// select.inline_promotion_bytes: a Select request copies at most that much
// host memory -> arena on its own thread; its other chosen blocks come back
// PENDING and the prefetcher's thread promotes them, so the next step
// finds them RESIDENT without copying. An entry with wait_ms is not held
// to the budget.
TEST_F(SelectTest, PromotionsPastTheInlineBudgetAreDeferredThenResident) {
  TearDown();
  Start({"select.inline_promotion_bytes=" + std::to_string(2 * kBlockBytes)});
  // A fresh context of 64 blocks (all in host memory) and an entry asking
  // for 10 of them.
  auto fresh = [&](uint64_t seed, const std::string& prefix) {
    auto synthetic = Synthetic(64, seed);
    auto ctx = Open({PutContext(synthetic, prefix)});
    EXPECT_OK(ctx);
    return Entry(ctx.ok() ? *ctx : 0, synthetic.anchor, 10);
  };
  v1::ContextSelect entry = fresh(16, "doc");
  entry.set_step(1);
  auto a = SelectOnce({entry});
  ASSERT_EQ(a.contexts(0).status().code(), 0) << a.contexts(0).status().message();
  int resident = 0, pending = 0;
  std::set<std::string> first;
  for (const auto& blk : a.contexts(0).blocks()) {
    resident += blk.residency() == v1::RESIDENCY_RESIDENT;
    pending += blk.residency() == v1::RESIDENCY_PENDING;
    EXPECT_EQ(blk.has_handle(), blk.residency() == v1::RESIDENCY_RESIDENT);
    first.insert(blk.block_id());
  }
  EXPECT_EQ(a.contexts(0).blocks_size(), 10);
  EXPECT_LE(resident, 2) << "promoted past the budget on the Select thread";
  EXPECT_EQ(resident + pending, 10);
  // The deferred promotions finish off the response path.
  server_->runtime()->prefetcher()->WaitIdle();
  EXPECT_GE(server_->runtime()->prefetcher()->promoted_to_device(), static_cast<uint64_t>(pending));
  entry.set_step(2);
  auto b = SelectOnce({entry});
  ASSERT_EQ(b.contexts(0).status().code(), 0) << b.contexts(0).status().message();
  int kept = 0;
  for (const auto& blk : b.contexts(0).blocks()) {
    if (!first.count(blk.block_id())) continue;  // newly chosen: may be deferred again
    ++kept;
    EXPECT_EQ(blk.residency(), v1::RESIDENCY_RESIDENT) << blk.block_id();
    if (blk.residency() != v1::RESIDENCY_RESIDENT) continue;
    auto bytes = arena_->Slot(blk.handle().offset_bytes(), blk.handle().size_bytes());
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
              payloads_.at(blk.block_id()));
  }
  EXPECT_GE(kept, 8);
  // wait_ms: the entry prefers waiting to PENDING; every block is copied.
  v1::ContextSelect waiting = fresh(17, "other");
  waiting.set_wait_ms(5000);
  auto c = SelectOnce({waiting});
  ASSERT_EQ(c.contexts(0).status().code(), 0) << c.contexts(0).status().message();
  ExpectHandlesHoldPutBytes(c.contexts(0));
}

// tiers.placement = stability: blocks Select keeps wanting stay in memory
// under put pressure that demotes the blocks no Select wanted, even when
// they never get an arena slot (context a pins all 6), so no handle request
// ever touches their host copies; afterwards, with the arena free again,
// Select serves them from memory. LRU, the contrast, ranks those host
// copies by their put and demotes them with the second round of pressure
// (checked then only: from the next Select on the prefetcher brings them
// back in the background, racing the puts). Write-through: every block
// also has an NVMe copy, so dropping a host copy costs no write and a's
// arena copies can make room.
class SelectWantedTest : public SelectTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(SelectWantedTest, ABlockSelectKeepsWantingSurvivesPressureThatDemotesUnwantedOnes) {
  const bool stability = std::string(GetParam()) == "stability";
  TearDown();
  // No rising-block prefetches: only Select's wants and the puts move blocks.
  Start({"tiers.device.capacity_bytes=48KiB", "tiers.host.capacity_bytes=128KiB",
         "tiers.nvme.write_through=true", "select.max_prefetch_blocks=0",
         std::string("tiers.placement=") + GetParam()});
  auto pin_all = Synthetic(6, 3);
  auto a = Open({PutContext(pin_all, "a")});
  ASSERT_OK(a);
  v1::SelectResponse first = SelectOnce({Entry(*a, pin_all.anchor, 6)});
  ASSERT_EQ(first.contexts(0).status().code(), 0) << first.contexts(0).status().message();
  ASSERT_EQ(first.contexts(0).blocks_size(), 6);
  for (const auto& blk : first.contexts(0).blocks()) {
    ASSERT_EQ(blk.residency(), v1::RESIDENCY_RESIDENT) << blk.position();
  }
  auto synthetic = Synthetic(8, 4);
  const std::vector<std::string> ids = PutContext(synthetic, "b");
  auto b = Open({ids});
  ASSERT_OK(b);
  auto tier_of = [&](const std::string& id) {
    v1::LookupRequest lookup;
    lookup.set_profile_id(profile_id_);
    lookup.add_block_ids(id);
    auto where = client_->Lookup(lookup);
    EXPECT_OK(where);
    return where.ok() ? where->entries(0).tier() : v1::TIER_UNSPECIFIED;
  };
  // Budget 5 = sink + 4 local blocks: blocks 0 and 4..7, every step.
  const std::set<uint32_t> wanted = {0, 4, 5, 6, 7};
  v1::ContextSelect entry = Entry(*b, synthetic.anchor, 5);
  for (int round = 1; round <= 4; ++round) {
    entry.set_step(round);
    v1::SelectResponse r = SelectOnce({entry});
    ASSERT_EQ(r.contexts(0).status().code(), 0) << r.contexts(0).status().message();
    std::set<uint32_t> chosen;
    for (const auto& blk : r.contexts(0).blocks()) {
      chosen.insert(blk.position());
      EXPECT_EQ(blk.residency(), v1::RESIDENCY_PENDING) << "no arena slot is free";
    }
    ASSERT_EQ(chosen, wanted);
    // 8 blocks nobody selects, half the host tier.
    PutContext(Synthetic(8, 100 + round), "noise" + std::to_string(round));
    if (stability) {
      for (uint32_t p : wanted) EXPECT_EQ(tier_of(ids[p]), v1::TIER_HOST) << round << "/" << p;
    } else if (round == 2) {
      for (uint32_t p : wanted) EXPECT_EQ(tier_of(ids[p]), v1::TIER_NVME) << round << "/" << p;
    }
  }
  for (int p = 1; p <= 3; ++p) EXPECT_EQ(tier_of(ids[p]), v1::TIER_NVME) << "never wanted: " << p;
  EXPECT_EQ(tier_of("noise1-0"), v1::TIER_NVME);
  if (!stability) return;

  // The arena free again: the wanted blocks come from memory.
  v1::ReleaseRequest release;
  release.set_context_id(*a);
  ASSERT_OK(client_->Release(release));
  entry.set_step(5);
  v1::SelectResponse last = SelectOnce({entry});
  ASSERT_EQ(last.contexts(0).status().code(), 0) << last.contexts(0).status().message();
  ASSERT_EQ(last.contexts(0).blocks_size(), 5);
  ExpectHandlesHoldPutBytes(last.contexts(0));
}

INSTANTIATE_TEST_SUITE_P(Placements, SelectWantedTest, ::testing::Values("stability", "lru"));

TEST_F(SelectTest, ConcurrentStreamsOverSharedContextsStayConsistent) {
  constexpr int kContexts = 16, kThreads = 8, kPerRequest = 8, kRequests = 10;
  std::vector<uint64_t> contexts;
  std::vector<testing::SyntheticContext> data;
  std::vector<std::vector<std::string>> ids;
  for (int c = 0; c < kContexts; ++c) {
    data.push_back(Synthetic(64, 100 + c, 4));
    ids.push_back(PutContext(data.back(), "ctx" + std::to_string(c)));
    auto ctx = Open({ids.back()});
    ASSERT_OK(ctx);
    contexts.push_back(*ctx);
  }
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      grpc::ClientContext call;
      auto stream = client_->kvtier_stub()->Select(&call);
      for (int r = 0; r < kRequests; ++r) {
        v1::SelectRequest req;
        req.set_request_id(t * 1000 + r);
        // Overlapping sets in different orders across threads.
        for (int k = 0; k < kPerRequest; ++k) {
          const int c = (t * 2 + (t % 2 == 0 ? k : kPerRequest - 1 - k)) % kContexts;
          *req.add_contexts() = Entry(contexts[c], data[c].anchor, 8 + r % 4);
        }
        v1::SelectResponse resp;
        if (!stream->Write(req) || !stream->Read(&resp)) {
          ++failures;
          return;
        }
        if (resp.request_id() != req.request_id() || resp.contexts_size() != kPerRequest) {
          ++failures;
          continue;
        }
        for (int k = 0; k < kPerRequest; ++k) {
          const auto& sel = resp.contexts(k);
          const int c =
              std::find(contexts.begin(), contexts.end(), sel.context_id()) - contexts.begin();
          if (sel.context_id() != req.contexts(k).context_id() || sel.status().code() != 0 ||
              sel.blocks_size() > 8 + r % 4 || sel.blocks(0).position() != 0 ||
              sel.blocks(sel.blocks_size() - 1).position() != 63) {
            ++failures;
            continue;
          }
          for (const auto& b : sel.blocks()) {
            auto bytes = arena_->Slot(b.handle().offset_bytes(), b.handle().size_bytes());
            if (b.block_id() != ids[c][b.position()] || b.residency() != v1::RESIDENCY_RESIDENT ||
                bytes.size() != kBlockBytes ||
                std::memcmp(bytes.data(), payloads_.at(b.block_id()).data(), kBlockBytes) != 0) {
              ++failures;
            }
          }
        }
      }
      stream->WritesDone();
      if (!stream->Finish().ok()) ++failures;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  // Every context holds exactly one pinned set; releasing them all unpins
  // everything.
  v1::ListContextsResponse list;
  grpc::ClientContext lc;
  ASSERT_OK(client_->admin_stub()->ListContexts(&lc, {}, &list));
  EXPECT_EQ(list.contexts_size(), kContexts);
  for (uint64_t c : contexts) {
    v1::ReleaseRequest release;
    release.set_context_id(c);
    auto released = client_->Release(release);
    ASSERT_OK(released);
    EXPECT_GE(released->blocks_unpinned(), 5u);
  }
  EXPECT_EQ(PinnedBytes(), 0u);
}

}  // namespace
}  // namespace kvtier
