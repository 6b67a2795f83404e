#include "daemon/config.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "daemon/options.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

namespace kvtier::daemon {
namespace {

using ::testing::HasSubstr;
using testing::StatusIs;

class ConfigTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& text) {
    std::string path = (dir_ / "kvtierd.toml").string();
    std::ofstream(path) << text;
    return path;
  }

  ::kvtier::testing::ScopedTempDir tmp_{"config-test"};
  const std::filesystem::path dir_ = tmp_.path();
};

TEST_F(ConfigTest, EmbeddedDefaultsAreValid) {
  auto config = LoadConfig("", {});
  ASSERT_OK(config);
  EXPECT_EQ(config->server.data_dir, "./var/kvtier");
  EXPECT_EQ(config->server.socket_path, "./var/kvtier/kvtierd.sock");
  EXPECT_EQ(config->server.socket_mode, 0660u);
  EXPECT_TRUE(config->server.tcp_address.empty());
  EXPECT_EQ(config->host.capacity_bytes, 1ull << 30);
  EXPECT_EQ(config->nvme.dir, "./var/kvtier/nvme");
  EXPECT_EQ(config->nvme_capacity_bytes(), 4ull * (512ull << 20));
}

TEST_F(ConfigTest, TcpIsServedOnlyWithTls) {
  auto config = LoadConfig("", {"server.tcp_address=127.0.0.1:50551"});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(config.status().message(), HasSubstr("server.tls_cert_file"));
  config = LoadConfig("", {"server.tls_cert_file=/a.crt"});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("server.tls_key_file"));
  config = LoadConfig("", {"server.tls_client_ca_file=/ca.crt"});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("server.tls_client_ca_file"));
}

TEST_F(ConfigTest, FileOverridesDefaults) {
  auto config = LoadConfig(Write(R"(
[server]
data_dir = "/tmp/x"
tcp_address = "127.0.0.1:50551"
tls_cert_file = "/etc/kvtier/server.crt"
tls_key_file = "/etc/kvtier/server.key"
[tiers.host]
capacity_bytes = 8192000
[tiers.nvme]
direct_io = false
)"),
                           {});
  ASSERT_OK(config);
  EXPECT_EQ(config->server.socket_path, "/tmp/x/kvtierd.sock");
  EXPECT_EQ(config->server.tcp_address, "127.0.0.1:50551");
  EXPECT_EQ(config->host.capacity_bytes, 8192000u);
  EXPECT_FALSE(config->nvme.direct_io);
}

TEST_F(ConfigTest, UnknownKeyIsNamed) {
  auto config = LoadConfig(Write("[server]\nsocket_pth = \"/tmp/s\"\n"), {});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(config.status().message(), HasSubstr("unknown key 'server.socket_pth'"));
  EXPECT_THAT(config.status().message(), HasSubstr("line 2"));
}

TEST_F(ConfigTest, UnknownSectionIsNamed) {
  auto config = LoadConfig(Write("[tiers.gpu]\ncapacity_bytes = 1\n"), {});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("'tiers.gpu.capacity_bytes'"));
}

TEST_F(ConfigTest, SyntaxErrorNamesFileAndLine) {
  std::string path = Write("[server]\ndata_dir = \"unterminated\n");
  auto config = LoadConfig(path, {});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(config.status().message(), HasSubstr(path + ":2"));
}

TEST_F(ConfigTest, WrongTypeIsNamed) {
  auto config = LoadConfig(Write("[tiers.host]\ncapacity_bytes = \"lots\"\n"), {});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("'tiers.host.capacity_bytes'"));
  EXPECT_THAT(config.status().message(), HasSubstr("lots"));
  config = LoadConfig(Write("[tiers.nvme]\ndirect_io = 1\n"), {});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("'tiers.nvme.direct_io'"));
  config = LoadConfig(Write("[log]\nlevel = \"loud\"\n"), {});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("'log.level'"));
}

