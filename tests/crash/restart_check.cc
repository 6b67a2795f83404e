#include "tests/crash/restart_check.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/crash/crash_block.h"

namespace kvtier::crash {
namespace {

constexpr int kOk = 0, kNotFound = 5;
constexpr int kReadBatch = 128;
constexpr int kProbes = 32;
constexpr uint8_t kProbeOwner = 0xee;  // no load thread has this index

struct Listed {
  bool retained = false;
};

class Checker {
 public:
  Checker(Client* client, const RestartCheckOptions& o, Oracle* oracle, FailureLog* failures)
      : client_(client), o_(o), oracle_(oracle), failures_(failures) {}

  RestartFigures Run() {
    v1::StatsResponse stats;
    if (!Stats(&stats)) return figures_;
    CheckFreshStats(stats);
    CheckNvmeFiles();
    if (!ListAll(stats)) return figures_;
    ReadEverything();
    VerifyAll();
    if (Stats(&stats)) {
      Expect(
          stats.quarantined_blocks() == 0,
          absl::StrCat("Stats after reading: quarantined_blocks = ", stats.quarantined_blocks()));
      Expect(NvmeBlocks(stats) == figures_.blocks_listed,
             absl::StrCat("Stats after reading: ", NvmeBlocks(stats), " blocks, ListBlocks listed ",
                          figures_.blocks_listed));
    }
    return figures_;
  }

 private:
  void Fail(const std::string& what) {
    failures_->Add(absl::StrCat("cycle ", o_.cycle, ", after the restart: ", what));
  }
  bool Expect(bool ok, const std::string& what) {
    if (!ok) Fail(what);
    return ok;
  }

  bool Stats(v1::StatsResponse* out) {
    auto stats = client_->Stats();
    if (!stats.ok()) {
      Fail(absl::StrCat("Stats: ", stats.status().ToString()));
      return false;
    }
    *out = *stats;
    return true;
  }

  static const v1::TierStats* Tier(const v1::StatsResponse& s, v1::Tier tier) {
    for (const v1::TierStats& t : s.tiers()) {
      if (t.tier() == tier) return &t;
    }
    return nullptr;
  }
  static uint64_t NvmeBlocks(const v1::StatsResponse& s) {
    uint64_t n = 0;
    for (const v1::TierStats& t : s.tiers()) n += t.tier() == v1::TIER_NVME ? t.blocks() : 0;
    return n;
  }

  void CheckFreshStats(const v1::StatsResponse& s) {
    Expect(s.quarantined_blocks() == 0,
           absl::StrCat("quarantined_blocks = ", s.quarantined_blocks()));
    Expect(
        s.checksum_failures_device() + s.checksum_failures_host() + s.checksum_failures_nvme() == 0,
        absl::StrCat("checksum failures at start: ", s.ShortDebugString()));
    for (v1::Tier tier : {v1::TIER_DEVICE, v1::TIER_HOST}) {
      const v1::TierStats* t = Tier(s, tier);
      Expect(t != nullptr && t->blocks() == 0 && t->used_bytes() == 0,
             absl::StrCat(v1::Tier_Name(tier), " holds blocks right after the start: ",
                          t ? t->ShortDebugString() : "missing"));
    }
    const v1::TierStats* nvme = Tier(s, v1::TIER_NVME);
    if (!Expect(nvme != nullptr, "Stats has no NVMe tier")) return;
    Expect(nvme->used_bytes() == nvme->blocks() * kBlockBytes,
           absl::StrCat("orphan NVMe extents: used_bytes ", nvme->used_bytes(), " for ",
                        nvme->blocks(), " blocks of ", kBlockBytes, " bytes"));
    Expect(s.retained_bytes() <= o_.retained_quota_bytes,
           absl::StrCat("retained_bytes ", s.retained_bytes(), " above the quota ",
                        o_.retained_quota_bytes));
  }

