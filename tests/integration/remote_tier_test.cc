// The remote tier end to end: a real Redis Cluster (3 masters + replicas,
// started by the test) and two kvtierd in-process, each with its own data
// directory and socket, configured with the same cluster. Blocks an engine
// put on daemon A are served by daemon B (bytes and handles), B opens a
// context over them and selects from it, and both daemons report it in
// Stats and /metrics.
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client.h"
#include "daemon/config.h"
#include "daemon/grpc_status.h"
#include "daemon/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_daemon.h"
#include "tests/integration/tiny_profile.h"
#include "tests/testutil/http_get.h"
#include "tests/testutil/redis_cluster.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

namespace kvtier {
namespace {

using ::testing::HasSubstr;
using testing::StatusIs;

// A block of finite fp16 values in [-1, -0.5] U [0.5, 1] (so it has a key
// summary), different for every seed.
std::string Block(uint64_t seed) {
  std::string data(testing::kTinyBlockBytes, '\0');
  std::mt19937_64 rng(seed * 104729 + 3);
  for (size_t i = 0; i < data.size(); i += 2) {
    const uint16_t h = static_cast<uint16_t>((rng() & 0x83FF) | 0x3800);
    std::memcpy(&data[i], &h, 2);
  }
  return data;
}

class RemoteTierTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new ::kvtier::testing::ScopedTempDir("rtt");
    root_ = tmp_->path();
    std::filesystem::create_directories(root_ + "/redis");
    testing::RedisClusterFixtureOptions o;
    o.dir = root_ + "/redis";
    auto cluster = testing::RedisClusterFixture::Start(o);
    ASSERT_OK(cluster);
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    delete tmp_;  // removes root_
    tmp_ = nullptr;
  }

  struct Daemon {
    std::unique_ptr<daemon::Server> server;
    std::unique_ptr<Client> client;
    uint64_t profile_id = 0;
  };

  static Daemon Start(const std::string& name, const std::vector<std::string>& extra = {}) {
    const std::string dir =
        root_ + "/" + name + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::vector<std::string> overrides = {
        "log.level=error",
        "metrics.listen_address=127.0.0.1:0",
        "tiers.device.capacity_bytes=1MiB",
        "tiers.host.capacity_bytes=4MiB",
        "tiers.host.staging_bytes=1MiB",
        "tiers.nvme.file_size_bytes=4MiB",
        "tiers.remote.redis_cluster=" + absl::StrJoin(cluster_->Seeds(), ",")};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    Daemon d;
    auto started = testing::StartTestDaemon(dir, overrides);
    EXPECT_OK(started);
    if (!started.ok()) return d;
    d.server = std::move(started->server);
    d.client = std::move(started->client);
    auto profile = d.client->RegisterProfile(testing::TinyProfile());
    EXPECT_OK(profile);
    if (profile.ok()) d.profile_id = profile->profile_id();
    return d;
  }

  static void Put(Daemon& d, const std::vector<std::string>& ids) {
    v1::PutBlocksRequest req;
    req.set_profile_id(d.profile_id);
    for (size_t i = 0; i < ids.size(); ++i) {
      v1::BlockPut* b = req.add_blocks();
      b->set_block_id(ids[i]);
      b->set_data(Block(std::hash<std::string>()(ids[i])));
    }
    auto put = d.client->PutBlocks({req});
    ASSERT_OK(put);
    for (const auto& r : put->results()) ASSERT_EQ(r.status().code(), 0) << r.status().message();
  }

  // Waits (polling Stats, deadline 10 s) until `published` blocks went out.
  static void WaitPublished(Daemon& d, uint64_t published) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      auto stats = d.client->Stats();
      ASSERT_OK(stats);
      ASSERT_TRUE(stats->has_remote());
      if (stats->remote().published() >= published) return;
      ASSERT_LT(std::chrono::steady_clock::now(), deadline)
          << "published " << stats->remote().published() << " of " << published;
      std::this_thread::yield();
    }
  }

  static std::vector<std::string> Ids(const std::string& prefix, int n) {
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) ids.push_back(absl::StrCat(prefix, "-", i));
    return ids;
  }

  static ::kvtier::testing::ScopedTempDir* tmp_;  // the suite's folder
  static std::string root_;
  static testing::RedisClusterFixture* cluster_;
};

::kvtier::testing::ScopedTempDir* RemoteTierTest::tmp_ = nullptr;
std::string RemoteTierTest::root_;
testing::RedisClusterFixture* RemoteTierTest::cluster_ = nullptr;