TEST_F(ConfigTest, ValidationNamesKey) {
  auto config = LoadConfig(Write("[tiers.nvme]\nfile_size_bytes = 1000\n"), {});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("'tiers.nvme.file_size_bytes'"));
  config = LoadConfig("", {"server.socket_path=/" + std::string(200, 'x')});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("'server.socket_path'"));
  config = LoadConfig("", {"leases.max_ttl_ms=10"});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("'leases.max_ttl_ms'"));
}

TEST_F(ConfigTest, MissingFileIsNotFound) {
  auto config = LoadConfig((dir_ / "absent.toml").string(), {});
  EXPECT_THAT(config, StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(ConfigTest, OverridesApplyInOrderAndAreChecked) {
  auto config = LoadConfig("", {"tiers.host.capacity_bytes=2GiB", "server.socket_mode=0600",
                                "tiers.nvme.write_through=true", "server.data_dir=/srv/kv"});
  ASSERT_OK(config);
  EXPECT_EQ(config->host.capacity_bytes, 2ull << 30);
  EXPECT_EQ(config->server.socket_mode, 0600u);
  EXPECT_TRUE(config->nvme.write_through);
  EXPECT_EQ(config->server.data_dir, "/srv/kv");
  auto bad = LoadConfig("", {"tiers.hots.capacity_bytes=1"});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("'tiers.hots.capacity_bytes'"));
  bad = LoadConfig("", {"novalue"});
  ASSERT_FALSE(bad.ok());
}

TEST_F(ConfigTest, FlattenListsEveryKey) {
  auto config = LoadConfig("", {});
  ASSERT_OK(config);
  auto flat = config->Flatten();
  EXPECT_EQ(flat.at("server.socket_mode"), "0660");
  EXPECT_EQ(flat.at("tiers.nvme.direct_io"), "true");
  EXPECT_EQ(flat.at("tiers.device.capacity_bytes"), std::to_string(256ull << 20));
}

TEST_F(ConfigTest, TenantLeaseLimitHasADefaultAndABound) {
  auto config = LoadConfig("", {});
  ASSERT_OK(config);
  EXPECT_EQ(config->auth.tenant_max_leases, 4096u);
  EXPECT_EQ(config->Flatten().at("auth.tenant_max_leases"), "4096");
  config = LoadConfig("", {"auth.tenant_max_leases=0"});
  ASSERT_OK(config);
  EXPECT_EQ(config->auth.tenant_max_leases, 0u);
  auto bad = LoadConfig("", {"auth.tenant_max_leases=99999999"});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("auth.tenant_max_leases"));
}

TEST_F(ConfigTest, SelectorIndexAndPlacementKeys) {
  auto config = LoadConfig("", {});
  ASSERT_OK(config);
  // Measured best by bench/placement (docs/QUALITY.md, "Placement").
  EXPECT_EQ(config->placement.policy, PlacementSetting::kStability);
  EXPECT_FALSE(config->placement.unwanted_first);
  // The defaults the quality harness supports (docs/QUALITY.md).
  EXPECT_EQ(config->select.default_scorer, index::ScorerKind::kMass);
  EXPECT_DOUBLE_EQ(config->select.grid_keep_fraction, 0.5);
  EXPECT_EQ(config->select.window_steps, 64u);
  EXPECT_EQ(config->Flatten().at("select.theta"), "0.8");
  config = LoadConfig("", {"select.theta=0.7", "tiers.keydiff.age_weight=1", "tiers.placement=lru",
                           "select.default_scorer=keykey_weighted", "index.summary_weighted=true"});
  ASSERT_OK(config);
  EXPECT_DOUBLE_EQ(config->select.theta, 0.7);
  EXPECT_DOUBLE_EQ(config->placement.age_weight, 1.0);  // an integer is a number too
  EXPECT_EQ(config->placement.policy, PlacementSetting::kLru);
  for (const char* policy : {"stability", "keydiff", "lru"}) {
    config = LoadConfig(
        "", {std::string("tiers.placement=") + policy, "tiers.stability.unwanted_first=true"});
    ASSERT_OK(config) << policy << ": " << config.status();
    EXPECT_EQ(NameOf(kPlacementNames, config->placement.policy), policy);
    EXPECT_TRUE(config->placement.unwanted_first);
  }
  auto fifo = LoadConfig("", {"tiers.placement=fifo"});
  ASSERT_FALSE(fifo.ok());
  EXPECT_THAT(std::string(fifo.status().message()), HasSubstr("stability"));
  EXPECT_OK(LoadConfig("", {"select.default_scorer=quest", "index.keep_summaries=true",
                            "index.summary_bounds=true"}));
  EXPECT_FALSE(LoadConfig("", {"select.default_scorer=quest", "index.keep_summaries=true"}).ok());
  // The weighted scorer needs its summaries; unknown stability scorers are
  // named.
  auto weighted = LoadConfig("", {"select.default_scorer=keykey_weighted"});
  EXPECT_FALSE(weighted.ok());
  EXPECT_THAT(std::string(weighted.status().message()), HasSubstr("index.summary_weighted"));
  auto unknown = LoadConfig("", {"select.stability_scorers=keykey,bogus"});
  EXPECT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("\"bogus\""));
  EXPECT_FALSE(LoadConfig("", {"select.keykey_recency_weight=1.5"}).ok());
}

