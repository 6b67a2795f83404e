// Compaction under SIGKILL: a client compacts contexts (CompactContext),
// reads every compacted block back and drops most contexts' originals
// (DropContextVersion 0) while kvtierd is killed after a random number of
// acknowledged compactions, and restarted on the same data directory.
//
// After every restart, before anything else runs:
//   * every acknowledged compaction is listed (ListContextVersions) with
//     the same blocks, not dropped, and each of its blocks reads back with
//     the bytes read before the kill and its slots (BlockResult.compacted);
//   * an acknowledged drop of the originals is still a dropped version 0;
//   * every version the daemon lists and has not dropped is whole: each of
//     its blocks reads back (a compaction cut short by the kill is either
//     listed complete or not listed), originals with their exact bytes;
//     the one exception is the originals of a drop the kill cut short
//     (Drop deletes blocks before it marks the version dropped): they may
//     miss blocks, and repeating the drop completes it.
//
//   KVTIER_CRASH_CYCLES  kills (default 8, as the crash loop)
//   KVTIER_CRASH_SEED    seed of the kill points (default: random, printed)
#include <atomic>
#include <cstdint>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "tests/crash/crash_fixture.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::crash {
namespace {

constexpr int kContextBlocks = 8;
constexpr float kRetention = 0.25f;  // 8 blocks -> 2 compacted blocks
// Acknowledged compactions before each kill: uniform in [1, kMaxCompactions].
constexpr uint64_t kMaxCompactions = 6;
constexpr absl::Duration kStallTimeout = absl::Seconds(120);

// One acknowledged compaction, as the client saw it before the kill.
struct Acked {
  std::string context_key;
  uint32_t version = 0;
  std::vector<std::string> block_ids;
  std::vector<std::string> bytes;  // of each block, read after the ack
  bool originals_dropped = false;  // DropContextVersion(0) acknowledged
};

// What one life left: its acknowledged compactions, and the context whose
// drop of the originals was in flight at the kill (empty: none).
struct LifeResult {
  std::vector<Acked> acked;
  std::string drop_in_flight;
};

// The client's side of one life: compacts new contexts until a call fails
// (the kill). Records only what the daemon acknowledged.
class Compacter {
 public:
  Compacter(Client* client, uint64_t profile_id, uint64_t* next_seq)
      : client_(client), profile_id_(profile_id), next_seq_(next_seq) {}

  void Run() {
    for (int n = 0;; ++n) {
      Acked a;
      if (!CompactOne(n % 3 != 0, &a)) return;
    }
  }
  // Waits until `count` compactions were acknowledged; false on a stall or
  // when Run stopped before.
  bool AwaitAcked(uint64_t count) {
    absl::MutexLock lock(&mu_);
    auto reached = [&]()
                       ABSL_SHARED_LOCKS_REQUIRED(mu_) { return acked_.size() >= count || done_; };
    mu_.AwaitWithTimeout(absl::Condition(&reached), kStallTimeout);
    return acked_.size() >= count;
  }
  // Calls failing from now on are the kill's.
  void MarkKilled() {
    absl::MutexLock lock(&mu_);
    killed_ = true;
  }
  LifeResult Take() {
    absl::MutexLock lock(&mu_);
    return LifeResult{std::move(acked_), drop_in_flight_};
  }
  // Why Run stopped before the kill; empty when it did not.
  std::string unexpected_error() {
    absl::MutexLock lock(&mu_);
    return error_;
  }