  void CheckNvmeFiles() {
    std::set<std::string> want;
    for (uint32_t i = 0; i < o_.nvme_file_count; ++i) {
      want.insert(absl::StrFormat("nvme-%03d.dat", i));
    }
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(o_.nvme_dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (!want.erase(name)) {
        Fail(absl::StrCat("unexpected file in the NVMe directory: ", name));
        continue;
      }
      Expect(
          entry.file_size() == o_.nvme_file_size_bytes,
          absl::StrCat(name, " is ", entry.file_size(), " bytes, not ", o_.nvme_file_size_bytes));
    }
    Expect(!ec, absl::StrCat("listing ", o_.nvme_dir, ": ", ec.message()));
    for (const std::string& name : want) Fail(absl::StrCat("NVMe file missing: ", name));
  }

  bool ListAll(const v1::StatsResponse& stats) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::ListBlocksRequest req;
    req.set_limit(1u << 30);
    v1::ListBlocksResponse resp;
    grpc::Status st = client_->admin_stub()->ListBlocks(&ctx, req, &resp);
    if (!st.ok()) {
      Fail(absl::StrCat("ListBlocks: ", st.error_message()));
      return false;
    }
    uint64_t counted = 0, retained = 0;
    for (const v1::TierProfileCount& c : resp.counts()) counted += c.blocks();
    for (const v1::BlockInfo& b : resp.blocks()) {
      const std::string what = absl::StrCat("listed block ", Hex(b.block_id()));
      Expect(b.profile_id() == o_.profile_id && b.tenant() == o_.tenant,
             absl::StrCat(what, " of profile ", b.profile_id(), " tenant \"", b.tenant(), "\""));
      Expect(b.tier() == v1::TIER_NVME && b.durable() && !b.pinned() &&
                 b.size_bytes() == kBlockBytes && !b.quarantined(),
             absl::StrCat(what, ": ", b.ShortDebugString()));
      const BlockFacts f = oracle_->Facts(b.block_id());
      Expect(f.may_exist, absl::StrCat("ghost: ", what,
                                       " although it was never put, or "
                                       "deleted or found absent since its last put"));
      listed_[b.block_id()].retained = b.retained();
      retained += b.retained() ? 1 : 0;
    }
    figures_.blocks_listed = listed_.size();
    figures_.retained_blocks = retained;
    Expect(listed_.size() == static_cast<size_t>(resp.blocks_size()),
           absl::StrCat("ListBlocks names a block twice (", resp.blocks_size(), " entries, ",
                        listed_.size(), " ids)"));
    Expect(counted == listed_.size() && NvmeBlocks(stats) == listed_.size(),
           absl::StrCat("ListBlocks counts ", counted, " blocks and lists ", listed_.size(),
                        "; Stats says ", NvmeBlocks(stats), " on NVMe"));
    Expect(stats.retained_bytes() == retained * kBlockBytes,
           absl::StrCat("Stats retained_bytes ", stats.retained_bytes(), " for ", retained,
                        " retained blocks listed"));
    return true;
  }

  void ReadEverything() {
    std::vector<std::pair<std::string, BlockFacts>> all = oracle_->Snapshot();
    std::mt19937_64 rng(o_.probe_seed);
    for (int i = 0; i < kProbes; ++i) all.emplace_back(BlockId(kProbeOwner, rng()), BlockFacts{});
    for (size_t start = 0; start < all.size(); start += kReadBatch) {
      const size_t end = std::min(all.size(), start + kReadBatch);
      v1::GetBlocksRequest req;
      req.set_profile_id(o_.profile_id);
      for (size_t i = start; i < end; ++i) req.add_block_ids(all[i].first);
      auto got = client_->GetBlocks(req);
      if (!got.ok()) {
        Fail(absl::StrCat("GetBlocks: ", got.status().ToString()));
        return;
      }
      if (!Expect(got->size() == end - start, "GetBlocks: wrong number of results")) return;
      for (size_t i = start; i < end; ++i) CheckOne(all[i].first, all[i].second, (*got)[i - start]);
    }
  }

