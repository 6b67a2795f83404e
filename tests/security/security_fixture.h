// A kvtierd (in-process daemon::Server over a real Unix socket) with
// authentication on: a tenants file with data tenants "a" and "b", a
// quota-bound data tenant "q" and an admin "ops", each with a fresh bearer
// token. Helpers connect as a tenant, register the test profile and put
// blocks whose keys are real fp16 values (so they join contexts).
#ifndef KVTIER_TESTS_SECURITY_SECURITY_FIXTURE_H_
#define KVTIER_TESTS_SECURITY_SECURITY_FIXTURE_H_

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/client.h"
#include "daemon/config.h"
#include "daemon/server.h"
#include "gtest/gtest.h"
#include "index/kernels/simd.h"
#include "proto/auth/token.h"
#include "tests/integration/test_daemon.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

namespace kvtier::security {

// 2 layers x (k|v) x 2 kv heads x 16 tokens x 32 dims x fp16 = 8 KiB.
inline constexpr int kLayers = 2, kHeads = 2, kTokens = 16, kDim = 32;
inline constexpr size_t kBlockBytes = size_t{kLayers} * 2 * kHeads * kTokens * kDim * 2;

// Block bytes with finite keys drawn from `seed`.
inline std::string Payload(uint64_t seed) {
  std::string out(kBlockBytes, '\0');
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  auto* h = reinterpret_cast<uint16_t*>(out.data());
  for (size_t i = 0; i < kBlockBytes / 2; ++i) h[i] = index::simd::FloatToHalf(noise(rng));
  return out;
}

inline std::string BlockIdOf(const std::string& tag, int i) {
  std::string id = tag + "-" + std::to_string(i);
  id.resize(32, '.');
  return id;
}

class SecurityTest : public ::testing::Test {
 protected:
  // Extra config overrides and extra TOML appended to the tenants file.
  void StartDaemon(const std::vector<std::string>& extra = {},
                   const std::string& more_tenants = "") {
    tmp_ = std::make_unique<::kvtier::testing::ScopedTempDir>("sec");
    dir_ = tmp_->path();
    for (const char* name : {"a", "b", "q", "ops"}) tokens_[name] = auth::NewToken();
    tenants_file_ = dir_ + "/tenants.toml";
    WriteTenants(more_tenants);
    options_.overrides = {"log.level=error",
                          "tiers.device.capacity_bytes=1MiB",
                          "tiers.host.capacity_bytes=4MiB",
                          "tiers.host.staging_bytes=512KiB",
                          "tiers.nvme.file_size_bytes=8MiB",
                          "leases.default_ttl_ms=60000",
                          "auth.tenants_file=" + tenants_file_,
                          "auth.tenant_arena_bytes=512KiB",
                          "auth.tenant_staging_bytes=256KiB"};
    options_.overrides.insert(options_.overrides.end(), extra.begin(), extra.end());
    // No client of its own: each test connects as a tenant (As()).
    options_.connect = false;
    RestartDaemon();
  }

  // Starts the daemon again with the settings of the last StartDaemon, on
  // the same data folder; server_ must be null (reset) first.
  void RestartDaemon() {
    auto daemon = testing::StartTestDaemon(dir_ + "/data", options_);
    ASSERT_OK(daemon);
    config_ = daemon->config;
    server_ = std::move(daemon->server);
  }

  void WriteTenants(const std::string& more = "") {
    std::ofstream f(tenants_file_, std::ios::trunc);
    for (const char* name : {"a", "b"}) {
      f << "[[tenants]]\nname = \"" << name << "\"\nrole = \"data\"\ntoken_sha256 = [\""
        << auth::HashToken(tokens_[name]) << "\"]\ncert_names = [\"" << name << "\"]\n";
    }
    f << "[[tenants]]\nname = \"q\"\nrole = \"data\"\ntoken_sha256 = [\""
      << auth::HashToken(tokens_["q"]) << "\"]\n[tenants.quotas]\n"
      << "contexts = 2\nblocks_per_context = 8\nstaging_slots = 4\nprofiles = 1\n"
      << "pinned_bytes = \"16KiB\"\nnvme_bytes = \"32KiB\"\nhost_bytes = \"64KiB\"\n";
    f << "[[tenants]]\nname = \"ops\"\nrole = \"admin\"\ntoken_sha256 = [\""
      << auth::HashToken(tokens_["ops"]) << "\"]\n";
    f << more;
  }

  void TearDown() override {
    server_.reset();
    tmp_.reset();
  }

  std::unique_ptr<Client> As(const std::string& tenant) {
    ClientOptions options;
    options.token = tokens_.count(tenant) ? tokens_[tenant] : tenant;
    auto client = Client::Connect(server_->socket_path(), options);
    EXPECT_OK(client);
    return client.ok() ? std::move(*client) : nullptr;
  }

  static v1::ModelProfile Profile() {
    v1::ModelProfile profile;
    profile.set_name("tiny");
    profile.set_revision("1");
    profile.set_num_layers(kLayers);
    profile.set_num_kv_heads(kHeads);
    profile.set_head_dim(kDim);
    profile.set_block_size_tokens(kTokens);
    profile.set_dtype(v1::DTYPE_FP16);
    return profile;
  }

  static uint64_t Register(Client* c) {
    auto registered = c->RegisterProfile(Profile());
    EXPECT_OK(registered);
    return registered.ok() ? registered->profile_id() : 0;
  }

  // Puts ids[i] with Payload(first_seed + i); returns the per-block codes.
  static std::vector<int> Put(Client* c, uint64_t profile_id, const std::vector<std::string>& ids,
                              uint64_t first_seed, bool durable = false, bool retain = false) {
    v1::PutBlocksRequest req;
    req.set_profile_id(profile_id);
    req.set_durable(durable);
    req.set_retain(retain);
    for (size_t i = 0; i < ids.size(); ++i) {
      v1::BlockPut* b = req.add_blocks();
      b->set_block_id(ids[i]);
      b->set_data(Payload(first_seed + i));
    }
    auto put = c->PutBlocks({req});
    EXPECT_OK(put);
    std::vector<int> codes;
    if (put.ok()) {
      for (const auto& r : put->results()) codes.push_back(r.status().code());
    }
    return codes;
  }

  static std::vector<std::string> Ids(const std::string& tag, int n) {
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) ids.push_back(BlockIdOf(tag, i));
    return ids;
  }

  std::unique_ptr<::kvtier::testing::ScopedTempDir> tmp_;
  std::string dir_;
  std::string tenants_file_;
  std::map<std::string, std::string> tokens_;
  testing::TestDaemonOptions options_;
  daemon::Config config_;
  std::unique_ptr<daemon::Server> server_;
};

// Tenants a and b connected, each with the test profile registered.
class TwoTenantTest : public SecurityTest {
 protected:
  void SetUp() override {
    StartDaemon();
    a_ = As("a");
    b_ = As("b");
    pa_ = Register(a_.get());
    pb_ = Register(b_.get());
  }
  std::unique_ptr<Client> a_, b_;
  uint64_t pa_ = 0, pb_ = 0;
};

}  // namespace kvtier::security

#endif  // KVTIER_TESTS_SECURITY_SECURITY_FIXTURE_H_
