#include "tests/load/streams.h"

#include <algorithm>
#include <span>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/load/stream_worker.h"

namespace kvtier::load {

void StreamCounters::Add(const StreamCounters& o) {
  blocks_put += o.blocks_put;
  durable_puts += o.durable_puts;
  slot_puts += o.slot_puts;
  full_refusals += o.full_refusals;
  staging_full += o.staging_full;
  blocks_read += o.blocks_read;
  handles_read += o.handles_read;
  read_misses += o.read_misses;
  handles_refused += o.handles_refused;
  deletes += o.deletes;
  deletes_pinned += o.deletes_pinned;
  selects += o.selects;
  selected_resident += o.selected_resident;
  selected_pending += o.selected_pending;
  selected_absent += o.selected_absent;
  contexts_opened += o.contexts_opened;
  appends += o.appends;
  contexts_evicted += o.contexts_evicted;
  mismatches += o.mismatches;
  failures += o.failures;
}

Streams::Streams(StreamsOptions options) : options_(std::move(options)) {}

Streams::~Streams() {
  Stop();
  Join();
}

bool Streams::Start(std::string* error) {
  for (int i = 0; i < options_.streams; ++i) {
    auto w = std::make_unique<Worker>();
    w->stream = static_cast<uint32_t>(i);
    w->engine = i < options_.engines;
    w->name = absl::StrCat(w->engine ? "engine " : "writer ", i);
    std::seed_seq seq{options_.seed, static_cast<uint64_t>(i)};
    w->rng.seed(seq);
    ClientOptions client_options;
    client_options.token = options_.token;
    client_options.call_timeout = kCallTimeout;
    auto client = Client::Connect(options_.socket_path, client_options);
    if (!client.ok()) {
      *error = absl::StrCat(w->name, ": Client::Connect: ", client.status().ToString());
      return false;
    }
    w->client = std::move(*client);
    workers_.push_back(std::move(w));
  }
  deadline_ = std::chrono::steady_clock::now() + options_.duration;
  for (auto& w : workers_) {
    Worker* worker = w.get();
    threads_.emplace_back([this, worker] {
      if (worker->engine) {
        RunEngine(worker);
      } else {
        RunWriter(worker);
      }
    });
  }
  return true;
}

void Streams::Join() {
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

bool Streams::Done() const {
  return stop_.load(std::memory_order_relaxed) || std::chrono::steady_clock::now() >= deadline_;
}

StreamCounters Streams::counters() const {
  StreamCounters sum;
  for (const auto& w : workers_) sum.Add(w->counters);
  return sum;
}

OpStats Streams::MergedStats() const {
  OpStats all;
  for (const auto& w : workers_) all.Merge(w->stats);
  return all;
}

std::vector<std::string> Streams::failure_messages() const {
  absl::MutexLock lock(&mu_);
  return failure_messages_;
}

void Streams::Fail(Worker* w, const std::string& what) {
  ++w->counters.failures;
  absl::MutexLock lock(&mu_);
  if (failure_messages_.size() < kMaxFailureMessages) {
    failure_messages_.push_back(absl::StrCat(w->name, ": ", what));
  }
}

void Streams::Mismatch(Worker* w, const std::string& what) {
  ++w->counters.mismatches;
  absl::MutexLock lock(&mu_);
  if (failure_messages_.size() < kMaxFailureMessages) {
    failure_messages_.push_back(absl::StrCat(w->name, ": MISMATCH: ", what));
  }
}

// ---- Checks ------------------------------------------------------------------

void Streams::CheckRead(Worker* w, const char* call, const std::string& id, int code,
                        const std::string& message, const std::string* data) {
  const std::string what = absl::StrCat(call, ": block ", Hex(id));
  if (code == kOk) {
    if (data == nullptr) return;
    const std::string diff = ComparePayload(id, options_.block_bytes, data->data(), data->size());
    if (!diff.empty()) {
      Mismatch(w, absl::StrCat(what, ": ", diff));
    } else {
      ++w->counters.blocks_read;
    }
  } else if (code == kNotFound && !absl::StartsWith(message, "DATA_LOSS")) {
    ++w->counters.read_misses;  // evicted, deleted or never put
  } else {
    Fail(w, absl::StrCat(what, ": code ", code, ": ", message));
  }
}

void Streams::CheckSlot(Worker* w, const char* call, const std::string& id, uint64_t arena_id,
                        uint64_t offset_bytes, uint64_t size_bytes) {
  const std::string what = absl::StrCat(call, ": handle of block ", Hex(id));
  if (w->arena == nullptr) {
    auto opened = w->client->OpenArena();
    if (!opened.ok()) return Fail(w, absl::StrCat("OpenArena: ", opened.status().ToString()));
    std::string error;
    w->arena =
        client::ShmArenaView::Open(w->client->ArenaSource(*opened), opened->size_bytes(), &error);
    if (w->arena == nullptr) return Fail(w, absl::StrCat("mapping the arena: ", error));
    w->arena_id = opened->arena_id();
  }
  if (arena_id != w->arena_id) {
    return Fail(w, absl::StrCat(what, " names arena ", arena_id, ", mapped is ", w->arena_id));
  }
  std::span<const std::byte> slot = w->arena->Slot(offset_bytes, size_bytes);
  if (slot.empty()) {
    return Fail(w,
                absl::StrCat(what, ": [", offset_bytes, ", +", size_bytes, ") not in the arena"));
  }
  const std::string diff = ComparePayload(id, options_.block_bytes, slot.data(), slot.size());
  if (!diff.empty()) return Mismatch(w, absl::StrCat(what, " @ ", offset_bytes, ": ", diff));
  ++w->counters.handles_read;
}

// ---- Puts (writers and engines) ----------------------------------------------

void Streams::Put(Worker* w, const std::vector<std::string>& ids, bool durable, bool via_slot,
                  std::vector<std::string>* stored) {
  v1::PutBlocksRequest req;
  req.set_profile_id(options_.profile_id);
  req.set_durable(durable);
  const auto n = static_cast<uint32_t>(ids.size());
  if (via_slot) {
    absl::StatusOr<v1::ReserveSlotsResponse> reserved;
    {
      ScopedTimer timer(&w->stats, Op::kReserve);
      reserved = w->client->ReserveSlots(options_.profile_id, n, options_.lease_ttl_ms);
    }
    Called(w);
    w->stats.CallCode(Op::kReserve, static_cast<int>(reserved.status().code()));
    if (reserved.status().code() == absl::StatusCode::kResourceExhausted) {
      ++w->counters.staging_full;  // every staging slot reserved right now
      via_slot = false;
    } else if (!reserved.ok()) {
      return Fail(w, absl::StrCat("ReserveSlots: ", reserved.status().ToString()));
    } else if (reserved->slots_size() != static_cast<int>(n)) {
      return Fail(w, absl::StrCat("ReserveSlots: ", reserved->slots_size(), " slots for ", n));
    } else {
      std::string error;
      if (w->staging == nullptr) {
        w->staging = client::ShmStagingFile::Open(w->client->StagingSource(*reserved),
                                                  reserved->staging_size_bytes(), &error);
        if (w->staging == nullptr) return Fail(w, "mapping the staging file: " + error);
      }
      for (uint32_t i = 0; i < n; ++i) {
        const v1::SlotRef& slot = reserved->slots(static_cast<int>(i));
        const std::string payload = Payload(ids[i], options_.block_bytes);
        if (!w->staging->Write(slot.offset_bytes(), slot.size_bytes(),
                               std::as_bytes(std::span(payload.data(), payload.size())), &error)) {
          return Fail(w, absl::StrCat("staging slot of block ", Hex(ids[i]), ": ", error));
        }
        v1::BlockPut* b = req.add_blocks();
        b->set_block_id(ids[i]);
        *b->mutable_slot() = slot;
      }
    }
  }
  if (!via_slot) {
    for (const std::string& id : ids) {
      v1::BlockPut* b = req.add_blocks();
      b->set_block_id(id);
      b->set_data(Payload(id, options_.block_bytes));
    }
  }
  absl::StatusOr<v1::PutBlocksResponse> put;
  {
    ScopedTimer timer(&w->stats, Op::kPut);
    put = w->client->PutBlocks({req});
  }
  Called(w);
  w->stats.CallCode(Op::kPut, static_cast<int>(put.status().code()));
  if (!put.ok()) return Fail(w, absl::StrCat("PutBlocks: ", put.status().ToString()));
  if (put->results_size() != static_cast<int>(n)) {
    return Fail(w, absl::StrCat("PutBlocks: ", put->results_size(), " results for ", n, " blocks"));
  }
  for (uint32_t i = 0; i < n; ++i) {
    const v1::PutResult& r = put->results(static_cast<int>(i));
    const int code = r.status().code();
    w->stats.ItemCode(Op::kPut, code);
    const std::string what = absl::StrCat("PutBlocks", durable ? " durable" : "",
                                          via_slot ? " slot" : "", ": block ", Hex(ids[i]));
    if (r.block_id() != ids[i]) {
      Fail(w, absl::StrCat(what, ": result names block ", Hex(r.block_id())));
    } else if (code == kOk) {
      if (durable && !r.durable()) Fail(w, what + ": acknowledged, but not durable");
      ++w->counters.blocks_put;
      w->counters.durable_puts += r.durable() ? 1 : 0;
      w->counters.slot_puts += via_slot ? 1 : 0;
      if (stored != nullptr) stored->push_back(ids[i]);
    } else if (code == kResourceExhausted) {
      ++w->counters.full_refusals;  // tiers full of pinned blocks: nothing stored
    } else {
      Fail(w, absl::StrCat(what, ": code ", code, ": ", r.status().message()));
    }
  }
}

// ---- Writers -----------------------------------------------------------------

void Streams::RunWriter(Worker* w) {
  const WriterMix& m = options_.mix;
  const int total = m.put + m.get + m.handles + m.del;
  while (!Done()) {
    const int r = w->Uniform(0, total - 1);
    if (r < m.put) {
      PutSome(w);
    } else if (r < m.put + m.get) {
      GetBytes(w);
    } else if (r < m.put + m.get + m.handles) {
      GetHandles(w);
    } else {
      DeleteOne(w);
    }
  }
}

void Streams::PutSome(Worker* w) {
  std::vector<std::string> ids;
  const int n = w->Uniform(1, 4);
  while (ids.size() < static_cast<size_t>(n)) {
    std::string id = BlockId(w->stream, w->UniformSeq(options_.ids_per_stream));
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(std::move(id));
  }
  std::vector<std::string> stored;
  Put(w, ids, w->Coin(options_.durable_fraction), w->Coin(options_.slot_fraction), &stored);
  for (std::string& id : stored) {
    w->recent.push_back(std::move(id));
    if (w->recent.size() > kRecentIds) w->recent.pop_front();
  }
}

void Streams::GetBytes(Worker* w) {
  v1::GetBlocksRequest req;
  req.set_profile_id(options_.profile_id);
  req.set_mode(v1::RETURN_MODE_BYTES);
  const int n = w->Uniform(1, 8);
  for (int i = 0; i < n; ++i) {
    req.add_block_ids(w->PickReadId(options_.streams, options_.ids_per_stream));
  }
  absl::StatusOr<std::vector<v1::BlockResult>> got;
  {
    ScopedTimer timer(&w->stats, Op::kGet);
    got = w->client->GetBlocks(req);
  }
  Called(w);
  w->stats.CallCode(Op::kGet, static_cast<int>(got.status().code()));
  if (!got.ok()) return Fail(w, absl::StrCat("GetBlocks: ", got.status().ToString()));
  if (got->size() != static_cast<size_t>(n)) {
    return Fail(w, absl::StrCat("GetBlocks: ", got->size(), " results for ", n, " ids"));
  }
  for (int i = 0; i < n; ++i) {
    const v1::BlockResult& r = (*got)[i];
    w->stats.ItemCode(Op::kGet, r.status().code());
    if (r.block_id() != req.block_ids(i)) {
      Fail(w, absl::StrCat("GetBlocks: result ", i, " names ", Hex(r.block_id()), " instead of ",
                           Hex(req.block_ids(i))));
      continue;
    }
    CheckRead(w, "GetBlocks", r.block_id(), r.status().code(), r.status().message(), &r.data());
  }
}

void Streams::GetHandles(Worker* w) {
  v1::GetBlocksRequest req;
  req.set_profile_id(options_.profile_id);
  req.set_mode(v1::RETURN_MODE_HANDLES);
  req.set_lease_ttl_ms(options_.lease_ttl_ms);
  const int n = w->Uniform(1, 4);
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) {
    std::string id = w->PickReadId(options_.streams, options_.ids_per_stream);
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(std::move(id));
  }
  for (const std::string& id : ids) req.add_block_ids(id);
  uint64_t lease_id = 0;
  absl::StatusOr<std::vector<v1::BlockResult>> got;
  {
    ScopedTimer timer(&w->stats, Op::kGetHandles);
    got = w->client->GetBlocks(req, &lease_id);
  }
  Called(w);
  w->stats.CallCode(Op::kGetHandles, static_cast<int>(got.status().code()));
  if (!got.ok()) return Fail(w, absl::StrCat("GetBlocks (handles): ", got.status().ToString()));
  if (got->size() != ids.size()) {
    return Fail(w, absl::StrCat("GetBlocks (handles): ", got->size(), " results for ", ids.size()));
  }
  uint32_t pinned = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const v1::BlockResult& r = (*got)[i];
    const int code = r.status().code();
    w->stats.ItemCode(Op::kGetHandles, code);
    if (r.block_id() != ids[i]) {
      Fail(w, absl::StrCat("GetBlocks (handles): result ", i, " names ", Hex(r.block_id())));
    } else if (code == kResourceExhausted) {
      ++w->counters.handles_refused;  // every device slot pinned right now
    } else if (code == kOk) {
      ++pinned;
      CheckSlot(w, "GetBlocks (handles)", ids[i], r.handle().arena_id(), r.handle().offset_bytes(),
                r.handle().size_bytes());
    } else {
      CheckRead(w, "GetBlocks (handles)", ids[i], code, r.status().message(), nullptr);
    }
  }
  if ((lease_id != 0) != (pinned > 0)) {
    return Fail(w,
                absl::StrCat("GetBlocks (handles): lease ", lease_id, " for ", pinned, " handles"));
  }
  if (lease_id == 0) return;
  v1::ReleaseRequest release;
  release.set_lease_id(lease_id);
  absl::StatusOr<v1::ReleaseResponse> released;
  {
    ScopedTimer timer(&w->stats, Op::kRelease);
    released = w->client->Release(release);
  }
  Called(w);
  w->stats.CallCode(Op::kRelease, static_cast<int>(released.status().code()));
  if (!released.ok()) return Fail(w, absl::StrCat("Release: ", released.status().ToString()));
  if (released->blocks_unpinned() != pinned) {
    Fail(w, absl::StrCat("Release of lease ", lease_id, " unpinned ", released->blocks_unpinned(),
                         " blocks, ", pinned, " were pinned"));
  }
}

