#include "tests/crash/load.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <span>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/shm/shm_mapping.h"
#include "tests/crash/crash_block.h"

namespace kvtier::crash {
namespace {

// google.rpc.Code values in ItemStatus.code.
constexpr int kOk = 0, kNotFound = 5, kAlreadyExists = 6, kResourceExhausted = 8,
              kFailedPrecondition = 9;

// Pins (GetBlocks handles, Select sets, staging slots) outlive any step of
// the load by far, so a handle is always read under its lease.
constexpr uint32_t kLeaseTtlMs = 60000;
constexpr uint32_t kSelectBudgetBlocks = 8;
constexpr size_t kBlocksPerContext = 48;
constexpr std::chrono::seconds kCallTimeout{20};

void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + kCallTimeout);
}

std::string GrpcText(const grpc::Status& st) {
  return absl::StrCat("code ", static_cast<int>(st.error_code()), ": ", st.error_message());
}

// "bytes differ from Payload(id) at offset N" or "" when equal.
std::string CompareWithPayload(const std::string& id, const void* data, size_t size) {
  if (size != kBlockBytes) return absl::StrCat(size, " bytes instead of ", kBlockBytes);
  const std::string want = Payload(id);
  if (std::memcmp(want.data(), data, size) == 0) return "";
  const auto* got = static_cast<const char*>(data);
  size_t at = 0;
  while (at < size && want[at] == got[at]) ++at;
  return absl::StrCat("bytes differ from Payload(id) at offset ", at);
}

// Why the oracle holds that an id cannot exist.
constexpr char kWhyAbsent[] =
    "it was never put, or deleted, evicted or found absent since its last acknowledged put";

}  // namespace

void LoadCounters::Add(const LoadCounters& o) {
  acked_ops += o.acked_ops;
  blocks_put += o.blocks_put;
  durable_puts += o.durable_puts;
  retained_puts += o.retained_puts;
  blocks_read += o.blocks_read;
  handles_read += o.handles_read;
  deletes += o.deletes;
  selects += o.selects;
  wrong_puts_refused += o.wrong_puts_refused;
  retained_quota_refusals += o.retained_quota_refusals;
  full_refusals += o.full_refusals;
  evictions_seen += o.evictions_seen;
  durability_dropped_seen += o.durability_dropped_seen;
  ops_in_flight_at_kill += o.ops_in_flight_at_kill;
  durable_puts_in_flight_at_kill += o.durable_puts_in_flight_at_kill;
}

struct Load::Worker {
  uint8_t owner = 0;
  std::string name;  // "cycle 3, writer 1"
  std::mt19937_64 rng;
  LoadCounters counters;
  std::unique_ptr<Client> client;
  std::unique_ptr<client::ShmArenaView> arena;
  uint64_t arena_id = 0;
  std::unique_ptr<client::ShmStagingFile> staging;
  // The put or delete in flight: a kill makes its ids uncertain.
  enum class Op { kNone, kPut, kDelete } op = Op::kNone;
  std::vector<std::string> op_ids;
  bool op_durable = false;
  bool call_started_before_kill = false;

  bool Coin(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
};

Load::Load(LoadOptions options, Oracle* oracle, FailureLog* failures)
    : options_(std::move(options)), oracle_(oracle), failures_(failures) {}

Load::~Load() { Join(); }

void Load::Start() {
  const int threads = options_.writers + 1;
  {
    absl::MutexLock lock(&mu_);
    running_ = threads;
  }
  for (int i = 0; i < threads; ++i) {
    auto w = std::make_unique<Worker>();
    w->owner = static_cast<uint8_t>(i);
    const bool engine = i == options_.writers;
    w->name = absl::StrCat("cycle ", options_.cycle, ", ", engine ? "engine" : "writer ",
                           engine ? "" : std::to_string(i));
    std::seed_seq seq{options_.seed, static_cast<uint64_t>(options_.cycle),
                      static_cast<uint64_t>(i)};
    w->rng.seed(seq);
    ClientOptions client_options;
    client_options.token = options_.token;
    client_options.call_timeout = kCallTimeout;
    auto client = Client::Connect(options_.socket_path, client_options);
    if (!client.ok()) {
      Fail(w.get(), absl::StrCat("Client::Connect: ", client.status().ToString()));
    } else {
      w->client = std::move(*client);
    }
    workers_.push_back(std::move(w));
  }
  for (int i = 0; i < threads; ++i) {
    Worker* w = workers_[i].get();
    threads_.emplace_back([this, w, i] {
      if (w->client != nullptr) {
        if (i == options_.writers) {
          RunEngine(w);
        } else {
          RunWriter(w);
        }
      }
      absl::MutexLock lock(&mu_);
      --running_;
    });
  }
}

bool Load::WaitForAcks(uint64_t acks, std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return acked_ >= acks || running_ == 0 || stop_.load();
  };
  mu_.AwaitWithTimeout(absl::Condition(&done), absl::FromChrono(timeout));
  return acked_ >= acks;
}

