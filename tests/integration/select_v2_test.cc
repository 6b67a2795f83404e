// Selection v2 end to end: calibrated profiles, per-layer anchors computed
// by the C++ client's AnchorBuilder, head queries for the mass scorer, and
// the status of every bad anchor or query. The daemon runs in process on its
// shipped selection defaults (default scorer: mass) with per-layer summaries
// on; real gRPC over its Unix socket, real RocksDB underneath.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "client/anchor.h"
#include "client/client.h"
#include "daemon/config.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/runtime.h"
#include "daemon/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/kernels/simd.h"
#include "tests/integration/test_daemon.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

namespace kvtier {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::StatusIs;

constexpr int kLayers = 2, kKvHeads = 2, kQHeads = 4, kTokens = 16, kDim = 32;
constexpr int kBlocks = 40, kPlanted = 7;

// Keys and values N(0, 0.5) in fp16, layout [layer][k|v][kv_head][token][dim].
// With `planted`, token 5 of (layer 1, KV head 1) is 4 * query.
std::string Payload(uint64_t seed, const std::vector<float>* planted) {
  std::string out(size_t{kLayers} * 2 * kKvHeads * kTokens * kDim * 2, '\0');
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 0.5f);
  auto* h = reinterpret_cast<uint16_t*>(out.data());
  size_t i = 0;
  for (int l = 0; l < kLayers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      for (int head = 0; head < kKvHeads; ++head) {
        for (int t = 0; t < kTokens; ++t) {
          for (int d = 0; d < kDim; ++d) {
            float x = n(rng);
            if (planted && kv == 0 && l == 1 && head == 1 && t == 5) x = 4.0f * (*planted)[d];
            h[i++] = index::simd::FloatToHalf(x);
          }
        }
      }
    }
  }
  return out;
}

v1::SelectionCalibration Calibration() {
  v1::SelectionCalibration c;
  c.set_num_q_heads(kQHeads);
  v1::HeadRef* h = c.add_retrieval_heads();
  h->set_layer(1);
  h->set_q_head(3);  // KV head 3 / (4 / 2) = 1
  for (float p : {0.5f, 0.3f, 0.2f, 0.1f}) c.add_prior(p);
  for (float p : {0.6f, 0.4f, 0.25f, 0.12f}) c.add_prior_all(p);
  c.add_head_weights(0.9f);
  return c;
}

class SelectV2Test : public ::testing::Test {
 protected:
  void SetUp() override {
    Start();
    std::mt19937_64 rng(42);
    std::normal_distribution<float> n(0.0f, 1.0f);
    query_.resize(kDim);
    double norm = 0;
    for (float& x : query_) norm += (x = n(rng)) * x;
    for (float& x : query_) x = static_cast<float>(x * 4.0 / std::sqrt(norm));
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
  }

  void Start() {
    auto daemon = testing::StartTestDaemon(dir_, {"index.summary_per_layer=true"});
    ASSERT_OK(daemon);
    server_ = std::move(daemon->server);
    client_ = std::move(daemon->client);
  }

  v1::ModelProfile Profile(bool calibrated) const {
    v1::ModelProfile p;
    p.set_name("select-v2");
    p.set_revision(calibrated ? "calibrated" : "plain");
    p.set_num_layers(kLayers);
    p.set_num_kv_heads(kKvHeads);
    p.set_head_dim(kDim);
    p.set_block_size_tokens(kTokens);
    p.set_dtype(v1::DTYPE_FP16);
    if (calibrated) *p.mutable_calibration() = Calibration();
    if (calibrated && gated_) p.mutable_calibration()->set_head_min_mass(0.4f);
    return p;
  }

  // Registers the profile, puts kBlocks blocks (kPlanted holds the key the
  // retrieval head looks for), opens a context with the first 30 and
  // appends the rest one by one, as an engine does.
  uint64_t OpenContext(bool calibrated) {
    auto reg = client_->RegisterProfile(Profile(calibrated));
    EXPECT_OK(reg);
    profile_id_ = reg->profile_id();
    for (int b = 0; b < kBlocks; ++b) {
      blocks_.push_back(Payload(1000 + b, b == kPlanted ? &query_ : nullptr));
      v1::PutBlocksRequest put;
      put.set_profile_id(profile_id_);
      v1::BlockPut* p = put.add_blocks();
      p->set_block_id("b" + std::to_string(b));
      p->set_data(blocks_.back());
      auto r = client_->PutBlocks({put});
      EXPECT_TRUE(r.ok() && r->results(0).status().code() == 0);
    }
    grpc::ClientContext ctx;
    v1::OpenContextRequest open;
    open.set_profile_id(profile_id_);
    v1::Segment* seg = open.add_segments();
    for (int b = 0; b < 30; ++b) seg->add_block_ids("b" + std::to_string(b));
    v1::OpenContextResponse opened;
    EXPECT_OK(client_->kvtier_stub()->OpenContext(&ctx, open, &opened));
    for (int b = 30; b < kBlocks; ++b) {
      grpc::ClientContext actx;
      v1::AppendBlocksRequest app;
      app.set_context_id(opened.context_id());
      app.add_block_ids("b" + std::to_string(b));
      v1::AppendBlocksResponse appended;
      EXPECT_OK(client_->kvtier_stub()->AppendBlocks(&actx, app, &appended));
      EXPECT_EQ(appended.num_blocks(), static_cast<uint32_t>(b + 1));
    }
    return opened.context_id();
  }