void Streams::DeleteOne(Worker* w) {
  v1::DeleteBlocksRequest req;
  req.set_profile_id(options_.profile_id);
  req.add_block_ids(BlockId(w->stream, w->UniformSeq(options_.ids_per_stream)));
  absl::StatusOr<v1::DeleteBlocksResponse> deleted;
  {
    ScopedTimer timer(&w->stats, Op::kDelete);
    deleted = w->client->DeleteBlocks(req);
  }
  Called(w);
  w->stats.CallCode(Op::kDelete, static_cast<int>(deleted.status().code()));
  if (!deleted.ok()) return Fail(w, absl::StrCat("DeleteBlocks: ", deleted.status().ToString()));
  if (deleted->statuses_size() != 1) {
    return Fail(w, absl::StrCat("DeleteBlocks: ", deleted->statuses_size(), " statuses for 1 id"));
  }
  const int code = deleted->statuses(0).code();
  w->stats.ItemCode(Op::kDelete, code);
  if (code == kOk) {
    ++w->counters.deletes;
  } else if (code == kFailedPrecondition) {
    ++w->counters.deletes_pinned;  // pinned by someone's lease: stays
  } else if (code != kNotFound) {
    Fail(w, absl::StrCat("DeleteBlocks: block ", Hex(req.block_ids(0)), ": code ", code, ": ",
                         deleted->statuses(0).message()));
  }
  std::erase(w->recent, req.block_ids(0));
}

}  // namespace kvtier::load
