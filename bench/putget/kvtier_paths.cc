#include "bench/putget/kvtier_paths.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "daemon/config.h"
#include "daemon/tenant.h"
#include "storage/store/block_store.h"

namespace kvtier::bench {
namespace {

constexpr std::chrono::seconds kStreamDeadline{120};

void SetStreamDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + kStreamDeadline);
}

absl::Status ItemError(const char* what, uint64_t index, const v1::ItemStatus& st) {
  return absl::Status(static_cast<absl::StatusCode>(st.code()),
                      absl::StrCat(what, " of block ", index, ": ", st.message()));
}

// Every block stored fresh, in order.
absl::Status CheckPut(const v1::PutBlocksResponse& resp, uint64_t n) {
  if (static_cast<uint64_t>(resp.results_size()) != n) {
    return absl::InternalError(
        absl::StrCat("PutBlocks answered ", resp.results_size(), " results for ", n, " blocks"));
  }
  for (uint64_t i = 0; i < n; ++i) {
    const v1::PutResult& r = resp.results(static_cast<int>(i));
    if (r.status().code() != 0) return ItemError("PutBlocks", i, r.status());
    if (r.existed()) {
      return absl::FailedPreconditionError(
          absl::StrCat("PutBlocks: block ", i, " was already stored (ids must be fresh)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::ModelProfile> ProfileForBlockBytes(uint64_t block_bytes) {
  v1::ModelProfile p;
  p.set_name(absl::StrCat("putget-bench-", block_bytes));
  p.set_revision("1");
  p.set_dtype(v1::DTYPE_FP16);
  p.set_block_size_tokens(16);
  // [layers][2][kv_heads][16 tokens][head_dim] x 2 bytes.
  if (block_bytes % (64 << 10) == 0) {
    p.set_num_kv_heads(8);
    p.set_head_dim(128);
    p.set_num_layers(static_cast<uint32_t>(block_bytes / (64 << 10)));
  } else if (block_bytes % (4 << 10) == 0) {
    p.set_num_kv_heads(1);
    p.set_head_dim(64);
    p.set_num_layers(static_cast<uint32_t>(block_bytes / (4 << 10)));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("block size ", block_bytes, " is not a multiple of 4 KiB"));
  }
  return p;
}

absl::StatusOr<std::unique_ptr<KvtierPaths>> KvtierPaths::Start(const KvtierOptions& options) {
  std::unique_ptr<KvtierPaths> k(new KvtierPaths());
  k->options_ = options;
  std::error_code ec;
  std::filesystem::remove_all(options.data_dir, ec);
  std::vector<std::string> overrides = {
      "server.data_dir=" + options.data_dir,
      "log.level=warn",
      "server.shutdown_grace_ms=1000",
      "tiers.device.backend=shm",
      absl::StrCat("tiers.device.capacity_bytes=", options.device_bytes),
      absl::StrCat("tiers.host.capacity_bytes=", options.host_bytes),
      absl::StrCat("tiers.host.staging_bytes=", options.staging_bytes),
      "tiers.nvme.file_count=2",
      absl::StrCat("tiers.nvme.file_size_bytes=", options.nvme_file_bytes),
      "tiers.nvme.direct_io=false",
      "tiers.nvme.io_threads=1",
      "tiers.nvme.write_through=false",
      absl::StrCat("limits.max_batch_blocks=", options.max_batch_blocks)};
  overrides.insert(overrides.end(), options.extra_overrides.begin(), options.extra_overrides.end());
  auto config = daemon::LoadConfig("", overrides);
  if (!config.ok()) return config.status();
  auto server = daemon::Server::Start(*config);
  if (!server.ok()) return server.status();
  k->server_ = std::move(*server);
  ClientOptions copts;
  copts.max_message_bytes = static_cast<int>(config->server.max_message_bytes);
  auto client = Client::Connect(k->server_->socket_path(), copts);
  if (!client.ok()) return client.status();
  k->client_ = std::move(*client);
  auto arena = k->client_->OpenArena();
  if (!arena.ok()) return arena.status();
  if (arena->shm_path().empty() && arena->fd_socket_path().empty()) {
    return absl::FailedPreconditionError("the device arena is not a shared-memory file");
  }
  std::string err;
  k->arena_ =
      client::ShmArenaView::Open(k->client_->ArenaSource(*arena), arena->size_bytes(), &err);
  if (k->arena_ == nullptr) return absl::InternalError(err);
  k->arena_id_ = arena->arena_id();
  return k;
}

KvtierPaths::~KvtierPaths() {
  staging_.reset();
  arena_.reset();
  client_.reset();
  if (server_ != nullptr) server_->Shutdown();
  server_.reset();
  std::error_code ec;
  std::filesystem::remove_all(options_.data_dir, ec);
}

absl::StatusOr<uint64_t> KvtierPaths::RegisterBlockSize(uint64_t block_bytes) {
  auto profile = ProfileForBlockBytes(block_bytes);
  if (!profile.ok()) return profile.status();
  uint64_t size = 0;
  auto id = RegisterProfile(*profile, &size);
  if (!id.ok()) return id.status();
  if (size != block_bytes) {
    return absl::InternalError(
        absl::StrCat("profile block size is ", size, ", wanted ", block_bytes));
  }
  return id;
}

absl::StatusOr<uint64_t> KvtierPaths::RegisterProfile(const v1::ModelProfile& profile,
                                                      uint64_t* block_bytes) {
  auto registered = client_->RegisterProfile(profile);
  if (!registered.ok()) return registered.status();
  *block_bytes = registered->block_size_bytes();
  return registered->profile_id();
}

absl::Status KvtierPaths::PutBytes(uint64_t profile_id, const WorkingSet& ws,
                                   const std::vector<std::string>& ids, uint32_t batch) {
  grpc::ClientContext ctx;
  SetStreamDeadline(&ctx);
  v1::PutBlocksResponse resp;
  auto writer = client_->kvtier_stub()->PutBlocks(&ctx, &resp);
  v1::PutBlocksRequest req;
  const uint64_t n = ids.size();
  for (uint64_t first = 0; first < n; first += batch) {
    req.Clear();
    req.set_profile_id(profile_id);
    for (uint64_t i = first; i < std::min<uint64_t>(n, first + batch); ++i) {
      v1::BlockPut* b = req.add_blocks();
      b->set_block_id(ids[i]);
      b->set_data(ws.src(i), ws.block_bytes());
    }
    if (!writer->Write(req)) break;  // the server finished early; Finish says why
  }
  writer->WritesDone();
  grpc::Status st = writer->Finish();
  if (!st.ok()) return FromGrpcStatus(st);
  return CheckPut(resp, n);
}

absl::Status KvtierPaths::PutDirect(uint64_t profile_id, const WorkingSet& ws,
                                    const std::vector<std::string>& ids, uint32_t batch) {
  std::vector<BlockData> blocks(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto* src = reinterpret_cast<const uint8_t*>(ws.src(i));
    blocks[i] = BlockData{ids[i], absl::MakeConstSpan(src, ws.block_bytes())};
  }
  PutDataOptions options;
  options.message_blocks = batch;
  options.message_bytes = uint64_t{batch} * (ws.block_bytes() + 256);
  absl::StatusOr<v1::PutBlocksResponse> put = client_->PutBlockData(profile_id, blocks, options);
  if (!put.ok()) return put.status();
  return CheckPut(*put, ids.size());
}

absl::Status KvtierPaths::GetDirect(uint64_t profile_id, WorkingSet* ws,
                                    const std::vector<std::string>& ids, uint32_t batch) {
  std::vector<BlockDestination> dst(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    auto* to = reinterpret_cast<uint8_t*>(ws->dst(i));
    dst[i] = BlockDestination{ids[i], absl::MakeSpan(to, ws->block_bytes())};
  }
  absl::StatusOr<std::vector<BlockDataResult>> got = client_->GetBlockData(profile_id, dst, batch);
  if (!got.ok()) return got.status();
  for (size_t i = 0; i < got->size(); ++i) {
    if (!(*got)[i].status.ok()) {
      const absl::Status& st = (*got)[i].status;
      return absl::Status(st.code(), absl::StrCat("GetBlockData: block ", i, ": ", st.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status KvtierPaths::GetBytes(uint64_t profile_id, WorkingSet* ws,
                                   const std::vector<std::string>& ids, uint32_t batch) {
  const uint64_t n = ids.size();
  const uint64_t size = ws->block_bytes();
  v1::GetBlocksResponse resp;
  for (uint64_t first = 0; first < n; first += batch) {
    const uint64_t end = std::min<uint64_t>(n, first + batch);
    v1::GetBlocksRequest req;
    req.set_profile_id(profile_id);
    req.set_mode(v1::RETURN_MODE_BYTES);
    for (uint64_t i = first; i < end; ++i) req.add_block_ids(ids[i]);
    grpc::ClientContext ctx;
    SetStreamDeadline(&ctx);
    auto reader = client_->kvtier_stub()->GetBlocks(&ctx, req);
    uint64_t next = first;
    absl::Status item;
    while (reader->Read(&resp)) {
      for (const v1::BlockResult& r : resp.results()) {
        if (!item.ok()) continue;
        if (next >= end) {
          item = absl::InternalError("GetBlocks returned more results than ids");
        } else if (r.status().code() != 0) {
          item = ItemError("GetBlocks", next, r.status());
        } else if (r.data().size() != size) {
          item = absl::InternalError(
              absl::StrCat("GetBlocks: block ", next, " has ", r.data().size(), " bytes"));
        } else {
          std::memcpy(ws->dst(next++), r.data().data(), size);
        }
      }
    }
    grpc::Status st = reader->Finish();
    if (!st.ok()) return FromGrpcStatus(st);
    if (!item.ok()) return item;
    if (next != end) {
      return absl::InternalError(
          absl::StrCat("GetBlocks returned ", next - first, " of ", end - first, " blocks"));
    }
  }
  return absl::OkStatus();
}

absl::Status KvtierPaths::PutStaged(uint64_t profile_id, const WorkingSet& ws,
                                    const std::vector<std::string>& ids, uint32_t batch) {
  grpc::ClientContext ctx;
  SetStreamDeadline(&ctx);
  v1::PutBlocksResponse resp;
  auto writer = client_->kvtier_stub()->PutBlocks(&ctx, &resp);
  v1::PutBlocksRequest req;
  const uint64_t n = ids.size();
  const uint64_t size = ws.block_bytes();
  absl::Status failed;
  for (uint64_t first = 0; first < n && failed.ok(); first += batch) {
    const uint64_t end = std::min<uint64_t>(n, first + batch);
    auto slots = client_->ReserveSlots(profile_id, static_cast<uint32_t>(end - first));
    if (!slots.ok()) {
      failed = slots.status();
      break;
    }
    // One staging file per daemon (or per tenant): map it once, again only
    // if the daemon names a different file.
    if (staging_ == nullptr ||
        (!slots->staging_path().empty() && staging_->path() != slots->staging_path())) {
      std::string err;
      staging_ = client::ShmStagingFile::Open(client_->StagingSource(*slots),
                                              slots->staging_size_bytes(), &err);
      if (staging_ == nullptr) {
        failed = absl::InternalError(err);
        break;
      }
    }
    req.Clear();
    req.set_profile_id(profile_id);
    for (uint64_t i = first; i < end; ++i) {
      const v1::SlotRef& slot = slots->slots(static_cast<int>(i - first));
      std::span<std::byte> dst = staging_->Slot(slot.offset_bytes(), slot.size_bytes());
      if (dst.size() != size) {
        failed = absl::InternalError(
            absl::StrCat("staging slot of block ", i, " is ", dst.size(), " bytes, not ", size));
        break;
      }
      std::memcpy(dst.data(), ws.src(i), size);
      v1::BlockPut* b = req.add_blocks();
      b->set_block_id(ids[i]);
      *b->mutable_slot() = slot;
    }
    if (failed.ok() && !writer->Write(req)) break;
  }
  writer->WritesDone();
  grpc::Status st = writer->Finish();
  if (!failed.ok()) return failed;
  if (!st.ok()) return FromGrpcStatus(st);
  return CheckPut(resp, n);
}

absl::Status KvtierPaths::GetHandles(uint64_t profile_id, WorkingSet* ws,
                                     const std::vector<std::string>& ids, uint32_t batch) {
  const uint64_t n = ids.size();
  const uint64_t size = ws->block_bytes();
  v1::GetBlocksResponse resp;
  for (uint64_t first = 0; first < n; first += batch) {
    const uint64_t end = std::min<uint64_t>(n, first + batch);
    v1::GetBlocksRequest req;
    req.set_profile_id(profile_id);
    req.set_mode(v1::RETURN_MODE_HANDLES);
    for (uint64_t i = first; i < end; ++i) req.add_block_ids(ids[i]);
    grpc::ClientContext ctx;
    SetStreamDeadline(&ctx);
    auto reader = client_->kvtier_stub()->GetBlocks(&ctx, req);
    uint64_t next = first;
    uint64_t lease = 0;
    absl::Status item;
    while (reader->Read(&resp)) {
      if (resp.lease_id() != 0) lease = resp.lease_id();
      for (const v1::BlockResult& r : resp.results()) {
        if (!item.ok()) continue;
        if (next >= end) {
          item = absl::InternalError("GetBlocks returned more results than ids");
          continue;
        }
        if (r.status().code() != 0) {
          item = ItemError("GetBlocks(HANDLES)", next, r.status());
          continue;
        }
        const v1::BlockHandle& h = r.handle();
        std::span<const std::byte> src = arena_->Slot(h.offset_bytes(), h.size_bytes());
        if (h.arena_id() != arena_id_ || src.size() != size) {
          item = absl::InternalError(absl::StrCat("GetBlocks(HANDLES): block ", next,
                                                  " has a handle outside the mapped arena"));
          continue;
        }
        std::memcpy(ws->dst(next++), src.data(), size);
      }
    }
    grpc::Status st = reader->Finish();
    if (lease != 0) {
      v1::ReleaseRequest release;
      release.set_lease_id(lease);
      auto released = client_->Release(release);
      if (!released.ok() && item.ok()) item = released.status();
    }
    if (!st.ok()) return FromGrpcStatus(st);
    if (!item.ok()) return item;
    if (next != end) {
      return absl::InternalError(absl::StrCat("GetBlocks(HANDLES) returned ", next - first, " of ",
                                              end - first, " blocks"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> KvtierPaths::SummaryBytes(uint64_t profile_id, const std::string& id) {
  std::vector<BlockKey> missing;
  const std::vector<std::string> summaries = server_->runtime()->store()->GetSummaries(
      {BlockKey{daemon::kDefaultTenant, profile_id, id}}, &missing);
  if (!missing.empty() || summaries.size() != 1) {
    return absl::NotFoundError("SummaryBytes: block is not stored");
  }
  return summaries[0].size();
}

absl::Status KvtierPaths::Delete(uint64_t profile_id, const std::vector<std::string>& ids) {
  const uint64_t chunk = options_.max_batch_blocks;
  for (uint64_t first = 0; first < ids.size(); first += chunk) {
    v1::DeleteBlocksRequest req;
    req.set_profile_id(profile_id);
    for (uint64_t i = first; i < std::min<uint64_t>(ids.size(), first + chunk); ++i) {
      req.add_block_ids(ids[i]);
    }
    auto resp = client_->DeleteBlocks(req);
    if (!resp.ok()) return resp.status();
    for (int i = 0; i < resp->statuses_size(); ++i) {
      if (resp->statuses(i).code() != 0) {
        return ItemError("DeleteBlocks", first + i, resp->statuses(i));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kvtier::bench