  std::vector<uint32_t> Positions(const v1::ContextSelection& sel) {
    std::vector<uint32_t> out;
    for (const auto& b : sel.blocks()) out.push_back(b.position());
    return out;
  }

  ::kvtier::testing::ScopedTempDir tmp_{"selv2"};
  const std::string dir_ = tmp_.path();
  std::unique_ptr<daemon::Server> server_;
  std::unique_ptr<Client> client_;
  uint64_t profile_id_ = 0;
  bool gated_ = false;  // the calibration's head_min_mass 0.4: the mass tree may serve it
  std::vector<std::string> blocks_;
  std::vector<float> query_;
};

TEST_F(SelectV2Test, DefaultMassScorerFollowsTheRetrievalHeadsQuery) {
  const uint64_t id = OpenContext(/*calibrated=*/true);
  grpc::ClientContext ctx;
  auto stream = client_->kvtier_stub()->Select(&ctx);
  v1::SelectRequest req;
  req.set_request_id(1);
  v1::ContextSelect* e = req.add_contexts();
  e->set_context_id(id);
  e->set_max_blocks(5);
  // The engine's queries of every head at this step; the client picks the
  // calibration's retrieval heads.
  std::vector<float> all_queries(kLayers * kQHeads * kDim, 0.5f);
  std::copy(query_.begin(), query_.end(), all_queries.begin() + (1 * kQHeads + 3) * kDim);
  auto hq = GatherHeadQueries(all_queries, kLayers, kQHeads, kDim, Calibration());
  ASSERT_OK(hq);
  for (float x : *hq) e->add_head_queries(x);
  v1::SelectResponse resp;
  ASSERT_TRUE(stream->Write(req));
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_EQ(resp.contexts(0).status().code(), 0) << resp.contexts(0).status().message();
  // Sink, the planted block, then the most recent ones (the prior), local.
  EXPECT_EQ(Positions(resp.contexts(0)), (std::vector<uint32_t>{0, kPlanted, 37, 38, 39}));
  // Without head queries: the prior alone, a sliding window.
  e->clear_head_queries();
  req.set_request_id(2);
  ASSERT_TRUE(stream->Write(req));
  ASSERT_TRUE(stream->Read(&resp));
  EXPECT_EQ(Positions(resp.contexts(0)), (std::vector<uint32_t>{0, 36, 37, 38, 39}));
  stream->WritesDone();
  EXPECT_OK(stream->Finish());
}