  void CheckOne(const std::string& id, const BlockFacts& f, const v1::BlockResult& r) {
    ++figures_.ids_read;
    const std::string what = absl::StrCat("block ", Hex(id));
    auto listed = listed_.find(id);
    const bool is_listed = listed != listed_.end();
    const int code = r.status().code();
    const bool probe = OwnerOf(id) == kProbeOwner;
    if (r.block_id() != id) {
      Fail(absl::StrCat(what, ": result names ", Hex(r.block_id())));
      return;
    }
    if (code == kOk) {
      const std::string want = Payload(id);
      if (r.data() != want) {
        Fail(absl::StrCat(what, ": ", r.data().size(), " bytes that are not Payload(id)"));
      }
      Expect(is_listed, absl::StrCat(what, " reads back but ListBlocks does not list it"));
      Expect(f.may_exist && !probe,
             absl::StrCat("ghost: ", what, " reads back although ",
                          probe ? "it was never put" : "it was deleted or found absent"));
      if (f.durable && f.retained) ++figures_.must_exist;
      if (!f.durable && !f.uncertain) ++figures_.non_durable_kept;
      if (f.uncertain) ++figures_.uncertain_present;
      if (f.retained && is_listed) {
        Expect(listed->second.retained,
               absl::StrCat(what, " was acknowledged retained but is no longer retained"));
      }
      if (!probe) oracle_->Resync(id, true, is_listed && listed->second.retained);
      return;
    }
    if (code != kNotFound) {
      Fail(absl::StrCat(what, ": code ", code, ": ", r.status().message()));
      return;
    }
    if (absl::StartsWith(r.status().message(), "DATA_LOSS")) {
      Fail(absl::StrCat(what, " is quarantined: ", r.status().message()));
    }
    Expect(!is_listed, absl::StrCat(what, " is listed but reads NOT_FOUND"));
    Expect(!(f.durable && f.retained),
           absl::StrCat("lost: ", what,
                        " (acknowledged durable and retained, never deleted) "
                        "reads NOT_FOUND: ",
                        r.status().message()));
    if (f.durable && !f.retained) ++figures_.durable_evicted;
    if (f.uncertain) ++figures_.uncertain_absent;
    if (!probe) oracle_->Resync(id, false, false);
  }

  void VerifyAll() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    auto reader = client_->admin_stub()->Verify(&ctx, v1::VerifyRequest());
    v1::VerifyProgress p, last;
    uint64_t corrupt = 0;
    while (reader->Read(&p)) {
      corrupt += p.corrupt_block_ids_size();
      last = p;
    }
    grpc::Status st = reader->Finish();
    if (!Expect(st.ok(), absl::StrCat("Verify: ", st.error_message()))) return;
    std::string quarantined;
    for (const v1::BlockInfo& q : last.quarantined()) {
      absl::StrAppend(&quarantined, " ", Hex(q.block_id()), " (", q.quarantine_reason(), ")");
    }
    Expect(last.done() && last.corrupt_blocks() == 0 && corrupt == 0 && quarantined.empty(),
           absl::StrCat("Verify: done=", last.done(), ", ", corrupt,
                        " corrupt in this run, quarantined:", quarantined.empty() ? " none" : "",
                        quarantined));
    Expect(last.blocks_total() == figures_.blocks_listed,
           absl::StrCat("Verify checked ", last.blocks_total(), " blocks, ", figures_.blocks_listed,
                        " are listed"));
  }

  Client* const client_;
  const RestartCheckOptions& o_;
  Oracle* const oracle_;
  FailureLog* const failures_;
  absl::flat_hash_map<std::string, Listed> listed_;
  RestartFigures figures_;
};

}  // namespace

void RestartFigures::Add(const RestartFigures& o) {
  blocks_listed += o.blocks_listed;
  ids_read += o.ids_read;
  must_exist += o.must_exist;
  durable_evicted += o.durable_evicted;
  non_durable_kept += o.non_durable_kept;
  uncertain_present += o.uncertain_present;
  uncertain_absent += o.uncertain_absent;
  retained_blocks += o.retained_blocks;
}

RestartFigures CheckAfterRestart(Client* client, const RestartCheckOptions& options, Oracle* oracle,
                                 FailureLog* failures) {
  return Checker(client, options, oracle, failures).Run();
}

}  // namespace kvtier::crash
