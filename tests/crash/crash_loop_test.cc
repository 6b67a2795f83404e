// The crash loop: kvtierd (a real child process) SIGKILLed at random points
// under a mixed load (tests/crash/load.h), restarted on the same data
// directory, and checked against an oracle of acknowledged operations
// (tests/crash/restart_check.h) after every restart.
//
// The kill point is a random number of acknowledged calls, reached while
// the load runs (the test waits on the load's counter, not on time).
// Tiers are small so that the cache evicts during the load: 128 blocks of
// host DRAM, 256 blocks of NVMe, a 64-block device arena, 32 blocks of
// retained quota; blocks are 8 KiB.
//
//   KVTIER_CRASH_CYCLES  kills (default 8; the long version is >= 50)
//   KVTIER_CRASH_SEED    seed of every random choice (default: random,
//                        printed; thread interleavings are not replayed)
// On failure the data directory and every life's log are kept and named.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "proto/auth/token.h"
#include "tests/crash/crash_block.h"
#include "tests/crash/crash_daemon.h"
#include "tests/crash/crash_fixture.h"
#include "tests/crash/failure_log.h"
#include "tests/crash/load.h"
#include "tests/crash/oracle.h"
#include "tests/crash/restart_check.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::crash {
namespace {

constexpr int kWriters = 3;
// Acknowledged calls before each kill: uniform in [kMinAcks, kMaxAcks].
constexpr uint64_t kMinAcks = 200, kMaxAcks = 2000;
constexpr std::chrono::seconds kLoadStallTimeout{120};

class CrashLoopTest : public CrashFixture {};

// The restart check itself: a block the oracle holds durable and retained
// but that was deleted behind its back is reported lost, one put behind its
// back is a ghost, and a corrupted NVMe extent is reported (quarantine,
// store warning), each naming the block.
TEST_F(CrashLoopTest, RestartCheckReportsLostGhostAndCorruptBlocks) {
  std::unique_ptr<Client> admin;
  uint64_t profile_id = 0;
  ASSERT_NO_FATAL_FAILURE(StartFirstLife(&admin, &profile_id));
  Oracle oracle(1);
  std::vector<std::string> ids(4);
  for (std::string& id : ids) id = oracle.NewId(0);
  const std::string ghost = BlockId(0, 1000);  // never registered with the oracle
  v1::PutBlocksRequest put;
  put.set_profile_id(profile_id);
  put.set_durable(true);
  put.set_retain(true);
  for (const std::string& id : ids) {
    v1::BlockPut* b = put.add_blocks();
    b->set_block_id(id);
    b->set_data(Payload(id));
  }
  v1::BlockPut* b = put.add_blocks();
  b->set_block_id(ghost);
  b->set_data(Payload(ghost));
  auto stored = admin->PutBlocks({put});
  ASSERT_OK(stored) << stored.status();
  for (const v1::PutResult& r : stored->results()) {
    ASSERT_EQ(r.status().code(), 0) << r.status().message();
    if (r.block_id() != ghost) oracle.PutAcked(r.block_id(), r.durable(), r.retained());
  }
  v1::DeleteBlocksRequest del;  // ids[3] is lost as far as the oracle knows
  del.set_profile_id(profile_id);
  del.add_block_ids(ids[3]);
  auto deleted = admin->DeleteBlocks(del);
  ASSERT_OK(deleted) << deleted.status();
  ASSERT_EQ(deleted->statuses(0).code(), 0);
  std::string error;
  ASSERT_TRUE(daemon_->Kill(&error)) << error;
  {  // one bit of the block in the first extent
    std::fstream f(daemon_->data_dir() + "/nvme/nvme-000.dat",
                   std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekg(17);
    const char c = static_cast<char>(f.get());
    f.seekp(17);
    f.put(static_cast<char>(c ^ 0x10));
  }
  ASSERT_TRUE(daemon_->Start(kStartTimeout, &error)) << error;
  admin = Connect();
  ASSERT_NE(admin, nullptr);
  FailureLog failures;
  CheckAfterRestart(admin.get(), CheckOptions(1, profile_id, 1), &oracle, &failures);
  ExpectNoStoreWarnings(daemon_->life(), &failures);
  const std::string text = failures.Text();
  EXPECT_NE(text.find("lost: block " + Hex(ids[3])), std::string::npos) << text;
  EXPECT_NE(text.find("ghost: listed block " + Hex(ghost)), std::string::npos) << text;
  EXPECT_NE(text.find("is quarantined: DATA_LOSS"), std::string::npos) << text;
  EXPECT_NE(text.find("logged a store warning"), std::string::npos) << text;
  EXPECT_NE(text.find("Verify: "), std::string::npos) << text;
}

// A durable block is either durable or evicted: a full NVMe tier never
// gives up only the NVMe copy of a block that also has a host copy (it
// would stay readable, no longer durable, and a kill would take it).
TEST_F(CrashLoopTest, DurableBlockIsEitherDurableOrEvicted) {
  std::unique_ptr<Client> admin;
  uint64_t profile_id = 0;
  // LRU: the NVMe victim is the oldest NVMe copy, the block under test.
  ASSERT_NO_FATAL_FAILURE(StartFirstLife(&admin, &profile_id, {"tiers.placement=lru"}));
  Oracle oracle(1);
  auto put_durable = [&](const std::string& id) {
    v1::PutBlocksRequest put;
    put.set_profile_id(profile_id);
    put.set_durable(true);
    v1::BlockPut* b = put.add_blocks();
    b->set_block_id(id);
    b->set_data(Payload(id));
    auto stored = admin->PutBlocks({put});
    ASSERT_OK(stored) << stored.status();
    ASSERT_EQ(stored->results(0).status().code(), 0) << stored->results(0).status().message();
    ASSERT_TRUE(stored->results(0).durable());
  };
  const std::string kept = oracle.NewId(0);
  ASSERT_NO_FATAL_FAILURE(put_durable(kept));
  v1::GetBlocksRequest get;
  get.set_profile_id(profile_id);
  get.add_block_ids(kept);
  v1::LookupRequest lookup;
  lookup.set_profile_id(profile_id);
  lookup.add_block_ids(kept);
  bool present = true;
  const uint64_t nvme_blocks = kNvmeFiles * kNvmeFileBytes / kBlockBytes;
  for (uint64_t i = 0; present && i < 2 * nvme_blocks; ++i) {
    ASSERT_NO_FATAL_FAILURE(put_durable(oracle.NewId(0)));
    auto got = admin->GetBlocks(get);  // keeps its host copy the most recently used
    ASSERT_OK(got) << got.status();
    auto found = admin->Lookup(lookup);
    ASSERT_OK(found) << found.status();
    present = found->entries(0).present();
    if ((*got)[0].status().code() == 0) {
      ASSERT_EQ((*got)[0].data(), Payload(kept)) << "put " << i;
    }
    if (present)
      ASSERT_TRUE(found->entries(0).durable()) << "put " << i << ": present, not durable";
  }
  ASSERT_FALSE(present) << "the NVMe tier never evicted the block";
  auto stats = admin->Stats();
  ASSERT_OK(stats) << stats.status();
  EXPECT_GT(stats->evicted_blocks(), 0u);
  // A kill now loses nothing acknowledged: the block was evicted, counted.
  std::string error;
  ASSERT_TRUE(daemon_->Kill(&error)) << error;
  ASSERT_TRUE(daemon_->Start(kStartTimeout, &error)) << error;
  admin = Connect();
  ASSERT_NE(admin, nullptr);
  auto got = admin->GetBlocks(get);
  ASSERT_OK(got) << got.status();
  EXPECT_EQ((*got)[0].status().code(), grpc::StatusCode::NOT_FOUND)
      << "block " << Hex(kept) << " was evicted before the kill and must not come back";
}

TEST_F(CrashLoopTest, AcknowledgedDurableBlocksSurviveSigkillUnderMixedLoad) {
  const uint64_t cycles = EnvOr("KVTIER_CRASH_CYCLES", 8);
  const uint64_t seed = EnvOr("KVTIER_CRASH_SEED", std::random_device()());
  const std::string run = absl::StrCat("seed ", seed, ", data in ", dir_);
  std::cout << "crash loop: " << cycles << " cycles, " << run << std::endl;
  const auto started = std::chrono::steady_clock::now();
  std::mt19937_64 rng(seed);

  std::unique_ptr<Client> admin;
  uint64_t profile_id = 0;
  ASSERT_NO_FATAL_FAILURE(StartFirstLife(&admin, &profile_id));
  std::string error;

  Oracle oracle(kWriters + 2);  // writers, the engine, shared ids
  FailureLog failures;
  LoadCounters load_total;
  RestartFigures restart_total;
  uint64_t evicted_by_stats = 0, kills_with_durable_put_in_flight = 0;
  uint64_t min_listed = UINT64_MAX, max_listed = 0;
  uint64_t retained_blocks = 0;  // after the last restart (all durable then)
  for (uint64_t cycle = 1; cycle <= cycles; ++cycle) {
    const int life = daemon_->life();
    LoadOptions load_options{daemon_->socket_path(), token_, profile_id, kWriters, seed,
                             static_cast<int>(cycle)};
    Load load(load_options, &oracle, &failures);
    load.Start();
    const uint64_t target = std::uniform_int_distribution<uint64_t>(kMinAcks, kMaxAcks)(rng);
    const bool reached = load.WaitForAcks(target, kLoadStallTimeout);
    if (!reached && failures.empty()) {
      failures.Add(absl::StrCat("cycle ", cycle, ": the load stopped or stalled before ", target,
                                " acknowledged calls"));
    }
    auto stats = admin->Stats();  // the last figures of this life
    if (stats.ok()) {
      evicted_by_stats += stats->evicted_blocks();
      if (stats->retained_bytes() > kRetainedQuotaBytes) {
        failures.Add(absl::StrCat("cycle ", cycle, ": retained_bytes ", stats->retained_bytes(),
                                  " above the quota ", kRetainedQuotaBytes));
      }
    }
    load.MarkKilled();
    if (!daemon_->Kill(&error)) failures.Add(absl::StrCat("cycle ", cycle, ": ", error));
    load.Join();
    const LoadCounters counters = load.counters();
    load_total.Add(counters);
    kills_with_durable_put_in_flight += counters.durable_puts_in_flight_at_kill > 0 ? 1 : 0;
    ExpectNoStoreWarnings(life, &failures);
    ASSERT_TRUE(failures.empty()) << run << "\n" << failures.Text();

    ASSERT_TRUE(daemon_->Start(kStartTimeout, &error)) << "cycle " << cycle << ": " << error;
    admin = Connect();
    ASSERT_NE(admin, nullptr);
    auto again = admin->RegisterProfile(CrashProfile());
    ASSERT_OK(again) << again.status();
    ASSERT_EQ(again->profile_id(), profile_id) << "profile id changed across a restart";
    const RestartFigures figures = CheckAfterRestart(
        admin.get(), CheckOptions(static_cast<int>(cycle), profile_id, seed ^ cycle), &oracle,
        &failures);
    restart_total.Add(figures);
    if (figures.retained_blocks < retained_blocks) {
      failures.Add(absl::StrCat("cycle ", cycle, ": the retained set shrank from ", retained_blocks,
                                " to ", figures.retained_blocks, " blocks"));
    }
    retained_blocks = figures.retained_blocks;
    min_listed = std::min(min_listed, figures.blocks_listed);
    max_listed = std::max(max_listed, figures.blocks_listed);
    ExpectNoStoreWarnings(daemon_->life(), &failures);
    ASSERT_TRUE(failures.empty()) << run << "\n" << failures.Text();
    std::cout << "cycle " << cycle << ": killed after " << counters.acked_ops
              << " acknowledged calls (" << counters.ops_in_flight_at_kill << " in flight, "
              << counters.durable_puts_in_flight_at_kill << " durable puts); restart holds "
              << figures.blocks_listed << " blocks, " << figures.durable_evicted
              << " durable evicted, " << figures.uncertain_present << "/"
              << figures.uncertain_present + figures.uncertain_absent << " uncertain present"
              << std::endl;
  }

  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::cout << "crash loop summary (" << run << "):\n"
            << "  cycles " << cycles << ", wall " << wall_s << " s\n"
            << "  acknowledged calls " << load_total.acked_ops << ": blocks put "
            << load_total.blocks_put << " (durable " << load_total.durable_puts << ", retained "
            << load_total.retained_puts << "), deletes " << load_total.deletes << ", selects "
            << load_total.selects << "\n"
            << "  bytes compared with Payload(id): " << load_total.blocks_read << " reads, "
            << load_total.handles_read << " device handles\n"
            << "  calls in flight at the kills: " << load_total.ops_in_flight_at_kill
            << "; kills with durable puts in flight " << kills_with_durable_put_in_flight << " ("
            << load_total.durable_puts_in_flight_at_kill << " blocks)\n"
            << "  per restart: blocks held " << min_listed << ".." << max_listed << ", ids read "
            << restart_total.ids_read / cycles << " (mean); in all: acknowledged durable+retained "
            << restart_total.must_exist << ", acknowledged non-durable kept "
            << restart_total.non_durable_kept << ", uncertain present "
            << restart_total.uncertain_present << " / absent " << restart_total.uncertain_absent
            << "\n"
            << "  evictions: Stats.evicted_blocks " << evicted_by_stats
            << ", acknowledged durable blocks gone at a restart " << restart_total.durable_evicted
            << ", seen absent by their owner " << load_total.evictions_seen
            << ", seen present but no longer durable " << load_total.durability_dropped_seen << "\n"
            << "  retained: " << retained_blocks << " blocks at the end (quota "
            << kRetainedQuotaBytes / kBlockBytes << "), quota refusals "
            << load_total.retained_quota_refusals << "; puts refused by full tiers "
            << load_total.full_refusals << std::endl;
  RecordProperty("cycles", static_cast<int>(cycles));
  RecordProperty("acknowledged_calls", static_cast<int>(load_total.acked_ops));
  RecordProperty("evicted_blocks", static_cast<int>(evicted_by_stats));
  // The load must really exercise eviction and the other paths it claims to.
  EXPECT_GT(evicted_by_stats, 0u) << "no eviction happened: the tiers are too large";
  EXPECT_GT(load_total.durable_puts, 0u);
  EXPECT_GT(load_total.deletes, 0u);
  EXPECT_GT(load_total.selects, 0u);
  EXPECT_GT(load_total.handles_read, 0u);
  EXPECT_GT(restart_total.must_exist, 0u) << "no acknowledged durable+retained block to check";

  auto code = daemon_->Stop(std::chrono::seconds(10));
  ASSERT_TRUE(code.has_value()) << "kvtierd did not stop within 10 s of SIGTERM";
  EXPECT_EQ(*code, 0);
  ExpectNoStoreWarnings(daemon_->life(), &failures);
  EXPECT_TRUE(failures.empty()) << failures.Text();
}

}  // namespace
}  // namespace kvtier::crash
