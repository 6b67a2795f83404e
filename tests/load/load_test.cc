// The load test: kvtierd (a real child process) under N concurrent client
// streams (tests/load/streams.h) for a fixed time, with tiers that hold
// about a tenth of the working set so eviction runs all the time. Passes
// when no byte read differs from what was written, nothing unexpected came
// back, eviction ran, the daemon's RSS, fds, threads and pinned device
// bytes stayed flat after a warm-up, and nothing stays pinned, leased,
// reserved or open once every stream has stopped. Prints p50/p99/max per
// operation; KVTIER_LOAD_REPORT=path also writes them as JSON (report.h).
//
// Knobs (environment; README.md): KVTIER_LOAD_SECONDS (8; the long run is
// 60), KVTIER_LOAD_STREAMS (64), KVTIER_LOAD_ENGINES (streams / 4),
// KVTIER_LOAD_BLOCK_BYTES (64KiB), KVTIER_LOAD_IDS_PER_STREAM (64),
// KVTIER_LOAD_CACHE_FRACTION (0.10), KVTIER_LOAD_DURABLE_FRACTION (0.2),
// KVTIER_LOAD_SLOT_FRACTION (0.25), KVTIER_LOAD_MIX (put:get:handles:delete,
// "40:40:15:5"), KVTIER_LOAD_SELECTS_PER_BLOCK (4), KVTIER_LOAD_SEED,
// KVTIER_LOAD_SET ("section.key=value;..." passed to kvtierd as --set),
// KVTIER_LOAD_REPORT, KVTIER_LOAD_KEEP (keep the data dir and log).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "proto/auth/token.h"
#include "tests/integration/subprocess.h"
#include "tests/load/load_block.h"
#include "tests/load/load_daemon.h"
#include "tests/load/report.h"
#include "tests/load/resource_sampler.h"
#include "tests/load/streams.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

namespace kvtier::load {
namespace {

constexpr char kTenant[] = "load";
constexpr std::chrono::seconds kStartTimeout{60};
constexpr std::chrono::milliseconds kSamplePeriod{500};

std::string EnvString(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}
uint64_t EnvU64(const char* name, uint64_t fallback) {
  uint64_t v = fallback;
  const std::string text = EnvString(name, "");
  if (!text.empty() && !absl::SimpleAtoi(text, &v)) ADD_FAILURE() << name << "=" << text;
  return v;
}
double EnvDouble(const char* name, double fallback) {
  double v = fallback;
  const std::string text = EnvString(name, "");
  if (!text.empty() && !absl::SimpleAtod(text, &v)) ADD_FAILURE() << name << "=" << text;
  return v;
}
uint64_t RoundUp(uint64_t n, uint64_t unit) { return (n + unit - 1) / unit * unit; }

// The tiers: together cache_fraction of the working set ((streams + 1) x
// ids_per_stream blocks: the +1 is the engines' shared prefixes), 30%
// device, 30% host, 40% NVMe in two files; the device arena holds at least
// two Select sets per engine (a new set is pinned before the old one goes).
struct TierSizes {
  uint64_t working_set_bytes = 0;
  uint64_t device_bytes = 0, host_bytes = 0, nvme_file_bytes = 0, staging_bytes = 0;
  uint64_t total() const { return device_bytes + host_bytes + 2 * nvme_file_bytes; }
};
TierSizes SizeTiers(const StreamsOptions& o, double cache_fraction) {
  const uint64_t b = o.block_bytes;
  TierSizes t;
  t.working_set_bytes = (o.streams + 1) * o.ids_per_stream * b;
  const auto cache_bytes = static_cast<uint64_t>(cache_fraction * t.working_set_bytes);
  t.device_bytes = std::max(RoundUp(cache_bytes * 3 / 10, b),
                            2 * o.engines * o.select_budget_blocks * b + 8 * b);
  t.host_bytes = RoundUp(cache_bytes * 3 / 10, b);
  t.nvme_file_bytes = std::max<uint64_t>(RoundUp(cache_bytes / 5, b), 1 << 20);
  t.staging_bytes = 64 * b;
  return t;
}

class LoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    token_ = auth::NewToken();
    std::ofstream(dir_ + "/tenants.toml")
        << "[[tenants]]\nname = \"" << kTenant << "\"\nrole = \"admin\"\ntoken_sha256 = [\""
        << auth::HashToken(token_) << "\"]\n";
  }
  void TearDown() override {
    daemon_.reset();
    if (HasFailure() || !EnvString("KVTIER_LOAD_KEEP", "").empty()) {
      tmp_.Keep();
      std::cout << "load: data and kvtierd.log kept in " << dir_ << std::endl;
    }
  }