TEST_F(ConfigTest, SelectorIndexAndPlacementErrorsNameTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"select.grid_keep_fraction=0", "'select.grid_keep_fraction'"},
      {"select.page_keep_fraction=1.5", "'select.page_keep_fraction'"},
      {"select.theta=-0.1", "'select.theta'"},
      {"select.theta=\"high\"", "'select.theta': expected a finite number"},
      {"select.window_steps=65", "'select.window_steps'"},
      {"select.default_scorer=quest", "'select.default_scorer'"},
      {"select.default_scorer=best", "'select.default_scorer'"},
      {"select.max_contexts_per_request=0", "'select.max_contexts_per_request'"},
      {"tiers.placement=fifo", "'tiers.placement'"},
      {"tiers.stability.unwanted_first=1", "'tiers.stability.unwanted_first'"},
      {"tiers.keydiff.sample_blocks=0", "'tiers.keydiff.sample_blocks'"},
      {"tiers.keydiff.newest_protected=0.95", "'tiers.keydiff.newest_protected'"},
      {"select.batch_threads=65", "'select.batch_threads'"},
      {"server.put_parallelism=65", "'server.put_parallelism'"},
      {"tiers.host.max_in_flight_get_bytes=\"2GiB\"", "'tiers.host.max_in_flight_get_bytes'"},
      {"index.pages_per_chunk=0", "'index.pages_per_chunk'"},
      {"index.summary_encoding=int8", "'index.summary_encoding'"},
      {"index.q8_page_rows=true", "'index.q8_page_rows': was removed"},
      {"select.mass_tree_reuse_steps=1025", "'select.mass_tree_reuse_steps'"},
      {"select.threads=257", "'select.threads'"},
      {"select.queue_limit=0", "'select.queue_limit'"},
      {"select.queue_limit_per_tenant=5000", "'select.queue_limit_per_tenant'"},
      {"select.threads_per_tenant=5", "'select.threads_per_tenant'"},
      {"select.mass_tree_reuse_min_cosine=1.5", "'select.mass_tree_reuse_min_cosine'"},
  };
  for (const auto& [item, key] : cases) {
    auto config = LoadConfig("", {item});
    ASSERT_FALSE(config.ok()) << item;
    EXPECT_THAT(config, StatusIs(absl::StatusCode::kInvalidArgument)) << item;
    EXPECT_THAT(config.status().message(), HasSubstr(key)) << item;
  }
  auto config = LoadConfig(
      Write("[index]\nsummary_per_layer = false\nsummary_per_layer_bounds = true\n"), {});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("'index.summary_per_layer_bounds'"));
}