 private:
  // Puts kContextBlocks durable blocks, opens a context on them, compacts
  // it, reads the compacted blocks, then (when drop) drops the originals.
  bool CompactOne(bool drop, Acked* a) {
    std::vector<std::string> ids;
    v1::PutBlocksRequest put;
    put.set_profile_id(profile_id_);
    put.set_durable(true);
    for (int i = 0; i < kContextBlocks; ++i) {
      ids.push_back(BlockId(0, (*next_seq_)++));
      v1::BlockPut* b = put.add_blocks();
      b->set_block_id(ids.back());
      b->set_data(Payload(ids.back()));
    }
    auto put_done = client_->PutBlocks({put});
    if (!put_done.ok()) return Stop("PutBlocks", put_done.status());
    v1::OpenContextRequest open;
    open.set_profile_id(profile_id_);
    v1::Segment* segment = open.add_segments();
    for (const std::string& id : ids) segment->add_block_ids(id);
    auto opened = client_->OpenContext(open);
    if (!opened.ok()) return Stop("OpenContext", opened.status());
    v1::CompactContextRequest compact;
    compact.set_context_id(opened->context_id());
    compact.set_retention(kRetention);
    auto compacted = client_->CompactContext(compact);
    if (!compacted.ok()) return Stop("CompactContext", compacted.status());
    a->context_key = compacted->context_key();
    a->version = compacted->version().version();
    a->block_ids.assign(compacted->version().block_ids().begin(),
                        compacted->version().block_ids().end());
    v1::GetBlocksRequest get;
    get.set_profile_id(profile_id_);
    for (const std::string& id : a->block_ids) get.add_block_ids(id);
    auto got = client_->GetBlocks(get);
    if (!got.ok()) return Stop("GetBlocks", got.status());
    for (const v1::BlockResult& r : *got) {
      if (r.status().code() != 0 || r.compacted().version() != a->version) {
        return Fail(absl::StrCat("compacted block ", Hex(r.block_id()), " read back with code ",
                                 r.status().code(), ", slots of version ",
                                 r.compacted().version()));
      }
      a->bytes.push_back(r.data());
    }
    Record(*a);
    if (drop) {
      v1::DropContextVersionRequest request;
      request.set_profile_id(profile_id_);
      request.set_context_key(a->context_key);
      request.set_version(0);
      {
        absl::MutexLock lock(&mu_);
        drop_in_flight_ = a->context_key;
      }
      auto dropped = client_->DropContextVersion(request);
      if (!dropped.ok()) return Stop("DropContextVersion", dropped.status());
      absl::MutexLock lock(&mu_);
      acked_.back().originals_dropped = true;
      drop_in_flight_.clear();
    }
    if (absl::Status st = client_->CloseContext(opened->context_id()); !st.ok()) {
      return Stop("CloseContext", st);
    }
    return true;
  }
  void Record(const Acked& a) {
    absl::MutexLock lock(&mu_);
    acked_.push_back(a);
  }
  // A failed call ends the life's work: expected after MarkKilled, an
  // error before.
  bool Stop(const char* call, const absl::Status& status) {
    return Fail(absl::StrCat(call, ": ", status.ToString()));
  }
  bool Fail(const std::string& why) {
    absl::MutexLock lock(&mu_);
    if (!killed_) error_ = why;
    done_ = true;
    return false;
  }

  Client* const client_;
  const uint64_t profile_id_;
  uint64_t* const next_seq_;  // owned by the test; only Run touches it while it runs
  absl::Mutex mu_;
  std::vector<Acked> acked_ ABSL_GUARDED_BY(mu_);
  std::string drop_in_flight_ ABSL_GUARDED_BY(mu_);
  std::string error_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool killed_ ABSL_GUARDED_BY(mu_) = false;
};

class CompactionCrashTest : public CrashFixture {
 protected:
  // Compacted blocks are retained (they may be a context's only copy), and
  // no block may be evicted, so that every listed version can be checked
  // whole: no retained quota, and NVMe for every block of 50 cycles
  // (about 1,000 blocks of the 2,048).
  uint64_t RetainedQuotaBytes() const override { return 0; }
  static std::vector<std::string> Settings() {
    return {"tiers.nvme.file_count=4", "tiers.nvme.file_size_bytes=4MiB"};
  }

  // Reads ids in BYTES mode; one result per id, in order.
  std::vector<v1::BlockResult> Read(Client* client, uint64_t profile_id,
                                    const std::vector<std::string>& ids) {
    v1::GetBlocksRequest get;
    get.set_profile_id(profile_id);
    for (const std::string& id : ids) get.add_block_ids(id);
    auto got = client->GetBlocks(get);
    EXPECT_OK(got) << got.status();
    if (!got.ok()) return {};
    EXPECT_EQ(got->size(), ids.size());
    return std::move(*got);
  }

