// kvtierd and kvtierctl as real processes: readiness via sd_notify, status
// output, configuration errors, SIGTERM.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/escaping.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/subprocess.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

namespace kvtier {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// One layer, one KV head, 64 dims, 32 tokens, fp16: 8 KiB blocks.
v1::ModelProfile EightKiBProfile(const std::string& name) {
  v1::ModelProfile profile;
  profile.set_name(name);
  profile.set_num_layers(1);
  profile.set_num_kv_heads(1);
  profile.set_head_dim(64);
  profile.set_block_size_tokens(32);
  profile.set_dtype(v1::DTYPE_FP16);
  return profile;
}
using testing::ChildProcess;
using testing::NotifySocket;
using testing::RunCommand;

class ProcessTest : public ::testing::Test {
 protected:
  void SetUp() override { socket_ = dir_ + "/kvtierd.sock"; }

  // Starts kvtierd and waits for READY=1 on a notify socket.
  std::unique_ptr<ChildProcess> StartDaemon(std::vector<std::string> extra_args = {},
                                            std::vector<std::string> extra_env = {}) {
    notify_ = std::make_unique<NotifySocket>(dir_ + "/notify.sock");
    std::vector<std::string> argv = {KVTIERD_PATH,
                                     "--data-dir",
                                     dir_,
                                     "--socket",
                                     socket_,
                                     "--set",
                                     "tiers.host.capacity_bytes=64MiB",
                                     "--set",
                                     "tiers.device.capacity_bytes=8MiB",
                                     "--set",
                                     "tiers.host.staging_bytes=8MiB",
                                     "--set",
                                     "tiers.nvme.file_count=1",
                                     "--set",
                                     "tiers.nvme.file_size_bytes=16MiB"};
    argv.insert(argv.end(), extra_args.begin(), extra_args.end());
    extra_env.push_back("NOTIFY_SOCKET=" + notify_->path());
    auto child = std::make_unique<ChildProcess>(argv, extra_env, dir_ + "/log");
    EXPECT_TRUE(notify_->WaitFor("READY=1", std::chrono::seconds(20)))
        << testing::ReadFile(dir_ + "/log");
    return child;
  }

  // kvtierctl against this test's daemon: `--socket socket_` and args.
  testing::CommandResult Ctl(std::vector<std::string> args) const {
    args.insert(args.begin(), {KVTIERCTL_PATH, "--socket", socket_});
    return RunCommand(args);
  }

  // Every command in `cmds` has --help with examples.
  static void ExpectHelpWithExamples(std::initializer_list<const char*> cmds) {
    for (const char* cmd : cmds) {
      auto help = RunCommand({KVTIERCTL_PATH, cmd, "--help"});
      EXPECT_EQ(help.exit_code, 0) << cmd;
      EXPECT_THAT(help.out, HasSubstr("Example")) << cmd;
    }
  }

  ::kvtier::testing::ScopedTempDir tmp_{"pt"};
  const std::string dir_ = tmp_.path();
  std::string socket_;
  std::unique_ptr<NotifySocket> notify_;
};

TEST_F(ProcessTest, StatusPrintsTiersAndSigtermExitsCleanly) {
  auto daemon = StartDaemon();
  auto status = Ctl({"status"});
  EXPECT_EQ(status.exit_code, 0) << status.err;
  EXPECT_THAT(status.out, HasSubstr("kvtierd 0.1.0"));
  EXPECT_THAT(status.out, HasSubstr("device"));
  EXPECT_THAT(status.out, HasSubstr("host"));
  EXPECT_THAT(status.out, HasSubstr("nvme"));
  EXPECT_THAT(status.out, HasSubstr("64 MiB"));  // host tier capacity
  EXPECT_THAT(status.out, HasSubstr("TENANT"));
  EXPECT_THAT(status.out, HasSubstr("default  "));  // authentication off: one tenant

  auto json = RunCommand({KVTIERCTL_PATH, "status", "--json"}, {"KVTIER_SOCKET=" + socket_});
  EXPECT_EQ(json.exit_code, 0) << json.err;
  EXPECT_THAT(json.out, HasSubstr("\"tier\": \"TIER_NVME\""));
  EXPECT_THAT(json.out, HasSubstr("\"capacity_bytes\": \"67108864\""));

  daemon->Signal(SIGTERM);
  auto code = daemon->Wait(std::chrono::seconds(5));
  ASSERT_TRUE(code.has_value()) << "kvtierd did not exit within 5 s of SIGTERM";
  EXPECT_EQ(*code, 0);
  EXPECT_FALSE(std::filesystem::exists(socket_));
  EXPECT_THAT(testing::ReadFile(dir_ + "/log"), HasSubstr("stopped"));
}

TEST_F(ProcessTest, PingsTheSystemdWatchdogWhileResponsive) {
  // As systemd starts it with WatchdogSec=1: pings at half the interval.
  auto daemon = StartDaemon({}, {"WATCHDOG_USEC=1000000"});
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(notify_->WaitFor("WATCHDOG=1", std::chrono::seconds(5)))
        << "ping " << i << testing::ReadFile(dir_ + "/log");
  }
  daemon->Signal(SIGTERM);
  auto code = daemon->Wait(std::chrono::seconds(5));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0);
}