  // The knobs (README.md), checked; fatal failures on a bad value.
  void ReadOptions(StreamsOptions* o, double* cache_fraction, std::string* mix) {
    o->token = token_;
    o->duration = std::chrono::milliseconds(EnvU64("KVTIER_LOAD_SECONDS", 8) * 1000);
    o->streams = static_cast<int>(EnvU64("KVTIER_LOAD_STREAMS", 64));
    o->engines = static_cast<int>(EnvU64("KVTIER_LOAD_ENGINES", o->streams / 4));
    o->block_bytes = EnvU64("KVTIER_LOAD_BLOCK_BYTES", 64 << 10);
    o->ids_per_stream = EnvU64("KVTIER_LOAD_IDS_PER_STREAM", 64);
    o->durable_fraction = EnvDouble("KVTIER_LOAD_DURABLE_FRACTION", 0.2);
    o->slot_fraction = EnvDouble("KVTIER_LOAD_SLOT_FRACTION", 0.25);
    o->selects_per_block = static_cast<int>(EnvU64("KVTIER_LOAD_SELECTS_PER_BLOCK", 4));
    o->seed = EnvU64("KVTIER_LOAD_SEED", std::random_device()());
    *cache_fraction = EnvDouble("KVTIER_LOAD_CACHE_FRACTION", 0.10);
    *mix = EnvString("KVTIER_LOAD_MIX", "40:40:15:5");
    std::vector<std::string> w = absl::StrSplit(*mix, ':');
    ASSERT_EQ(w.size(), 4u) << "KVTIER_LOAD_MIX is put:get:handles:delete, got " << *mix;
    int* fields[] = {&o->mix.put, &o->mix.get, &o->mix.handles, &o->mix.del};
    for (size_t i = 0; i < 4; ++i) {
      ASSERT_TRUE(absl::SimpleAtoi(w[i], fields[i]) && *fields[i] >= 0) << *mix;
    }
    ASSERT_GT(o->mix.put + o->mix.get + o->mix.handles + o->mix.del, 0) << *mix;
    ASSERT_GE(o->streams, 1);
    ASSERT_LE(o->engines, o->streams);
    ASSERT_TRUE(o->block_bytes % kBytesPerLayer == 0 && o->block_bytes / kBytesPerLayer >= 1 &&
                o->block_bytes / kBytesPerLayer <= kMaxLayers)
        << "KVTIER_LOAD_BLOCK_BYTES must be a multiple of " << kBytesPerLayer << " up to "
        << kMaxLayers * kBytesPerLayer;
    ASSERT_GE(o->ids_per_stream, static_cast<uint64_t>(o->context_blocks + o->prompt_blocks));
    ASSERT_GE(o->selects_per_block, 1);
    ASSERT_GT(*cache_fraction, 0);
    // The flat check needs 2 x 3 samples (0.5 s apart) after a 2 s warm-up.
    ASSERT_GE(o->duration, std::chrono::seconds(5)) << "KVTIER_LOAD_SECONDS must be at least 5";
  }

  // kvtierd's --set values: the tiers, shared memory in a directory of
  // this test, authentication with one admin tenant, then `extra`
  // ("a.b=c;d.e=f", later values win).
  std::vector<std::string> DaemonSettings(const StreamsOptions& o, const TierSizes& t,
                                          const std::string& extra) const {
    std::vector<std::string> settings = {
        "log.level=info",
        "server.shutdown_grace_ms=2000",
        "tiers.device.backend=shm",
        "tiers.device.shm_dir=" + shm_dir_,
        "tiers.host.shm_dir=" + shm_dir_,
        absl::StrCat("tiers.device.capacity_bytes=", t.device_bytes),
        absl::StrCat("tiers.host.capacity_bytes=", t.host_bytes),
        absl::StrCat("tiers.host.staging_bytes=", t.staging_bytes),
        "tiers.nvme.file_count=2",
        absl::StrCat("tiers.nvme.file_size_bytes=", t.nvme_file_bytes),
        absl::StrCat("leases.default_ttl_ms=", o.lease_ttl_ms),
        "auth.tenants_file=" + dir_ + "/tenants.toml",
        absl::StrCat("auth.tenant_arena_bytes=", t.device_bytes),
        absl::StrCat("auth.tenant_staging_bytes=", t.staging_bytes)};
    for (absl::string_view s : absl::StrSplit(extra, ';', absl::SkipWhitespace())) {
      settings.emplace_back(s);
    }
    return settings;
  }