// The mass tree's work is exported (kvtier_select_mass_heads_total,
// kvtier_select_mass_pages_opened_total): with a gated calibration and
// select.mass_tree_min_blocks 0 the tree serves the retrieval head; the
// first step descends, the same query at the next two steps reuses the
// pages it found, and every step chooses the planted block.
TEST_F(SelectV2Test, MassTreeWorkIsExported) {
  client_.reset();
  server_.reset();
  auto daemon = testing::StartTestDaemon(
      dir_, {"index.summary_per_layer=true", "select.mass_tree_min_blocks=0"});
  ASSERT_OK(daemon);
  server_ = std::move(daemon->server);
  client_ = std::move(daemon->client);
  gated_ = true;
  const uint64_t id = OpenContext(/*calibrated=*/true);
  std::vector<float> all_queries(kLayers * kQHeads * kDim, 0.5f);
  std::copy(query_.begin(), query_.end(), all_queries.begin() + (1 * kQHeads + 3) * kDim);
  auto hq = GatherHeadQueries(all_queries, kLayers, kQHeads, kDim, Calibration());
  ASSERT_OK(hq.status());
  grpc::ClientContext ctx;
  auto stream = client_->kvtier_stub()->Select(&ctx);
  for (int step = 1; step <= 3; ++step) {
    v1::SelectRequest req;
    req.set_request_id(step);
    v1::ContextSelect* e = req.add_contexts();
    e->set_context_id(id);
    e->set_max_blocks(5);
    for (float x : *hq) e->add_head_queries(x);
    v1::SelectResponse resp;
    ASSERT_TRUE(stream->Write(req));
    ASSERT_TRUE(stream->Read(&resp));
    ASSERT_EQ(resp.contexts(0).status().code(), 0) << resp.contexts(0).status().message();
    const std::vector<uint32_t> chosen = Positions(resp.contexts(0));
    EXPECT_NE(std::find(chosen.begin(), chosen.end(), kPlanted), chosen.end()) << "step " << step;
  }
  stream->WritesDone();
  const grpc::Status finished = stream->Finish();
  EXPECT_EQ(finished.error_code(), grpc::StatusCode::OK) << finished.error_message();
  const std::string text = server_->runtime()->metrics()->Render();
  EXPECT_THAT(text, HasSubstr("kvtier_select_mass_heads_total{path=\"descended\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("kvtier_select_mass_heads_total{path=\"reused\"} 2\n"));
  EXPECT_THAT(text, Not(HasSubstr("kvtier_select_mass_pages_opened_total 0\n")));
  EXPECT_THAT(text, HasSubstr("kvtier_select_mass_pages_opened_total "));
}

TEST_F(SelectV2Test, PerLayerAnchorsFromTheClientHelper) {
  const uint64_t id = OpenContext(/*calibrated=*/false);
  AnchorBuilder builder(Profile(false));
  ASSERT_OK(builder.AddTokens(blocks_[kBlocks - 1], kTokens - 8, 8));
  auto anchor = builder.Finish(AnchorLayout::kPerLayer);
  ASSERT_OK(anchor);
  ASSERT_EQ(anchor->size(), static_cast<size_t>(kLayers * kDim));
  grpc::ClientContext ctx;
  auto stream = client_->kvtier_stub()->Select(&ctx);
  v1::SelectRequest req;
  req.set_request_id(1);
  v1::ContextSelect* e = req.add_contexts();
  e->set_context_id(id);
  e->set_scorer(v1::SCORER_KEY_KEY);
  e->set_max_blocks(6);
  for (float x : *anchor) e->add_anchor(x);
  v1::SelectResponse resp;
  ASSERT_TRUE(stream->Write(req));
  ASSERT_TRUE(stream->Read(&resp));
  const v1::ContextSelection& sel = resp.contexts(0);
  ASSERT_EQ(sel.status().code(), 0) << sel.status().message();
  ASSERT_EQ(sel.blocks_size(), 6);
  for (const auto& b : sel.blocks()) {
    EXPECT_GE(b.score(), 0.0f);
    EXPECT_LE(b.score(), 1.0f);
  }
  // A pooled anchor from the same tokens works on the same context.
  auto pooled = builder.Finish(AnchorLayout::kPooled);
  ASSERT_OK(pooled);
  e->clear_anchor();
  for (float x : *pooled) e->add_anchor(x);
  req.set_request_id(2);
  ASSERT_TRUE(stream->Write(req));
  ASSERT_TRUE(stream->Read(&resp));
  EXPECT_EQ(resp.contexts(0).status().code(), 0) << resp.contexts(0).status().message();
  stream->WritesDone();
  EXPECT_OK(stream->Finish());
}

TEST_F(SelectV2Test, BadAnchorsAndHeadQueriesFailAloneNamingSizes) {
  const uint64_t calibrated = OpenContext(true);
  const uint64_t plain = OpenContext(false);
  grpc::ClientContext ctx;
  auto stream = client_->kvtier_stub()->Select(&ctx);
  v1::SelectRequest req;
  req.set_request_id(1);
  auto add = [&](uint64_t id, v1::Scorer scorer) {
    v1::ContextSelect* e = req.add_contexts();
    e->set_context_id(id);
    e->set_scorer(scorer);
    e->set_max_blocks(5);
    return e;
  };
  v1::ContextSelect* odd = add(plain, v1::SCORER_KEY_KEY);  // 0
  for (int i = 0; i < kDim + 1; ++i) odd->add_anchor(1.0f);
  v1::ContextSelect* nan = add(plain, v1::SCORER_KEY_KEY);  // 1
  for (int i = 0; i < kDim; ++i) nan->add_anchor(i == 3 ? std::nanf("") : 1.0f);
  v1::ContextSelect* inf = add(plain, v1::SCORER_KEY_KEY);  // 2
  for (int i = 0; i < kLayers * kDim; ++i) {
    inf->add_anchor(i == 40 ? std::numeric_limits<float>::infinity() : 1.0f);
  }
  v1::ContextSelect* zero_row = add(plain, v1::SCORER_KEY_KEY);  // 3
  for (int i = 0; i < kLayers * kDim; ++i) zero_row->add_anchor(i < kDim ? 0.0f : 1.0f);
  v1::ContextSelect* short_q = add(calibrated, v1::SCORER_MASS);  // 4
  for (int i = 0; i < kDim - 1; ++i) short_q->add_head_queries(1.0f);
  v1::ContextSelect* uncal = add(plain, v1::SCORER_MASS);  // 5
  for (int i = 0; i < kDim; ++i) uncal->add_head_queries(1.0f);
  v1::ContextSelect* zero_q = add(calibrated, v1::SCORER_MASS);  // 6
  for (int i = 0; i < kDim; ++i) zero_q->add_head_queries(0.0f);
  v1::ContextSelect* weight = add(plain, v1::SCORER_KEY_KEY);  // 7
  for (int i = 0; i < kLayers * kDim; ++i) weight->add_anchor(1.0f);
  weight->set_recency_weight(1.5f);
  v1::ContextSelect* good = add(calibrated, v1::SCORER_UNSPECIFIED);  // 8
  for (float x : query_) good->add_head_queries(x);
  v1::SelectResponse resp;
  ASSERT_TRUE(stream->Write(req));
  ASSERT_TRUE(stream->Read(&resp));
  const std::vector<std::string> want = {
      std::string("contexts[0].anchor: 33 values; expected 32 (pooled over layers and KV heads) ") +
          "or 64 (2 layers x 32, per layer)",
      "contexts[1].anchor[3]: nan is not finite",
      "contexts[2].anchor[40]: inf is not finite",
      "contexts[3].anchor: row 0 (values 0..31) is all zero",
      "contexts[4].head_queries: 31 values; expected 32 (1 retrieval heads x 32) or none",
      "contexts[5].head_queries: 32 values, but profile",
      "contexts[6].head_queries: all zero",
      "contexts[7].recency_weight: 1.5 is not in [0, 1]",
  };
  ASSERT_EQ(resp.contexts_size(), 9);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(resp.contexts(i).status().code(), grpc::StatusCode::INVALID_ARGUMENT) << i;
    EXPECT_THAT(resp.contexts(i).status().message(), HasSubstr(want[i])) << i;
  }
  EXPECT_EQ(resp.contexts(8).status().code(), 0) << resp.contexts(8).status().message();
  EXPECT_EQ(Positions(resp.contexts(8)), (std::vector<uint32_t>{0, kPlanted, 37, 38, 39}));
  // The stream stays open: a good request still gets its answer.
  const v1::ContextSelect kept = *good;
  req.clear_contexts();
  req.set_request_id(2);
  *req.add_contexts() = kept;
  req.mutable_contexts(0)->set_step(0);
  ASSERT_TRUE(stream->Write(req));
  ASSERT_TRUE(stream->Read(&resp));
  EXPECT_EQ(resp.request_id(), 2u);
  EXPECT_EQ(resp.contexts(0).status().code(), 0);
  stream->WritesDone();
  EXPECT_OK(stream->Finish());
}

