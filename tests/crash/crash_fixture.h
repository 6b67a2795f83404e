// CrashFixture: the crash tests' setup. A kvtierd child process on small
// tiers (128 blocks of host DRAM, 256 of NVMe, a 64-block device arena,
// 32 blocks of retained quota; 8 KiB blocks) with one admin tenant, killed
// and restarted by the tests (CrashDaemon); its directory and logs are kept
// when a test fails.
//
// Thread safety: use from the test's main thread.
#ifndef KVTIER_TESTS_CRASH_CRASH_FIXTURE_H_
#define KVTIER_TESTS_CRASH_CRASH_FIXTURE_H_

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "proto/auth/token.h"
#include "tests/crash/crash_block.h"
#include "tests/crash/crash_daemon.h"
#include "tests/crash/failure_log.h"
#include "tests/crash/restart_check.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

namespace kvtier::crash {

inline constexpr char kTenant[] = "crash";
inline constexpr uint64_t kRetainedQuotaBytes = 32 * kBlockBytes;
inline constexpr uint32_t kNvmeFiles = 2;
inline constexpr uint64_t kNvmeFileBytes = 1 << 20;
inline constexpr std::chrono::seconds kStartTimeout{60};

inline uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

class CrashFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    token_ = auth::NewToken();
    std::ofstream(dir_ + "/tenants.toml")
        << "[[tenants]]\nname = \"" << kTenant << "\"\nrole = \"admin\"\ntoken_sha256 = [\""
        << auth::HashToken(token_)
        << "\"]\n[tenants.quotas]\nretained_bytes = " << RetainedQuotaBytes() << "\n";
  }
  // The tenant's retained_bytes quota (0: none).
  virtual uint64_t RetainedQuotaBytes() const { return kRetainedQuotaBytes; }

  void TearDown() override {
    daemon_.reset();
    if (HasFailure()) tmp_.Keep();  // the daemon's log and data
  }

  std::unique_ptr<Client> Connect() {
    ClientOptions options;
    options.token = token_;
    options.call_timeout = std::chrono::seconds(60);
    auto client = Client::Connect(daemon_->socket_path(), options);
    EXPECT_OK(client) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  CrashDaemonOptions DaemonOptions(const std::vector<std::string>& extra = {}) const {
    CrashDaemonOptions options{
        KVTIERD_PATH,
        dir_,
        {"log.level=info", "server.shutdown_grace_ms=1000", "tiers.device.backend=shm",
         "tiers.device.shm_dir=" + shm_dir_, "tiers.host.shm_dir=" + shm_dir_,
         "tiers.device.capacity_bytes=1MiB", "tiers.host.capacity_bytes=1MiB",
         "tiers.host.staging_bytes=256KiB", absl::StrCat("tiers.nvme.file_count=", kNvmeFiles),
         absl::StrCat("tiers.nvme.file_size_bytes=", kNvmeFileBytes), "tiers.nvme.io_threads=1",
         "leases.default_ttl_ms=60000", "auth.tenants_file=" + dir_ + "/tenants.toml",
         "auth.tenant_arena_bytes=512KiB", "auth.tenant_staging_bytes=256KiB"}};
    options.settings.insert(options.settings.end(), extra.begin(), extra.end());
    return options;
  }

  // Lines of the life's log where the block store reported a problem it
  // could not return to a caller (quarantines, recovery repairs, extents it
  // could not free): none may appear.
  void ExpectNoStoreWarnings(int life, FailureLog* failures) {
    for (const std::string& line : daemon_->LogLines(life, "store: ")) {
      failures->Add(absl::StrCat("life ", life, " logged a store warning: ", line));
    }
  }

  // Starts the first life and registers CrashProfile(); *admin is a client
  // of the load's tenant (role admin).
  void StartFirstLife(std::unique_ptr<Client>* admin, uint64_t* profile_id,
                      const std::vector<std::string>& extra_settings = {}) {
    daemon_ = std::make_unique<CrashDaemon>(DaemonOptions(extra_settings));
    std::string error;
    ASSERT_TRUE(daemon_->Start(kStartTimeout, &error)) << error;
    *admin = Connect();
    ASSERT_NE(*admin, nullptr);
    auto registered = (*admin)->RegisterProfile(CrashProfile());
    ASSERT_OK(registered) << registered.status();
    ASSERT_EQ(registered->block_size_bytes(), kBlockBytes);
    *profile_id = registered->profile_id();
  }

  RestartCheckOptions CheckOptions(int cycle, uint64_t profile_id, uint64_t probe_seed) const {
    RestartCheckOptions o;
    o.cycle = cycle;
    o.profile_id = profile_id;
    o.tenant = kTenant;
    o.retained_quota_bytes = kRetainedQuotaBytes;
    o.nvme_dir = daemon_->data_dir() + "/nvme";
    o.nvme_file_count = kNvmeFiles;
    o.nvme_file_size_bytes = kNvmeFileBytes;
    o.probe_seed = probe_seed;
    return o;
  }

  ::kvtier::testing::ScopedTempDir tmp_{"crash"}, shm_{"crash", "/dev/shm"};
  const std::string dir_ = tmp_.path(), shm_dir_ = shm_.path();
  std::string token_;
  std::unique_ptr<CrashDaemon> daemon_;
};

}  // namespace kvtier::crash

#endif  // KVTIER_TESTS_CRASH_CRASH_FIXTURE_H_