// Defaults by construction: every key of the embedded defaults
// (--print-default-config) equals the initialiser of its Config field, so
// a Config built in code behaves as the shipped daemon does.
TEST_F(ConfigTest, StructInitialisersEqualTheEmbeddedDefaults) {
  auto shipped = LoadConfig("", {});
  ASSERT_OK(shipped.status());
  const std::map<std::string, std::string> want = shipped->Flatten();
  const std::map<std::string, std::string> got = Config().Flatten();
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [key, value] : want) {
    EXPECT_EQ(got.at(key), value) << key << ": the Config initialiser against the embedded default";
  }
}

// Every select.* setting the shipped file gives the selector equals the
// library's default (what a caller of index::Selector gets without a
// config). select.batch_threads is the host's (0 = min(4, cores)).
TEST_F(ConfigTest, ShippedSelectorSettingsAreTheLibraryDefaults) {
  auto config = LoadConfig("", {});
  ASSERT_OK(config.status());
  const index::SelectorOptions o = SelectorOptionsOf(*config);
  const index::SelectorOptions lib;
  EXPECT_EQ(o.grid_keep_fraction, lib.grid_keep_fraction) << "select.grid_keep_fraction";
  EXPECT_EQ(o.chunk_keep_fraction, lib.chunk_keep_fraction) << "select.chunk_keep_fraction";
  EXPECT_EQ(o.page_keep_fraction, lib.page_keep_fraction) << "select.page_keep_fraction";
  EXPECT_EQ(o.sink_blocks, lib.sink_blocks) << "select.sink_blocks";
  EXPECT_EQ(o.local_blocks, lib.local_blocks) << "select.local_blocks";
  EXPECT_EQ(o.max_prefetch_blocks, lib.max_prefetch_blocks) << "select.max_prefetch_blocks";
  EXPECT_EQ(o.algorithm, lib.algorithm) << "select.algorithm";
  EXPECT_EQ(o.stability.window_steps, lib.stability.window_steps) << "select.window_steps";
  EXPECT_EQ(o.stability.theta, lib.stability.theta) << "select.theta";
  EXPECT_EQ(o.stability.weight, lib.stability.weight) << "select.stability_weight";
  EXPECT_EQ(o.stability.hold_threshold, lib.stability.hold_threshold) << "select.hold_threshold";
  EXPECT_EQ(o.mass_tree.min_blocks, lib.mass_tree.min_blocks) << "select.mass_tree_min_blocks";
  EXPECT_EQ(o.mass_tree.max_read_fraction, lib.mass_tree.max_read_fraction)
      << "select.mass_tree_max_read_fraction";
  EXPECT_EQ(o.mass_tree.recent_blocks, lib.mass_tree.recent_blocks)
      << "select.mass_tree_recent_blocks";
  EXPECT_EQ(o.mass_tree.reuse_steps, lib.mass_tree.reuse_steps) << "select.mass_tree_reuse_steps";
  EXPECT_EQ(o.mass_tree.reuse_min_cosine, lib.mass_tree.reuse_min_cosine)
      << "select.mass_tree_reuse_min_cosine";
  auto off = LoadConfig("", {"select.mass_tree_reuse_steps=0"});
  ASSERT_OK(off.status());
  EXPECT_EQ(SelectorOptionsOf(*off).mass_tree.reuse_steps, 0);
}

// A removed key still loads when it asks for what the daemon does anyway.
TEST_F(ConfigTest, RemovedIndexKeyLoadsWhenOff) {
  auto config = LoadConfig(Write("[index]\nq8_page_rows = false\n"), {});
  EXPECT_OK(config.status());
}

TEST(ParseSizeTest, Units) {
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("64KiB"), 64u << 10);
  EXPECT_EQ(*ParseSize("3GiB"), 3ull << 30);
  EXPECT_EQ(*ParseSize("2MB"), 2000000u);
  EXPECT_FALSE(ParseSize("").ok());
  EXPECT_FALSE(ParseSize("GiB").ok());
  EXPECT_FALSE(ParseSize("5 parsecs").ok());
  EXPECT_FALSE(ParseSize("99999999999TiB").ok());
}

}  // namespace
}  // namespace kvtier::daemon