  // What passes (README.md, "What passes").
  void ExpectPassed(const StreamsOptions& o, const LoadReport& report, bool sampler_ok,
                    bool log_clean) {
    const StreamCounters& c = report.counters;
    EXPECT_EQ(c.mismatches, 0u) << "bytes read back differ from the bytes put";
    EXPECT_EQ(c.failures, 0u) << "unexpected outcomes (see the failures above)";
    EXPECT_TRUE(sampler_ok) << "sampling failed (see the failures above)";
    EXPECT_TRUE(log_clean) << "kvtierd logged warnings or errors (see the failures above)";
    for (const FlatCheck& f : report.flat) {
      EXPECT_TRUE(f.ok) << f.what << " grew from " << f.start << " to " << f.end << " (limit "
                        << f.limit << ")";
    }
    EXPECT_EQ(report.after.pinned_bytes, 0u) << "bytes still pinned after every lease was released";
    EXPECT_EQ(report.after.active_leases, 0u);
    EXPECT_EQ(report.after.open_contexts, 0u);
    EXPECT_EQ(report.after.staging_slots, 0u);
    // The load must exercise what it claims to.
    EXPECT_GT(report.evicted_blocks, 0u) << "no eviction: the tiers are too large";
    EXPECT_GT(c.blocks_read, 0u);
    EXPECT_GT(c.handles_read, 0u);
    if (o.engines > 0) {
      EXPECT_GT(c.selects, 0u);
      EXPECT_GT(c.appends, 0u);
    }
    if (o.durable_fraction > 0) {
      EXPECT_GT(c.durable_puts, 0u);
    }
  }

  ::kvtier::testing::ScopedTempDir tmp_{"load"}, shm_{"load", "/dev/shm"};
  const std::string dir_ = tmp_.path(), shm_dir_ = shm_.path();
  std::string token_;
  std::unique_ptr<LoadDaemon> daemon_;
};

// The check every read relies on: payloads differ per id, are finite fp16,
// and ComparePayload names the first differing byte.
TEST(LoadBlockTest, PayloadIsAFunctionOfTheIdAndMismatchesAreFound) {
  const uint64_t size = 2 * kBytesPerLayer;
  const std::string a = Payload(BlockId(1, 7), size);
  ASSERT_EQ(a.size(), size);
  EXPECT_EQ(a, Payload(BlockId(1, 7), size));
  EXPECT_NE(a, Payload(BlockId(1, 8), size));
  EXPECT_NE(a, Payload(BlockId(2, 7), size));
  EXPECT_EQ(StreamOf(BlockId(123456, 9)), 123456u);
  for (size_t i = 0; i < a.size(); i += 2) {
    const unsigned exponent = (static_cast<unsigned char>(a[i + 1]) >> 2) & 0x1f;
    ASSERT_TRUE(exponent >= 9 && exponent <= 16) << "half " << i / 2 << " exponent " << exponent;
  }
  EXPECT_EQ(ComparePayload(BlockId(1, 7), size, a.data(), a.size()), "");
  std::string b = a;
  b[4097] ^= 0x01;
  EXPECT_EQ(ComparePayload(BlockId(1, 7), size, b.data(), b.size()),
            "differs from Payload(id) at offset 4097");
  EXPECT_EQ(ComparePayload(BlockId(1, 7), size, a.data(), a.size() - 8),
            absl::StrCat(size - 8, " bytes instead of ", size));
}