TEST_F(ProcessTest, LsAndVerifyReportBlocksAndCorruption) {
  auto daemon = StartDaemon();
  auto client = Client::Connect(socket_);
  ASSERT_OK(client);
  auto registered = (*client)->RegisterProfile(EightKiBProfile("ctl"));
  ASSERT_OK(registered);
  v1::PutBlocksRequest put;
  put.set_profile_id(registered->profile_id());
  put.set_durable(true);
  for (int i = 0; i < 5; ++i) {
    auto* b = put.add_blocks();
    b->set_block_id("blk" + std::to_string(i));
    b->set_data(std::string(8192, static_cast<char>('a' + i)));
  }
  auto stored = (*client)->PutBlocks({put});
  ASSERT_OK(stored);
  EXPECT_EQ(stored->blocks_stored(), 5u);

  auto ls = Ctl({"ls", "--limit", "10"});
  EXPECT_EQ(ls.exit_code, 0) << ls.err;
  EXPECT_THAT(ls.out, HasSubstr("host"));
  EXPECT_THAT(ls.out, HasSubstr("40 KiB"));    // 5 blocks of 8 KiB
  EXPECT_THAT(ls.out, HasSubstr("626c6b30"));  // "blk0" in hex

  auto verify = Ctl({"verify"});
  EXPECT_EQ(verify.exit_code, 0) << verify.err;
  EXPECT_THAT(verify.out, HasSubstr("verified 5 blocks (every copy): 0 corrupt"));
  EXPECT_THAT(verify.err, HasSubstr("5/5 blocks 100%"));  // progress bar

  // Damage the NVMe copy of every block: verify finds and quarantines them.
  {
    std::fstream f(dir_ + "/nvme/nvme-000.dat", std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    for (int block = 0; block < 5; ++block) {
      f.seekp(block * 8192 + 17);
      f.put('!');
    }
  }
  verify = Ctl({"verify"});
  EXPECT_EQ(verify.exit_code, 4) << verify.err;
  EXPECT_THAT(verify.out, HasSubstr("5 corrupt"));
  auto status = Ctl({"status", "--json"});
  EXPECT_THAT(status.out, HasSubstr("\"quarantined_blocks\": \"5\""));
  EXPECT_THAT(status.out, HasSubstr("\"checksum_failures_nvme\": \"5\""));
  auto table = Ctl({"status"});
  EXPECT_THAT(table.out, HasSubstr("checksum failures device/host/nvme 0/0/5"));
  // A second run finds nothing new but still reports every quarantined
  // block, and fails.
  verify = Ctl({"verify", "--json"});
  EXPECT_EQ(verify.exit_code, 4) << verify.err;
  EXPECT_THAT(verify.out, HasSubstr("\"block_id\": \"626c6b30\""));  // hex, not base64
  EXPECT_THAT(verify.out, HasSubstr("\"corrupt_blocks\": \"0\""));
  auto quarantined = Ctl({"ls", "--quarantined"});
  EXPECT_EQ(quarantined.exit_code, 0) << quarantined.err;
  EXPECT_THAT(quarantined.out, HasSubstr("626c6b34"));  // "blk4"
  EXPECT_THAT(quarantined.out, HasSubstr("nvme-000.dat"));
  EXPECT_THAT(quarantined.out, HasSubstr("checksum"));
  // Each quarantine left a warning naming the block in the daemon's log.
  EXPECT_THAT(testing::ReadFile(dir_ + "/log"),
              HasSubstr("quarantined nvme copy of block 626c6b32"));
  daemon->Signal(SIGTERM);
  // With a client connection still open, shutdown takes up to the grace
  // (server.shutdown_grace_ms, 5 s): gRPC waits for the connection to go.
  EXPECT_EQ(daemon->Wait(std::chrono::seconds(30)), std::optional<int>(0));
}

TEST_F(ProcessTest, ContextsTopAndTierFilters) {
  auto daemon = StartDaemon();
  auto client = Client::Connect(socket_);
  ASSERT_OK(client);
  auto registered = (*client)->RegisterProfile(EightKiBProfile("ctl-ctx"));
  ASSERT_OK(registered);
  v1::PutBlocksRequest put;
  put.set_profile_id(registered->profile_id());
  put.set_durable(true);
  for (int i = 0; i < 3; ++i) {
    auto* b = put.add_blocks();
    b->set_block_id("ctx" + std::to_string(i));
    std::string bytes(8192, '\0');
    for (size_t k = 0; k < bytes.size(); k += 2) bytes[k] = static_cast<char>(k * 7 + i);
    b->set_data(bytes);
  }
  ASSERT_OK((*client)->PutBlocks({put}));

  auto none = Ctl({"contexts"});
  EXPECT_EQ(none.exit_code, 0) << none.err;
  EXPECT_THAT(none.out, HasSubstr("(no open contexts)"));

  v1::OpenContextRequest open;
  open.set_profile_id(registered->profile_id());
  v1::Segment* segment = open.add_segments();
  for (int i = 0; i < 3; ++i) segment->add_block_ids("ctx" + std::to_string(i));
  v1::OpenContextResponse opened;
  grpc::ClientContext ctx;
  ASSERT_OK((*client)->kvtier_stub()->OpenContext(&ctx, open, &opened));
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(opened.context_id()));

  auto table = Ctl({"contexts"});
  EXPECT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("CONTEXT"));
  EXPECT_THAT(table.out, HasSubstr(hex));  // ids in hex
  auto json = Ctl({"contexts", "--json"});
  EXPECT_EQ(json.exit_code, 0) << json.err;
  EXPECT_THAT(json.out, HasSubstr("\"num_blocks\": 3"));
  EXPECT_THAT(json.out, HasSubstr("\"context_id\": \"" + std::to_string(opened.context_id())));

  // top: a bounded number of refreshes; --json gives one object per line.
  auto top = Ctl({"top", "--iterations", "2", "--interval-ms", "10", "--json"});
  EXPECT_EQ(top.exit_code, 0) << top.err;
  EXPECT_EQ(std::count(top.out.begin(), top.out.end(), '\n'), 2) << top.out;
  EXPECT_THAT(top.out, HasSubstr("{\"refresh\":0,\"stats\":{"));
  EXPECT_THAT(top.out, HasSubstr("{\"refresh\":1,"));
  EXPECT_THAT(top.out, HasSubstr("\"num_blocks\":3"));
  auto top_text = Ctl({"top", "--iterations", "1"});
  EXPECT_EQ(top_text.exit_code, 0) << top_text.err;
  EXPECT_THAT(top_text.out, HasSubstr("TIER"));
  EXPECT_THAT(top_text.out, HasSubstr(hex));

  // ls --tier: only that tier's rows; a bad tier is a usage error.
  // (A block is listed under the tier of its fastest copy.)
  auto host = Ctl({"ls", "--tier", "host"});
  EXPECT_EQ(host.exit_code, 0) << host.err;
  EXPECT_THAT(host.out, HasSubstr("24 KiB"));
  auto device = Ctl({"ls", "--tier", "device"});
  EXPECT_EQ(device.exit_code, 0) << device.err;
  EXPECT_THAT(device.out, HasSubstr("(no blocks)"));
  EXPECT_THAT(device.out, Not(HasSubstr("host")));
  auto bad = Ctl({"ls", "--tier", "tape"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--tier"));
  // Every command has --help with examples.
  ExpectHelpWithExamples({"ls", "contexts", "top"});
  client->reset();
  daemon->Signal(SIGTERM);
  // Up to the 5 s grace with a connection open (see LsAndVerify...).
  EXPECT_EQ(daemon->Wait(std::chrono::seconds(30)), std::optional<int>(0));
}

TEST_F(ProcessTest, ProfilesEvictAndDrainDevice) {
  auto daemon = StartDaemon();
  auto client = Client::Connect(socket_);
  ASSERT_OK(client);
  auto registered = (*client)->RegisterProfile(EightKiBProfile("ctl-evict"));
  ASSERT_OK(registered);
  const uint64_t pid = registered->profile_id();
  v1::PutBlocksRequest put;
  put.set_profile_id(pid);
  for (int i = 0; i < 3; ++i) {
    auto* b = put.add_blocks();
    b->set_block_id("ev" + std::to_string(i));
    b->set_data(std::string(8192, static_cast<char>('a' + i)));
  }
  ASSERT_OK((*client)->PutBlocks({put}));
  const std::string P = std::to_string(pid);
  auto hex = [](const std::string& id) { return absl::BytesToHexString(id); };
  auto tier_of = [&](const std::string& id) {
    v1::LookupRequest req;
    req.set_profile_id(pid);
    req.add_block_ids(id);
    auto r = (*client)->Lookup(req);
    EXPECT_OK(r);
    return r.ok() && r->entries(0).present() ? r->entries(0).tier() : v1::TIER_UNSPECIFIED;
  };

  // A calibrated profile whose first block competes with its own mass.
  v1::ModelProfile calibrated = EightKiBProfile("ctl-calibrated");
  v1::SelectionCalibration* cal = calibrated.mutable_calibration();
  cal->set_num_q_heads(2);
  cal->add_retrieval_heads()->set_q_head(1);
  cal->add_prior(1.0f);
  cal->add_prior_all(1.0f);
  cal->set_head_min_mass(0.4f);
  cal->set_sink_blocks(0);
  cal->set_local_blocks(1);
  cal->set_sink_mass(0.1f);
  cal->set_sink_mass_all(0.1f);
  cal->set_copy_run(6);
  cal->set_copy_lead(1);
  ASSERT_OK((*client)->RegisterProfile(calibrated));

  auto profiles = Ctl({"profiles"});
  EXPECT_EQ(profiles.exit_code, 0) << profiles.err;
  EXPECT_THAT(profiles.out, HasSubstr("ctl-evict"));
  EXPECT_THAT(profiles.out, HasSubstr("SELECTION"));
  EXPECT_THAT(profiles.out, HasSubstr("heads=1 sink=~ local=1 gate=0.40 copy=6/64"));
  EXPECT_THAT(profiles.out, HasSubstr("1/1/64/32"));
  EXPECT_THAT(profiles.out, HasSubstr("fp16"));
  EXPECT_THAT(profiles.out, HasSubstr("24 KiB"));  // 3 blocks stored
  auto profiles_json = Ctl({"profiles", "--json"});
  EXPECT_EQ(profiles_json.exit_code, 0) << profiles_json.err;
  EXPECT_THAT(profiles_json.out, HasSubstr("\"blocks\": \"3\""));
  EXPECT_THAT(profiles_json.out, HasSubstr("\"owner\": \"default\""));

  // A device copy (handles), released; `drain device` empties the tier.
  v1::GetBlocksRequest get;
  get.set_profile_id(pid);
  get.add_block_ids("ev0");
  get.set_mode(v1::RETURN_MODE_HANDLES);
  uint64_t lease = 0;
  ASSERT_OK((*client)->GetBlocks(get, &lease));
  v1::ReleaseRequest release;
  release.set_lease_id(lease);
  ASSERT_OK((*client)->Release(release));
  ASSERT_EQ(tier_of("ev0"), v1::TIER_DEVICE);
  auto drained = Ctl({"drain", "device"});
  EXPECT_EQ(drained.exit_code, 0) << drained.err;
  EXPECT_THAT(drained.out, HasSubstr("drained 1 blocks out of the device tier"));
  EXPECT_EQ(tier_of("ev0"), v1::TIER_HOST);

  // evict --tier host: the last copy goes to NVMe; default tier: gone.
  auto to_nvme = Ctl({"evict", "--profile", P, "--tier", "host", hex("ev1")});
  EXPECT_EQ(to_nvme.exit_code, 0) << to_nvme.err;
  EXPECT_THAT(to_nvme.out, HasSubstr(hex("ev1") + ": evicted"));
  EXPECT_EQ(tier_of("ev1"), v1::TIER_NVME);
  auto gone = Ctl({"evict", "--profile", P, "--json", hex("ev2")});
  EXPECT_EQ(gone.exit_code, 0) << gone.err;
  EXPECT_THAT(gone.out, HasSubstr("\"statuses\""));
  EXPECT_EQ(tier_of("ev2"), v1::TIER_UNSPECIFIED);
  auto stats = (*client)->Stats();
  ASSERT_OK(stats);
  EXPECT_EQ(stats->evicted_blocks(), 1u);

  // Errors: an unknown block (exit 1, status named), ids not in hex and
  // an unknown tier (usage, exit 2), an unknown profile.
  auto missing = Ctl({"evict", "--profile", P, hex("never-put")});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.out, HasSubstr("NOT_FOUND"));
  auto not_hex = Ctl({"evict", "--profile", P, "xyz"});
  EXPECT_EQ(not_hex.exit_code, 2);
  EXPECT_THAT(not_hex.err, HasSubstr("not hex"));
  auto bad_tier = Ctl({"evict", "--profile", P, "--tier", "tape", hex("ev0")});
  EXPECT_EQ(bad_tier.exit_code, 2);
  auto bad_profile = Ctl({"evict", "--profile", "999", hex("ev0")});
  EXPECT_EQ(bad_profile.exit_code, 1);
  EXPECT_THAT(bad_profile.err, HasSubstr("profile_id"));
  ExpectHelpWithExamples({"profiles", "evict", "drain"});
  client->reset();
  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->Wait(std::chrono::seconds(30)), std::optional<int>(0));
}