TEST_F(SelectV2Test, CalibrationIsValidatedReturnedAndKeptAcrossRestarts) {
  v1::ModelProfile bad = Profile(true);
  bad.mutable_calibration()->mutable_retrieval_heads(0)->set_q_head(kQHeads);
  auto refused = client_->RegisterProfile(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("profile.calibration.retrieval_heads[0]"));
  bad = Profile(true);
  bad.mutable_calibration()->set_prior(2, -1.0f);
  EXPECT_THAT(std::string(client_->RegisterProfile(bad).status().message()),
              HasSubstr("profile.calibration.prior[2]"));
  bad = Profile(true);
  bad.mutable_calibration()->set_copy_run(6);
  bad.mutable_calibration()->set_copy_min_mass(1.5f);
  EXPECT_THAT(
      client_->RegisterProfile(bad),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("profile.calibration.copy_min_mass")));

  auto reg = client_->RegisterProfile(Profile(true));
  ASSERT_OK(reg);
  const uint64_t id = reg->profile_id();
  // Another calibration under the same name and revision is another
  // definition: refused, the stored one is kept.
  v1::ModelProfile other = Profile(true);
  other.mutable_calibration()->set_prior(0, 0.7f);
  EXPECT_FALSE(client_->RegisterProfile(other).ok());
  auto got = client_->GetProfile(id);
  ASSERT_OK(got);
  EXPECT_EQ(got->profile().calibration().SerializeAsString(), Calibration().SerializeAsString());
  client_.reset();
  server_.reset();
  Start();
  got = client_->GetProfile(id);
  ASSERT_OK(got);
  EXPECT_EQ(got->profile().calibration().SerializeAsString(), Calibration().SerializeAsString());
  auto again = client_->RegisterProfile(Profile(true));
  ASSERT_OK(again);
  EXPECT_EQ(again->profile_id(), id);
  EXPECT_FALSE(again->created());
}

}  // namespace
}  // namespace kvtier