TEST_F(LoadTest, StreamsUnderConstantEvictionStayCorrectAndFlat) {
  StreamsOptions o;
  double cache_fraction = 0;
  std::string mix;
  ASSERT_NO_FATAL_FAILURE(ReadOptions(&o, &cache_fraction, &mix));
  const uint64_t b = o.block_bytes;
  const TierSizes tiers = SizeTiers(o, cache_fraction);
  const std::string extra = EnvString("KVTIER_LOAD_SET", "");
  const std::vector<std::string> settings = DaemonSettings(o, tiers, extra);
  LoadReport report;
  report.settings = {{"seconds", absl::StrCat(o.duration.count() / 1000.0)},
                     {"streams", absl::StrCat(o.streams)},
                     {"engines", absl::StrCat(o.engines)},
                     {"block_bytes", absl::StrCat(b)},
                     {"ids_per_stream", absl::StrCat(o.ids_per_stream)},
                     {"working_set_bytes", absl::StrCat(tiers.working_set_bytes)},
                     {"tier_bytes", absl::StrCat(tiers.total())},
                     {"tier_fraction_of_working_set",
                      absl::StrCat(static_cast<double>(tiers.total()) / tiers.working_set_bytes)},
                     {"durable_fraction", absl::StrCat(o.durable_fraction)},
                     {"slot_fraction", absl::StrCat(o.slot_fraction)},
                     {"mix_put_get_handles_delete", mix},
                     {"selects_per_block", absl::StrCat(o.selects_per_block)},
                     {"select_budget_blocks", absl::StrCat(o.select_budget_blocks)},
                     {"seed", absl::StrCat(o.seed)},
                     {"daemon_set", absl::StrJoin(settings, ";")}};
  std::cout << "load: " << o.streams << " streams (" << o.engines << " engines), "
            << o.duration.count() / 1000.0 << " s, working set "
            << tiers.working_set_bytes / (1 << 20) << " MiB, tiers " << tiers.total() / (1 << 20)
            << " MiB (device " << tiers.device_bytes << ", host " << tiers.host_bytes
            << ", nvme 2 x " << tiers.nvme_file_bytes << " B), seed " << o.seed
            << ", extra settings '" << extra << "'" << std::endl;

  daemon_ = std::make_unique<LoadDaemon>(KVTIERD_PATH, dir_, settings);
  std::string error;
  ASSERT_TRUE(daemon_->Start(kStartTimeout, &error)) << error;
  ClientOptions admin_options;
  admin_options.token = token_;
  auto admin = Client::Connect(daemon_->socket_path(), admin_options);
  ASSERT_OK(admin) << admin.status();
  auto registered = (*admin)->RegisterProfile(LoadProfile(b));
  ASSERT_OK(registered) << registered.status();
  ASSERT_EQ(registered->block_size_bytes(), b);
  o.profile_id = registered->profile_id();
  o.socket_path = daemon_->socket_path();
  auto before = (*admin)->Stats();
  ASSERT_OK(before) << before.status();

  ResourceSampler sampler(daemon_->pid(), admin->get(), kSamplePeriod);
  Streams streams(o);
  const auto started = std::chrono::steady_clock::now();
  sampler.Start();
  ASSERT_TRUE(streams.Start(&error)) << error;
  streams.Join();  // each stream stops by itself at the end of the duration
  report.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  sampler.Stop();
  // Every stream has stopped and released what it held: nothing may stay.
  TakeSample(daemon_->pid(), admin->get(), &report.after, &error);
  EXPECT_EQ(error, "");

  report.counters = streams.counters();
  report.ops = streams.MergedStats();
  report.ops.Merge(sampler.stats_latency());
  report.calls = streams.calls_done();
  report.samples = sampler.samples();
  report.evicted_blocks = report.after.evicted_blocks - before->evicted_blocks();
  FlatLimits limits;
  limits.warmup_s = std::min(10.0, std::max(2.0, o.duration.count() / 4000.0));
  limits.pinned_slack_bytes = std::max<uint64_t>(o.engines * o.select_budget_blocks, 16) * b;
  report.flat = CheckFlat(report.samples, report.wall_s, limits, &error);
  EXPECT_FALSE(report.flat.empty()) << error;
  report.failures = streams.failure_messages();
  for (const std::string& e : sampler.errors()) report.failures.push_back("sampler: " + e);
  const std::vector<std::string> warnings = daemon_->WarningLines();
  for (const std::string& line : warnings) report.failures.push_back("kvtierd logged: " + line);

  ExpectPassed(o, report, sampler.errors().empty(), warnings.empty());
  report.passed = !HasFailure();

  std::cout << ReportTable(report) << std::flush;
  const std::string report_path = EnvString("KVTIER_LOAD_REPORT", "");
  if (!report_path.empty()) {
    std::ofstream(report_path) << ReportJson(report);
    std::cout << "load: report written to " << report_path << std::endl;
  }
  RecordProperty("calls", static_cast<int>(report.calls));
  RecordProperty("evicted_blocks", static_cast<int>(report.evicted_blocks));

  auto code = daemon_->Stop(std::chrono::seconds(10));
  ASSERT_TRUE(code.has_value()) << "kvtierd did not stop within 10 s of SIGTERM";
  EXPECT_EQ(*code, 0) << testing::ReadFile(daemon_->log_path());
}

}  // namespace
}  // namespace kvtier::load