  // The checks of the file comment, for one restarted life.
  void CheckAfterRestart(Client* client, uint64_t profile_id, const std::vector<Acked>& acked,
                         const std::string& drop_in_flight, uint64_t cycle) {
    for (const Acked& a : acked) {
      v1::ListContextVersionsRequest list;
      list.set_profile_id(profile_id);
      list.set_context_key(a.context_key);
      auto versions = client->ListContextVersions(list);
      ASSERT_OK(versions) << "cycle " << cycle << ": " << versions.status();
      const v1::ContextVersion* found = nullptr;
      for (const v1::ContextVersion& v : versions->versions()) {
        if (v.version() == a.version) found = &v;
        if (v.version() == 0 && a.originals_dropped) {
          EXPECT_TRUE(v.dropped())
              << "cycle " << cycle << ": originals of " << Hex(a.context_key) << " are back";
        }
      }
      ASSERT_NE(found, nullptr) << "cycle " << cycle << ": acknowledged version " << a.version
                                << " of " << Hex(a.context_key) << " is lost";
      EXPECT_FALSE(found->dropped());
      ASSERT_EQ(std::vector<std::string>(found->block_ids().begin(), found->block_ids().end()),
                a.block_ids);
      std::vector<v1::BlockResult> read = Read(client, profile_id, a.block_ids);
      for (size_t i = 0; i < read.size(); ++i) {
        EXPECT_EQ(read[i].status().code(), 0)
            << "cycle " << cycle << ": compacted block " << Hex(a.block_ids[i]) << ": "
            << read[i].status().message();
        EXPECT_TRUE(read[i].data() == a.bytes[i])
            << "cycle " << cycle << ": compacted block " << Hex(a.block_ids[i])
            << " reads back different bytes";
        EXPECT_EQ(read[i].compacted().version(), a.version);
      }
    }
    // Whatever is listed and not dropped is whole, acknowledged or not.
    v1::ListContextVersionsRequest all;
    all.set_profile_id(profile_id);
    auto versions = client->ListContextVersions(all);
    ASSERT_OK(versions) << versions.status();
    for (const v1::ContextVersion& v : versions->versions()) {
      if (v.dropped() || (v.version() == 0 && v.context_key() == drop_in_flight)) continue;
      const std::vector<std::string> ids(v.block_ids().begin(), v.block_ids().end());
      std::vector<v1::BlockResult> read = Read(client, profile_id, ids);
      for (size_t i = 0; i < read.size(); ++i) {
        EXPECT_EQ(read[i].status().code(), 0)
            << "cycle " << cycle << ": version " << v.version() << " of " << Hex(v.context_key())
            << " is listed but block " << Hex(ids[i])
            << " is missing: " << read[i].status().message();
        if (v.version() == 0) {
          EXPECT_TRUE(read[i].data() == Payload(ids[i]))
              << "cycle " << cycle << ": original block " << Hex(ids[i]) << " changed";
        }
      }
    }
  }
};

TEST_F(CompactionCrashTest, AcknowledgedCompactionsAndDropsSurviveSigkill) {
  const uint64_t cycles = EnvOr("KVTIER_CRASH_CYCLES", 8);
  const uint64_t seed = EnvOr("KVTIER_CRASH_SEED", std::random_device()());
  std::cout << "compaction crash: " << cycles << " cycles, KVTIER_CRASH_SEED=" << seed << "\n";
  std::mt19937_64 rng(seed);
  std::unique_ptr<Client> admin;
  uint64_t profile_id = 0;
  ASSERT_NO_FATAL_FAILURE(StartFirstLife(&admin, &profile_id, Settings()));

  std::vector<Acked> acked;  // over every life
  uint64_t next_seq = 0;
  int drops_repeated = 0;
  for (uint64_t cycle = 0; cycle < cycles; ++cycle) {
    std::unique_ptr<Client> client = Connect();
    ASSERT_NE(client, nullptr);
    Compacter compacter(client.get(), profile_id, &next_seq);
    std::thread worker([&] { compacter.Run(); });
    const uint64_t target = std::uniform_int_distribution<uint64_t>(1, kMaxCompactions)(rng);
    const bool reached = compacter.AwaitAcked(target);
    compacter.MarkKilled();
    std::string error;
    const bool killed = daemon_->Kill(&error);
    worker.join();
    ASSERT_TRUE(reached) << "cycle " << cycle << ": " << compacter.unexpected_error();
    ASSERT_EQ(compacter.unexpected_error(), "") << "cycle " << cycle;
    ASSERT_TRUE(killed) << error;
    LifeResult life = compacter.Take();
    acked.insert(acked.end(), life.acked.begin(), life.acked.end());

    ASSERT_TRUE(daemon_->Start(kStartTimeout, &error)) << error;
    client = Connect();
    ASSERT_NE(client, nullptr);
    ASSERT_NO_FATAL_FAILURE(
        CheckAfterRestart(client.get(), profile_id, acked, life.drop_in_flight, cycle));
    if (!life.drop_in_flight.empty()) {
      // The interrupted drop can be repeated, and then it is done.
      v1::DropContextVersionRequest request;
      request.set_profile_id(profile_id);
      request.set_context_key(life.drop_in_flight);
      request.set_version(0);
      auto dropped = client->DropContextVersion(request);
      ASSERT_OK(dropped) << "cycle " << cycle << ": repeated drop: " << dropped.status();
      for (Acked& a : acked) {
        if (a.context_key == life.drop_in_flight) a.originals_dropped = true;
      }
      ++drops_repeated;
    }
    FailureLog failures;
    ExpectNoStoreWarnings(daemon_->life(), &failures);
    EXPECT_TRUE(failures.empty()) << failures.Text();
  }
  std::cout << "compaction crash: " << acked.size() << " acknowledged compactions checked, "
            << drops_repeated << " interrupted drops repeated\n";
}

}  // namespace
}  // namespace kvtier::crash