TEST_F(RemoteTierTest, BlocksPutOnOneDaemonAreServedByAnother) {
  Daemon a = Start("a");
  Daemon b = Start("b");
  const std::vector<std::string> ids = Ids("shared", 12);
  Put(a, ids);
  WaitPublished(a, ids.size());

  v1::GetBlocksRequest get;
  get.set_profile_id(b.profile_id);
  for (const auto& id : ids) get.add_block_ids(id);
  get.set_mode(v1::RETURN_MODE_BYTES);
  auto got = b.client->GetBlocks(get);
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const v1::BlockResult& r = (*got)[i];
    ASSERT_EQ(r.status().code(), 0) << ids[i] << ": " << r.status().message();
    EXPECT_EQ(r.tier(), v1::TIER_REMOTE);
    EXPECT_EQ(r.data(), Block(std::hash<std::string>()(ids[i]))) << ids[i];
  }
  // Second read: local.
  got = b.client->GetBlocks(get);
  ASSERT_OK(got);
  EXPECT_EQ((*got)[0].tier(), v1::TIER_HOST);

  auto stats = b.client->Stats();
  ASSERT_OK(stats);
  EXPECT_EQ(stats->remote().hits(), ids.size());
  EXPECT_EQ(stats->remote().masters_size(), 3);
  const testing::HttpResponse page = testing::HttpGet(b.server->metrics_port(), "/metrics");
  ASSERT_EQ(page.status, 200);
  EXPECT_THAT(page.body,
              HasSubstr(absl::StrCat("kvtier_remote_lookups_total{result=\"hit\"} ", ids.size())));
  EXPECT_THAT(page.body, HasSubstr("kvtier_remote_masters 3\n"));
  // Every remote-tier family the dashboard queries is exported (the
  // Prometheus test checks the others, and that Prometheus accepts every
  // query).
  std::ifstream dashboard(KVTIER_SOURCE_DIR "/deploy/grafana/kvtier.json");
  const std::string text((std::istreambuf_iterator<char>(dashboard)),
                         std::istreambuf_iterator<char>());
  int named = 0;
  for (size_t at = text.find("kvtier_remote_"); at != std::string::npos;
       at = text.find("kvtier_remote_", at + 1)) {
    size_t end = at;
    while (end < text.size() &&
           (std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_')) {
      ++end;
    }
    const std::string name = text.substr(at, end - at);
    EXPECT_THAT(page.body, HasSubstr("# TYPE " + name + " ")) << name;
    ++named;
  }
  EXPECT_GE(named, 2);
}

TEST_F(RemoteTierTest, ASecondDaemonOpensAContextOverSharedBlocksAndSelects) {
  Daemon a = Start("a");
  Daemon b = Start("b");
  const std::vector<std::string> ids = Ids("ctx", 16);
  Put(a, ids);
  WaitPublished(a, ids.size());

  grpc::ClientContext open_ctx;
  v1::OpenContextRequest open;
  open.set_profile_id(b.profile_id);
  v1::Segment* seg = open.add_segments();
  for (const auto& id : ids) seg->add_block_ids(id);
  v1::OpenContextResponse opened;
  grpc::Status st = b.client->kvtier_stub()->OpenContext(&open_ctx, open, &opened);
  ASSERT_OK(st) << st.error_message();
  EXPECT_EQ(opened.num_blocks(), ids.size());

  grpc::ClientContext select_ctx;
  auto stream = b.client->kvtier_stub()->Select(&select_ctx);
  v1::SelectRequest req;
  v1::ContextSelect* e = req.add_contexts();
  e->set_context_id(opened.context_id());
  for (int i = 0; i < 32; ++i) e->add_anchor(i % 2 == 0 ? 0.5f : -0.5f);
  e->set_max_blocks(4);
  e->set_step(1);
  ASSERT_TRUE(stream->Write(req));
  v1::SelectResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  stream->WritesDone();
  ASSERT_EQ(resp.contexts_size(), 1);
  ASSERT_EQ(resp.contexts(0).status().code(), 0) << resp.contexts(0).status().message();
  EXPECT_GE(resp.contexts(0).blocks_size(), 4);
  for (const v1::SelectedBlock& blk : resp.contexts(0).blocks()) {
    EXPECT_EQ(blk.residency(), v1::RESIDENCY_RESIDENT) << blk.position();
  }
  EXPECT_OK(stream->Finish());
}

TEST_F(RemoteTierTest, ADaemonWithoutPublishOnlyReads) {
  Daemon a = Start("a", {"tiers.remote.publish=false"});
  Daemon b = Start("b");
  Put(a, {"quiet-0"});
  auto stats = a.client->Stats();
  ASSERT_OK(stats);
  EXPECT_EQ(stats->remote().published(), 0u);
  v1::GetBlocksRequest get;
  get.set_profile_id(b.profile_id);
  get.add_block_ids("quiet-0");
  get.set_mode(v1::RETURN_MODE_BYTES);
  auto got = b.client->GetBlocks(get);
  ASSERT_OK(got);
  EXPECT_EQ((*got)[0].status().code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
}

TEST_F(RemoteTierTest, BadRemoteSettingsNameTheKey) {
  for (const auto& [setting, key] : std::vector<std::pair<std::string, std::string>>{
           {"tiers.remote.command_timeout_ms=0", "tiers.remote.command_timeout_ms"},
           {"tiers.remote.publish_threads=0", "tiers.remote.publish_threads"},
           {"tiers.remote.redis_cluster=nonsense", "seeds"},
           {"tiers.remote.password_file=/nonexistent/pw", "tiers.remote.password_file"}}) {
    auto daemon = testing::StartTestDaemon(root_ + "/bad",
                                           {"tiers.remote.redis_cluster=127.0.0.1:1", setting});
    EXPECT_THAT(daemon, testing::StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(key)))
        << setting;
  }
}

}  // namespace
}  // namespace kvtier