TEST_F(ProcessTest, CompactVersionsAndDropVersion) {
  auto daemon = StartDaemon();
  auto client = Client::Connect(socket_);
  ASSERT_OK(client);
  auto registered = (*client)->RegisterProfile(EightKiBProfile("ctl-compact"));
  ASSERT_OK(registered);
  const std::string P = std::to_string(registered->profile_id());
  // Finite fp16 values (1, 0.5, -1, 2, -0.5, 0.25, -2, 1.5), varied per block.
  const uint16_t kHalves[] = {0x3c00, 0x3800, 0xbc00, 0x4000, 0xb800, 0x3400, 0xc000, 0x3e00};
  v1::PutBlocksRequest put;
  put.set_profile_id(registered->profile_id());
  std::vector<std::string> hex_ids;
  for (int b = 0; b < 4; ++b) {
    std::string data(8192, '\0');
    for (size_t i = 0; i < data.size() / 2; ++i) {
      const uint16_t h = kHalves[(i * 7 + b * 3 + i / 64) % 8];
      data[2 * i] = static_cast<char>(h & 0xff);
      data[2 * i + 1] = static_cast<char>(h >> 8);
    }
    auto* block = put.add_blocks();
    block->set_block_id("cp" + std::to_string(b));
    block->set_data(data);
    hex_ids.push_back(absl::BytesToHexString(block->block_id()));
  }
  ASSERT_OK((*client)->PutBlocks({put}));

  std::vector<std::string> cmd = {"compact", "--profile", P, "--retention", "0.25"};
  cmd.insert(cmd.end(), hex_ids.begin(), hex_ids.end());
  auto compacted = Ctl(cmd);
  ASSERT_EQ(compacted.exit_code, 0) << compacted.err;
  EXPECT_THAT(compacted.err, HasSubstr("compacting to 0.25"));
  EXPECT_THAT(compacted.out, HasSubstr("rho 0.250"));
  EXPECT_THAT(compacted.out, HasSubstr("32 slots"));  // 128 tokens x 0.25
  const size_t at = compacted.out.find("context key ");
  ASSERT_NE(at, std::string::npos);
  const std::string key = compacted.out.substr(at + 12, 32);

  auto versions = Ctl({"versions", "--profile", P});
  EXPECT_EQ(versions.exit_code, 0) << versions.err;
  EXPECT_THAT(versions.out, HasSubstr(key));
  EXPECT_THAT(versions.out, HasSubstr("originals"));
  EXPECT_THAT(versions.out, HasSubstr("keydiff/gated/ratio"));
  auto json = Ctl({"versions", "--profile", P, key, "--json"});
  EXPECT_EQ(json.exit_code, 0) << json.err;
  EXPECT_THAT(json.out, HasSubstr("\"context_key\": \"" + key + "\""));

  // The originals may go once a compacted version exists; the last copy stays.
  auto drop0 = Ctl({"drop-version", "--profile", P, key, "0"});
  EXPECT_EQ(drop0.exit_code, 0) << drop0.err;
  EXPECT_THAT(drop0.out, HasSubstr("4 blocks deleted"));
  auto drop1 = Ctl({"drop-version", "--profile", P, key, "1"});
  EXPECT_EQ(drop1.exit_code, 1);
  EXPECT_THAT(drop1.err, HasSubstr("last copy"));
  auto bad = Ctl({"compact", "--profile", P, "--retention", "1.5", hex_ids[0]});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--retention"));
  ExpectHelpWithExamples({"compact", "versions", "drop-version"});
  client->reset();
  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->Wait(std::chrono::seconds(30)), std::optional<int>(0));
}