void Load::MarkKilled() { killed_.store(true); }

void Load::Join() {
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

LoadCounters Load::counters() const {
  LoadCounters sum;
  for (const auto& w : workers_) sum.Add(w->counters);
  return sum;
}

void Load::Fail(Worker* w, const std::string& what) {
  failures_->Add(absl::StrCat(w->name, ": ", what));
  absl::MutexLock lock(&mu_);
  stop_.store(true);
}

void Load::Acked(Worker* w) {
  ++w->counters.acked_ops;
  absl::MutexLock lock(&mu_);
  ++acked_;
}

bool Load::CallFailed(Worker* w, const char* call, const std::string& status) {
  if (!killed_.load()) {
    Fail(w, absl::StrCat(call, " failed while the daemon was running: ", status));
    return false;
  }
  if (w->call_started_before_kill) ++w->counters.ops_in_flight_at_kill;
  for (const std::string& id : w->op_ids) {
    if (w->op == Worker::Op::kPut) oracle_->PutUncertain(id);
    if (w->op == Worker::Op::kDelete) oracle_->DeleteUncertain(id);
  }
  if (w->op == Worker::Op::kPut && w->op_durable && w->call_started_before_kill) {
    w->counters.durable_puts_in_flight_at_kill += w->op_ids.size();
  }
  w->op = Worker::Op::kNone;
  w->op_ids.clear();
  return false;
}

// ---- Checks ------------------------------------------------------------------

bool Load::CheckRead(Worker* w, const char* call, const std::string& id, const BlockFacts& before,
                     int code, const std::string& message, const std::string* data) {
  const bool own = OwnerOf(id) == w->owner;
  const std::string what = absl::StrCat(call, ": block ", Hex(id));
  if (code == kOk) {
    if (data != nullptr) {
      std::string diff = CompareWithPayload(id, data->data(), data->size());
      if (!diff.empty()) {
        Fail(w, absl::StrCat(what, ": ", diff));
        return false;
      }
      ++w->counters.blocks_read;
    }
    if (own && !before.may_exist) {
      Fail(w, absl::StrCat(what, " reads back although ", kWhyAbsent));
      return false;
    }
    return true;
  }
  if (code == kNotFound) {
    if (absl::StartsWith(message, "DATA_LOSS")) {
      Fail(w, absl::StrCat(what, " is quarantined: ", message));
      return false;
    }
    if (before.retained) {
      Fail(w, absl::StrCat(what,
                           " (acknowledged retained) reads NOT_FOUND while the daemon "
                           "runs: ",
                           message));
      return false;
    }
    if (own && before.may_exist) {
      if (before.durable) ++w->counters.evictions_seen;
      oracle_->ObservedAbsent(id);
    }
    return true;
  }
  Fail(w, absl::StrCat(what, ": unexpected code ", code, ": ", message));
  return false;
}

bool Load::CheckArenaSlot(Worker* w, const char* call, const std::string& id, uint64_t arena_id,
                          uint64_t offset_bytes, uint64_t size_bytes) {
  const std::string what = absl::StrCat(call, ": handle of block ", Hex(id));
  if (w->arena == nullptr) {
    w->call_started_before_kill = !killed_.load();
    auto opened = w->client->OpenArena();
    if (!opened.ok()) return CallFailed(w, "OpenArena", opened.status().ToString());
    std::string error;
    w->arena =
        client::ShmArenaView::Open(w->client->ArenaSource(*opened), opened->size_bytes(), &error);
    if (w->arena == nullptr) {
      if (killed_.load()) return false;
      Fail(w, absl::StrCat("mapping the arena: ", error));
      return false;
    }
    w->arena_id = opened->arena_id();
  }
  if (arena_id != w->arena_id) {
    Fail(w, absl::StrCat(what, " names arena ", arena_id, ", the mapped one is ", w->arena_id));
    return false;
  }
  std::span<const std::byte> slot = w->arena->Slot(offset_bytes, size_bytes);
  if (slot.empty()) {
    Fail(w, absl::StrCat(what, ": [", offset_bytes, ", +", size_bytes, ") is not in the arena"));
    return false;
  }
  std::string diff = CompareWithPayload(id, slot.data(), slot.size());
  if (!diff.empty()) {
    Fail(w, absl::StrCat(what, " @ ", offset_bytes, ": ", diff));
    return false;
  }
  ++w->counters.handles_read;
  return true;
}

// ---- Writers -----------------------------------------------------------------

void Load::RunWriter(Worker* w) {
  bool go = true;
  while (go && !stop_.load()) {
    const int r = w->Uniform(0, 99);
    if (r < 24) {
      go = PutNew(w);
    } else if (r < 30) {
      go = PutShared(w);
    } else if (r < 34) {
      go = Reput(w);
    } else if (r < 37) {
      go = PutWrongBytes(w);
    } else if (r < 66) {
      go = ReadBytes(w);
    } else if (r < 72) {
      go = LookupOwn(w);
    } else if (r < 80) {
      go = ReadHandles(w);
    } else {
      go = DeleteSome(w);
    }
  }
}

bool Load::PutAndRecord(Worker* w, const std::vector<std::string>& ids, bool durable, bool retain,
                        bool via_slot, std::vector<std::string>* stored) {
  v1::PutBlocksRequest req;
  req.set_profile_id(options_.profile_id);
  req.set_durable(durable);
  req.set_retain(retain);
  std::vector<v1::SlotRef> slots;
  if (via_slot) {
    w->call_started_before_kill = !killed_.load();
    auto reserved = w->client->ReserveSlots(options_.profile_id, static_cast<uint32_t>(ids.size()),
                                            kLeaseTtlMs);
    if (!reserved.ok()) return CallFailed(w, "ReserveSlots", reserved.status().ToString());
    Acked(w);
    if (w->staging == nullptr) {
      std::string error;
      w->staging = client::ShmStagingFile::Open(w->client->StagingSource(*reserved),
                                                reserved->staging_size_bytes(), &error);
      if (w->staging == nullptr) {
        if (killed_.load()) return false;
        Fail(w, absl::StrCat("mapping the staging file: ", error));
        return false;
      }
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      const v1::SlotRef& slot = reserved->slots(static_cast<int>(i));
      const std::string payload = Payload(ids[i]);
      std::string error;
      if (!w->staging->Write(slot.offset_bytes(), slot.size_bytes(),
                             std::as_bytes(std::span(payload.data(), payload.size())), &error)) {
        Fail(w, absl::StrCat("staging slot of block ", Hex(ids[i]), ": ", error));
        return false;
      }
      slots.push_back(slot);
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    v1::BlockPut* b = req.add_blocks();
    b->set_block_id(ids[i]);
    if (via_slot) {
      *b->mutable_slot() = slots[i];
    } else {
      b->set_data(Payload(ids[i]));
    }
  }
  w->op = Worker::Op::kPut;
  w->op_ids = ids;
  w->op_durable = durable;
  w->call_started_before_kill = !killed_.load();
  auto put = w->client->PutBlocks({req});
  if (!put.ok()) return CallFailed(w, "PutBlocks", put.status().ToString());
  w->op = Worker::Op::kNone;
  w->op_ids.clear();
  Acked(w);
  if (put->results_size() != static_cast<int>(ids.size())) {
    Fail(w,
         absl::StrCat("PutBlocks: ", put->results_size(), " results for ", ids.size(), " blocks"));
    return false;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const v1::PutResult& r = put->results(static_cast<int>(i));
    const std::string what = absl::StrCat("PutBlocks", durable ? " durable" : "",
                                          retain ? " retain" : "", ": block ", Hex(ids[i]));
    if (r.block_id() != ids[i]) {
      Fail(w, absl::StrCat(what, ": result names block ", Hex(r.block_id())));
      return false;
    }
    const int code = r.status().code();
    if (code == kOk) {
      if ((durable && !r.durable()) || (retain && !r.retained())) {
        Fail(w, absl::StrCat(what, ": acknowledged with durable=", r.durable(),
                             " retained=", r.retained()));
        return false;
      }
      oracle_->PutAcked(ids[i], r.durable(), r.retained());
      ++w->counters.blocks_put;
      w->counters.durable_puts += r.durable() ? 1 : 0;
      w->counters.retained_puts += r.retained() ? 1 : 0;
      if (stored != nullptr) stored->push_back(ids[i]);
    } else if (code == kResourceExhausted) {
      // Refused: nothing changed (a new block was not stored; an existing
      // one stays as it was).
      if (retain && absl::StrContains(r.status().message(), "retained_bytes")) {
        ++w->counters.retained_quota_refusals;
      } else {
        ++w->counters.full_refusals;
      }
    } else {
      Fail(w, absl::StrCat(what, ": code ", code, ": ", r.status().message()));
      return false;
    }
  }
  return true;
}

bool Load::PutNew(Worker* w) {
  std::vector<std::string> ids;
  const int n = w->Uniform(1, 4);
  for (int i = 0; i < n; ++i) ids.push_back(oracle_->NewId(w->owner));
  const bool durable = w->Coin(0.5);
  return PutAndRecord(w, ids, durable, /*retain=*/w->Coin(0.08), /*via_slot=*/false, nullptr);
}

bool Load::PutShared(Worker* w) {
  const uint8_t shared = static_cast<uint8_t>(options_.writers + 1);
  std::optional<std::string> id = oracle_->PickRecent(shared, 8, w->rng);
  if (!id || w->Coin(0.25)) id = oracle_->NewId(shared);
  const bool durable = w->Coin(0.5);
  return PutAndRecord(w, {*id}, durable, /*retain=*/w->Coin(0.05), /*via_slot=*/false, nullptr);
}

bool Load::Reput(Worker* w) {
  std::optional<std::string> id = oracle_->PickOwn(w->owner, w->rng);
  if (!id) return PutNew(w);
  const bool durable = w->Coin(0.5);
  return PutAndRecord(w, {*id}, durable, /*retain=*/w->Coin(0.05), /*via_slot=*/false, nullptr);
}

bool Load::PutWrongBytes(Worker* w) {
  std::optional<std::string> id = oracle_->PickLive(w->owner, /*retained=*/true, w->rng);
  if (!id) return PutNew(w);
  v1::PutBlocksRequest req;
  req.set_profile_id(options_.profile_id);
  req.set_durable(w->Coin(0.5));
  v1::BlockPut* b = req.add_blocks();
  b->set_block_id(*id);
  b->set_data(WrongPayload(*id));
  w->call_started_before_kill = !killed_.load();
  auto put = w->client->PutBlocks({req});
  if (!put.ok()) return CallFailed(w, "PutBlocks (different bytes)", put.status().ToString());
  Acked(w);
  const int code = put->results_size() == 1 ? put->results(0).status().code() : -1;
  if (code != kAlreadyExists) {
    Fail(w, absl::StrCat("PutBlocks of different bytes under retained block ", Hex(*id), ": code ",
                         code, " instead of ALREADY_EXISTS (6)"));
    return false;
  }
  ++w->counters.wrong_puts_refused;
  return true;
}

bool Load::ReadBytes(Worker* w) {
  std::vector<std::string> ids;
  const int n = w->Uniform(1, 8);
  for (int i = 0; i < n; ++i) {
    std::optional<std::string> id =
        w->Coin(0.5) ? oracle_->PickLive(w->owner, w->Coin(0.2), w->rng) : oracle_->PickAny(w->rng);
    if (id) ids.push_back(*id);
  }
  if (ids.empty()) return PutNew(w);
  v1::GetBlocksRequest req;
  req.set_profile_id(options_.profile_id);
  req.set_mode(v1::RETURN_MODE_BYTES);
  std::vector<BlockFacts> before;
  for (const std::string& id : ids) {
    req.add_block_ids(id);
    before.push_back(oracle_->Facts(id));
  }
  w->call_started_before_kill = !killed_.load();
  auto got = w->client->GetBlocks(req);
  if (!got.ok()) return CallFailed(w, "GetBlocks", got.status().ToString());
  Acked(w);
  if (got->size() != ids.size()) {
    Fail(w, absl::StrCat("GetBlocks: ", got->size(), " results for ", ids.size(), " ids"));
    return false;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const v1::BlockResult& r = (*got)[i];
    if (r.block_id() != ids[i]) {
      Fail(w, absl::StrCat("GetBlocks: result ", i, " names block ", Hex(r.block_id()),
                           " instead of ", Hex(ids[i])));
      return false;
    }
    if (!CheckRead(w, "GetBlocks", ids[i], before[i], r.status().code(), r.status().message(),
                   &r.data())) {
      return false;
    }
  }
  return true;
}

bool Load::LookupOwn(Worker* w) {
  std::vector<std::string> ids;
  const int n = w->Uniform(1, 8);
  for (int i = 0; i < n; ++i) {
    std::optional<std::string> id = w->Coin(0.7) ? oracle_->PickLive(w->owner, w->Coin(0.3), w->rng)
                                                 : oracle_->PickOwn(w->owner, w->rng);
    if (id) ids.push_back(*id);
  }
  if (ids.empty()) return PutNew(w);
  v1::LookupRequest req;
  req.set_profile_id(options_.profile_id);
  std::vector<BlockFacts> before;
  for (const std::string& id : ids) {
    req.add_block_ids(id);
    before.push_back(oracle_->Facts(id));
  }
  w->call_started_before_kill = !killed_.load();
  auto found = w->client->Lookup(req);
  if (!found.ok()) return CallFailed(w, "Lookup", found.status().ToString());
  Acked(w);
  if (found->entries_size() != static_cast<int>(ids.size())) {
    Fail(w, absl::StrCat("Lookup: ", found->entries_size(), " entries for ", ids.size(), " ids"));
    return false;
  }
  uint32_t prefix = 0;
  while (prefix < ids.size() && found->entries(static_cast<int>(prefix)).present()) ++prefix;
  if (found->prefix_blocks() != prefix) {
    Fail(w, absl::StrCat("Lookup: prefix_blocks ", found->prefix_blocks(), ", the entries say ",
                         prefix));
    return false;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const v1::LookupEntry& e = found->entries(static_cast<int>(i));
    const BlockFacts& f = before[i];
    const std::string what = absl::StrCat("Lookup: block ", Hex(ids[i]));
    if (e.block_id() != ids[i]) {
      Fail(w, absl::StrCat(what, ": entry names ", Hex(e.block_id())));
      return false;
    }
    if (f.retained && (!e.present() || (f.durable && !e.durable()))) {
      // The NVMe tier never evicts a retained copy.
      Fail(w, absl::StrCat(what, " (acknowledged retained", f.durable ? ", durable" : "",
                           "): present=", e.present(), " durable=", e.durable()));
      return false;
    }
    if (e.present() && !f.may_exist) {
      Fail(w, absl::StrCat(what, " is present although ", kWhyAbsent));
      return false;
    }
    if (!e.present() && f.may_exist) {
      if (f.durable) ++w->counters.evictions_seen;
      oracle_->ObservedAbsent(ids[i]);
    }
    if (e.present() && f.durable && !e.durable()) ++w->counters.durability_dropped_seen;
  }
  return true;
}

bool Load::ReadHandles(Worker* w) {
  std::vector<std::string> ids;
  const int n = w->Uniform(1, 4);
  for (int i = 0; i < n; ++i) {
    std::optional<std::string> id = oracle_->PickAny(w->rng);
    if (id && std::find(ids.begin(), ids.end(), *id) == ids.end()) ids.push_back(*id);
  }
  if (ids.empty()) return PutNew(w);
  v1::GetBlocksRequest req;
  req.set_profile_id(options_.profile_id);
  req.set_mode(v1::RETURN_MODE_HANDLES);
  req.set_lease_ttl_ms(kLeaseTtlMs);
  std::vector<BlockFacts> before;
  for (const std::string& id : ids) {
    req.add_block_ids(id);
    before.push_back(oracle_->Facts(id));
  }
  uint64_t lease_id = 0;
  w->call_started_before_kill = !killed_.load();
  auto got = w->client->GetBlocks(req, &lease_id);
  if (!got.ok()) return CallFailed(w, "GetBlocks (handles)", got.status().ToString());
  Acked(w);
  if (got->size() != ids.size()) {
    Fail(w, absl::StrCat("GetBlocks (handles): ", got->size(), " results for ", ids.size()));
    return false;
  }
  uint32_t pinned = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const v1::BlockResult& r = (*got)[i];
    const int code = r.status().code();
    if (code == kResourceExhausted) continue;  // every device slot pinned right now
    if (code == kOk) {
      ++pinned;
      if (!CheckArenaSlot(w, "GetBlocks (handles)", ids[i], r.handle().arena_id(),
                          r.handle().offset_bytes(), r.handle().size_bytes())) {
        return false;
      }
    }
    if (!CheckRead(w, "GetBlocks (handles)", ids[i], before[i], code, r.status().message(),
                   nullptr)) {
      return false;
    }
  }
  if ((lease_id != 0) != (pinned > 0)) {
    Fail(w, absl::StrCat("GetBlocks (handles): lease ", lease_id, " for ", pinned, " handles"));
    return false;
  }
  if (lease_id == 0) return true;
  v1::ReleaseRequest release;
  release.set_lease_id(lease_id);
  w->call_started_before_kill = !killed_.load();
  auto released = w->client->Release(release);
  if (!released.ok()) return CallFailed(w, "Release", released.status().ToString());
  Acked(w);
  if (released->blocks_unpinned() != pinned) {
    Fail(w, absl::StrCat("Release of lease ", lease_id, " unpinned ", released->blocks_unpinned(),
                         " blocks, ", pinned, " were pinned"));
    return false;
  }
  return true;
}

bool Load::DeleteSome(Worker* w) {
  std::vector<std::string> ids;
  const int n = w->Uniform(1, 2);
  for (int i = 0; i < n; ++i) {
    std::optional<std::string> id = oracle_->PickLive(w->owner, /*retained=*/false, w->rng);
    if (id && std::find(ids.begin(), ids.end(), *id) == ids.end()) ids.push_back(*id);
  }
  if (ids.empty()) return PutNew(w);
  v1::DeleteBlocksRequest req;
  req.set_profile_id(options_.profile_id);
  std::vector<BlockFacts> before;
  for (const std::string& id : ids) {
    req.add_block_ids(id);
    before.push_back(oracle_->Facts(id));
  }
  w->op = Worker::Op::kDelete;
  w->op_ids = ids;
  w->call_started_before_kill = !killed_.load();
  auto deleted = w->client->DeleteBlocks(req);
  if (!deleted.ok()) return CallFailed(w, "DeleteBlocks", deleted.status().ToString());
  w->op = Worker::Op::kNone;
  w->op_ids.clear();
  Acked(w);
  if (deleted->statuses_size() != static_cast<int>(ids.size())) {
    Fail(w, absl::StrCat("DeleteBlocks: ", deleted->statuses_size(), " statuses for ", ids.size(),
                         " ids"));
    return false;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const int code = deleted->statuses(static_cast<int>(i)).code();
    if (code == kOk || code == kNotFound) {
      if (code == kOk) ++w->counters.deletes;
      if (code == kNotFound && before[i].durable) ++w->counters.evictions_seen;
      oracle_->DeleteAcked(ids[i]);
    } else if (code != kFailedPrecondition) {  // pinned by someone's lease: stays
      Fail(w, absl::StrCat("DeleteBlocks: block ", Hex(ids[i]), ": code ", code, ": ",
                           deleted->statuses(static_cast<int>(i)).message()));
      return false;
    }
  }
  return true;
}

// ---- Engine ------------------------------------------------------------------

void Load::RunEngine(Worker* w) {
  v1::KvTier::Stub* stub = w->client->kvtier_stub();
  grpc::ClientContext select_ctx;
  select_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::hours(1));
  auto stream = stub->Select(&select_ctx);
  uint64_t context_id = 0;
  std::vector<std::string> context_ids;  // position -> block id
  uint64_t request_id = 0;
  auto call_failed = [&](const char* call, const grpc::Status& st) {
    return CallFailed(w, call, GrpcText(st));
  };
  while (!stop_.load()) {
    const std::string id = oracle_->NewId(w->owner);
    std::vector<std::string> stored;
    if (!PutAndRecord(w, {id}, /*durable=*/w->Coin(0.3), /*retain=*/false,
                      /*via_slot=*/w->Coin(0.5), &stored)) {
      break;
    }
    if (stored.empty()) continue;  // refused: the tiers were full of pinned blocks
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    grpc::Status st;
    w->call_started_before_kill = !killed_.load();
    if (context_id == 0 || context_ids.size() >= kBlocksPerContext) {
      if (context_id != 0) {
        grpc::ClientContext close_ctx;
        SetDeadline(&close_ctx);
        v1::CloseContextRequest close;
        close.set_context_id(context_id);
        v1::CloseContextResponse closed;
        st = stub->CloseContext(&close_ctx, close, &closed);
        if (!st.ok()) {
          call_failed("CloseContext", st);
          break;
        }
        Acked(w);
        context_id = 0;
      }
      v1::OpenContextRequest open;
      open.set_profile_id(options_.profile_id);
      open.set_lease_ttl_ms(kLeaseTtlMs);
      v1::Segment* segment = open.add_segments();
      segment->set_label("decode");
      segment->add_block_ids(id);
      v1::OpenContextResponse opened;
      st = stub->OpenContext(&ctx, open, &opened);
      if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) continue;  // evicted already
      if (!st.ok()) {
        call_failed("OpenContext", st);
        break;
      }
      Acked(w);
      context_id = opened.context_id();
      context_ids = {id};
    } else {
      v1::AppendBlocksRequest append;
      append.set_context_id(context_id);
      append.add_block_ids(id);
      v1::AppendBlocksResponse appended;
      st = stub->AppendBlocks(&ctx, append, &appended);
      if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) continue;  // evicted already
      if (!st.ok()) {
        call_failed("AppendBlocks", st);
        break;
      }
      Acked(w);
      context_ids.push_back(id);
      if (appended.num_blocks() != context_ids.size()) {
        Fail(w, absl::StrCat("AppendBlocks: context ", context_id, " has ", appended.num_blocks(),
                             " blocks, expected ", context_ids.size()));
        break;
      }
    }
    v1::SelectRequest select;
    select.set_request_id(++request_id);
    v1::ContextSelect* entry = select.add_contexts();
    entry->set_context_id(context_id);
    entry->set_max_blocks(kSelectBudgetBlocks);
    v1::SelectResponse selected;
    w->call_started_before_kill = !killed_.load();
    if (!stream->Write(select) || !stream->Read(&selected)) {
      call_failed("Select", stream->Finish());  // the stream is over: Finish says why
      return;
    }
    Acked(w);
    ++w->counters.selects;
    if (selected.request_id() != request_id || selected.contexts_size() != 1 ||
        selected.contexts(0).status().code() != kOk) {
      Fail(w, absl::StrCat("Select ", request_id, ": ", selected.ShortDebugString()));
      break;
    }
    for (const v1::SelectedBlock& b : selected.contexts(0).blocks()) {
      if (b.position() >= context_ids.size() || b.block_id() != context_ids[b.position()]) {
        Fail(w, absl::StrCat("Select ", request_id, ": block ", Hex(b.block_id()), " at position ",
                             b.position(), " is not the context's"));
        break;
      }
      if (b.residency() == v1::RESIDENCY_RESIDENT &&
          !CheckArenaSlot(w, "Select", b.block_id(), b.handle().arena_id(),
                          b.handle().offset_bytes(), b.handle().size_bytes())) {
        break;
      }
    }
  }
  select_ctx.TryCancel();
  stream->Finish();
}

}  // namespace kvtier::crash