TEST_F(ProcessTest, SigintAlsoStops) {
  auto daemon = StartDaemon({"--set", "log.format=json"});
  daemon->Signal(SIGINT);
  auto code = daemon->Wait(std::chrono::seconds(5));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0);
  EXPECT_THAT(testing::ReadFile(dir_ + "/log"), HasSubstr("\"level\":\"info\""));
}

TEST_F(ProcessTest, KvtierctlWithoutDaemonFailsClearly) {
  auto status = Ctl({"--timeout-ms", "500", "status"});
  EXPECT_EQ(status.exit_code, 3);
  EXPECT_THAT(status.err, HasSubstr("cannot reach kvtierd"));
}

TEST_F(ProcessTest, UnknownKeyInConfigFileIsNamed) {
  std::string path = dir_ + "/bad.toml";
  std::ofstream(path) << "[tiers.host]\ncapacity = \"1GiB\"\n";
  auto run = RunCommand({KVTIERD_PATH, "--config", path, "--check-config"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("unknown key 'tiers.host.capacity'"));
}

TEST_F(ProcessTest, MalformedConfigFileIsReported) {
  std::string path = dir_ + "/broken.toml";
  std::ofstream(path) << "[server\ndata_dir = 3\n";
  auto run = RunCommand({KVTIERD_PATH, "--config", path});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr(path + ":1"));
}

TEST_F(ProcessTest, DefaultConfigIsPrintableAndValid) {
  auto print = RunCommand({KVTIERD_PATH, "--print-default-config"});
  ASSERT_EQ(print.exit_code, 0);
  EXPECT_THAT(print.out, HasSubstr("[tiers.nvme]"));
  std::string path = dir_ + "/defaults.toml";
  std::ofstream(path) << print.out;
  auto check = RunCommand({KVTIERD_PATH, "--config", path, "--check-config"});
  EXPECT_EQ(check.exit_code, 0) << check.err;
}

}  // namespace
}  // namespace kvtier
