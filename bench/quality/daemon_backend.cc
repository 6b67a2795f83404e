#include "bench/quality/daemon_backend.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "bench/quality/methods.h"
#include "client/client.h"
#include "daemon/config.h"
#include "daemon/options.h"
#include "daemon/server.h"

namespace kvtier::quality {
namespace {

v1::Scorer ToProto(index::ScorerKind k) {
  switch (k) {
    case index::ScorerKind::kKeyKey:
      return v1::SCORER_KEY_KEY;
    case index::ScorerKind::kKeyKeyWeighted:
      return v1::SCORER_KEY_KEY_WEIGHTED;
    case index::ScorerKind::kQuest:
      return v1::SCORER_QUEST;
    case index::ScorerKind::kArkVale:
      return v1::SCORER_ARKVALE;
    case index::ScorerKind::kKeyDiff:
      return v1::SCORER_KEYDIFF;
    case index::ScorerKind::kRecency:
      return v1::SCORER_RECENCY;
    case index::ScorerKind::kRandom:
      return v1::SCORER_RANDOM;
    case index::ScorerKind::kMass:
      return v1::SCORER_MASS;
  }
  return v1::SCORER_UNSPECIFIED;
}

// Where a daemon keeps its files, and how big its tiers are: the only
// settings a shipped-defaults daemon gets.
std::vector<std::string> Housekeeping(const std::string& data_dir) {
  return {
      "server.data_dir=" + data_dir,
      // Shared-memory files inside the data folder, removed with it.
      "tiers.device.shm_dir=" + data_dir,
      "tiers.host.shm_dir=" + data_dir,
      "log.level=warn",
      "server.shutdown_grace_ms=1000",
      "tiers.device.capacity_bytes=64MiB",
      "tiers.host.capacity_bytes=64MiB",
      "tiers.host.staging_bytes=1MiB",
      "tiers.nvme.file_count=1",
      "tiers.nvme.file_size_bytes=64MiB",
      "tiers.nvme.io_threads=1",
      "leases.default_ttl_ms=600000",
  };
}

// The daemon settings that make its Selector equal to config's.
std::vector<std::string> Overrides(const BackendConfig& c, const std::string& data_dir) {
  std::vector<std::string> out = Housekeeping(data_dir);
  if (c.shipped_defaults) return out;
  const index::SelectorOptions& s = c.selector;
  const bool weighted = c.scorer == index::ScorerKind::kKeyKeyWeighted;
  std::vector<std::string> more = {
      absl::StrCat("index.summary_encoding=",
                   c.codec.encoding == index::SummaryEncoding::kFp32 ? "fp32" : "fp16"),
      absl::StrCat("index.summary_bounds=", c.summary_bounds ? "true" : "false"),
      absl::StrCat("index.summary_weighted=", weighted ? "true" : "false"),
      absl::StrCat("index.summary_per_layer=", c.summary_per_layer ? "true" : "false"),
      absl::StrCat("index.summary_layer_encoding=", c.codec.layer_int8 ? "int8" : "float"),
      absl::StrCat("index.keep_summaries=", c.tree.keep_summaries ? "true" : "false"),
      absl::StrCat("select.stability_scorers=", c.stability ? index::ScorerName(c.scorer) : ""),
      absl::StrCat("select.keykey_centered=", c.centered ? "true" : "false"),
      absl::StrCat("select.keykey_recency_weight=", c.recency_weight),
      // Contexts are built for the default scorer (plain or weighted tree).
      absl::StrCat("select.default_scorer=", index::ScorerName(c.scorer)),
      absl::StrCat("index.pages_per_chunk=", c.tree.pages_per_chunk),
      absl::StrCat("index.chunks_per_grid=", c.tree.chunks_per_grid),
      absl::StrCat("select.grid_keep_fraction=", s.grid_keep_fraction),
      absl::StrCat("select.chunk_keep_fraction=", s.chunk_keep_fraction),
      absl::StrCat("select.page_keep_fraction=", s.page_keep_fraction),
      absl::StrCat("select.sink_blocks=", s.sink_blocks),
      absl::StrCat("select.local_blocks=", s.local_blocks),
      absl::StrCat("select.window_steps=", s.stability.window_steps),
      absl::StrCat("select.theta=", s.stability.theta),
      absl::StrCat("select.stability_weight=", s.stability.weight),
      absl::StrCat("select.hold_threshold=", s.stability.hold_threshold),
  };
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

// In-process daemons, one per distinct configuration, shared by every
// backend of the process (each opens its own context) until
// StopInProcessDaemons.
struct SharedServer {
  std::unique_ptr<daemon::Server> server;
  std::string dir;
  ~SharedServer() {
    server.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

std::mutex& ServersMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
std::map<std::string, std::unique_ptr<SharedServer>>& Servers() {
  static auto* servers = new std::map<std::string, std::unique_ptr<SharedServer>>;
  return *servers;
}

absl::StatusOr<std::string> InProcessSocket(const BackendConfig& c) {
  static std::atomic<int> counter{0};
  std::string key;
  for (const std::string& o : Overrides(c, "")) absl::StrAppend(&key, o, ";");
  std::lock_guard<std::mutex> lock(ServersMutex());
  auto it = Servers().find(key);
  if (it != Servers().end()) return it->second->server->socket_path();
  auto shared = std::make_unique<SharedServer>();
  shared->dir = absl::StrCat(std::filesystem::temp_directory_path().string(), "/kvtier-eval-",
                             ::getpid(), "-", counter++);
  std::filesystem::remove_all(shared->dir);
  std::error_code ec;
  std::filesystem::create_directories(shared->dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot create ", shared->dir, ": ", ec.message()));
  }
  absl::StatusOr<daemon::Config> config = daemon::LoadConfig("", Overrides(c, shared->dir));
  if (!config.ok()) return config.status();
  absl::StatusOr<std::unique_ptr<daemon::Server>> server = daemon::Server::Start(*config);
  if (!server.ok()) return server.status();
  shared->server = std::move(*server);
  const std::string socket = shared->server->socket_path();
  Servers().emplace(key, std::move(shared));
  return socket;
}

class DaemonBackend final : public SelectionBackend {
 public:
  explicit DaemonBackend(const BackendConfig& config) : config_(config) {}

  ~DaemonBackend() override {
    if (stream_ != nullptr) {
      stream_->WritesDone();
      stream_->Finish();
    }
    if (context_id_ != 0) {
      grpc::ClientContext ctx;
      v1::CloseContextRequest req;
      req.set_context_id(context_id_);
      v1::CloseContextResponse resp;
      client_->kvtier_stub()->CloseContext(&ctx, req, &resp);
    }
  }

  absl::Status Connect(const std::string& endpoint) {
    std::string target = endpoint;
    if (endpoint == "inprocess") {
      absl::StatusOr<std::string> socket = InProcessSocket(config_);
      if (!socket.ok()) return socket.status();
      target = *socket;
    }
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(target);
    if (!client.ok()) return client.status();
    client_ = std::move(*client);
    v1::ModelProfile p;
    p.set_name("kvtier-eval");
    p.set_revision("1");
    p.set_num_layers(config_.layout.num_layers);
    p.set_num_kv_heads(config_.layout.num_kv_heads);
    p.set_head_dim(config_.layout.head_dim);
    p.set_block_size_tokens(config_.layout.block_size_tokens);
    p.set_dtype(v1::DTYPE_FP16);
    if (config_.calibration.calibrated()) {
      *p.mutable_calibration() = CalibrationToProto(config_.calibration);
      // One profile per calibration (a calibration is part of the profile).
      p.set_revision(
          absl::StrCat("1-", std::hash<std::string>()(p.calibration().SerializeAsString())));
    }
    absl::StatusOr<v1::RegisterProfileResponse> r = client_->RegisterProfile(p);
    if (!r.ok()) return r.status();
    profile_id_ = r->profile_id();
    return absl::OkStatus();
  }

  absl::Status Open(absl::Span<const std::string> payloads) override {
    v1::OpenContextRequest req;
    req.set_profile_id(profile_id_);
    req.set_lease_ttl_ms(600000);
    v1::Segment* seg = req.add_segments();
    std::vector<std::string> ids;
    for (const std::string& p : payloads) ids.push_back(BlockId(p));
    if (absl::Status s = Put(payloads, ids); !s.ok()) return s;
    for (const std::string& id : ids) seg->add_block_ids(id);
    grpc::ClientContext ctx;
    v1::OpenContextResponse resp;
    grpc::Status st = client_->kvtier_stub()->OpenContext(&ctx, req, &resp);
    if (!st.ok()) return FromGrpcStatus(st);
    context_id_ = resp.context_id();
    num_blocks_ = resp.num_blocks();
    return RefreshWeights();
  }

  absl::Status Append(absl::string_view payload) override {
    const std::string id = BlockId(payload);
    const std::string data(payload);
    if (absl::Status s = Put(absl::MakeConstSpan(&data, 1), {id}); !s.ok()) {
      return s;
    }
    grpc::ClientContext ctx;
    v1::AppendBlocksRequest req;
    req.set_context_id(context_id_);
    req.add_block_ids(id);
    v1::AppendBlocksResponse resp;
    grpc::Status st = client_->kvtier_stub()->AppendBlocks(&ctx, req, &resp);
    if (!st.ok()) return FromGrpcStatus(st);
    num_blocks_ = resp.num_blocks();
    return RefreshWeights();
  }

  int64_t num_blocks() const override { return num_blocks_; }
  const index::HeadWeights& head_weights() const override { return weights_; }

  absl::Status Select(const BackendSelect& r, std::vector<int64_t>* blocks) override {
    if (stream_ == nullptr) {
      stream_ctx_ = std::make_unique<grpc::ClientContext>();
      stream_ = client_->kvtier_stub()->Select(stream_ctx_.get());
    }
    v1::SelectRequest req;
    req.set_request_id(++request_id_);
    v1::ContextSelect* e = req.add_contexts();
    e->set_context_id(context_id_);
    for (float x : r.anchor) e->add_anchor(x);
    if (config_.scorer == index::ScorerKind::kQuest ||
        config_.scorer == index::ScorerKind::kArkVale) {
      for (float x : r.query) e->add_query(x);
    }
    for (float x : r.head_queries) e->add_head_queries(x);
    // A shipped-defaults daemon is asked as an engine would: its default.
    e->set_scorer(config_.shipped_defaults ? v1::SCORER_UNSPECIFIED : ToProto(config_.scorer));
    e->set_max_blocks(static_cast<uint32_t>(r.budget_blocks));
    e->set_step(static_cast<uint64_t>(r.step));
    v1::SelectResponse resp;
    if (!stream_->Write(req) || !stream_->Read(&resp)) {
      grpc::Status st = stream_->Finish();
      stream_.reset();
      return st.ok() ? absl::UnavailableError("Select stream closed") : FromGrpcStatus(st);
    }
    if (resp.contexts_size() != 1) {
      return absl::InternalError("Select answered no context");
    }
    const v1::ContextSelection& sel = resp.contexts(0);
    if (sel.status().code() != 0) {
      return absl::Status(static_cast<absl::StatusCode>(sel.status().code()),
                          absl::StrCat("kvtierd Select: ", sel.status().message()));
    }
    blocks->clear();
    for (const v1::SelectedBlock& b : sel.blocks()) {
      blocks->push_back(b.position());
    }
    std::sort(blocks->begin(), blocks->end());
    return absl::OkStatus();
  }

 private:
  // Content-derived ids: equal payloads share one stored block.
  static std::string BlockId(absl::string_view payload) {
    char buf[40];
    std::snprintf(buf, sizeof(buf), "q%016zx-%zu",
                  std::hash<std::string_view>()(std::string_view(payload.data(), payload.size())),
                  payload.size());
    return buf;
  }

  absl::Status Put(absl::Span<const std::string> payloads, const std::vector<std::string>& ids) {
    std::vector<v1::PutBlocksRequest> reqs(1);
    for (size_t i = 0; i < payloads.size(); ++i) {
      if (reqs.back().blocks_size() == 32) reqs.emplace_back();
      reqs.back().set_profile_id(profile_id_);
      v1::BlockPut* b = reqs.back().add_blocks();
      b->set_block_id(ids[i]);
      b->set_data(payloads[i]);
    }
    absl::StatusOr<v1::PutBlocksResponse> r = client_->PutBlocks(reqs);
    if (!r.ok()) return r.status();
    for (const auto& res : r->results()) {
      // ALREADY_EXISTS: other bytes under this id (a hash collision).
      const int code = res.status().code();
      if (code != 0) {
        return absl::Status(static_cast<absl::StatusCode>(code),
                            absl::StrCat("kvtierd PutBlocks: ", res.status().message()));
      }
    }
    return absl::OkStatus();
  }

  absl::Status RefreshWeights() {
    absl::StatusOr<v1::GetProfileResponse> p = client_->GetProfile(profile_id_);
    if (!p.ok()) return p.status();
    weights_.num_layers = config_.layout.num_layers;
    weights_.num_kv_heads = config_.layout.num_kv_heads;
    weights_.version = static_cast<uint32_t>(p->head_weights_version());
    weights_.weights.assign(p->head_weights().begin(), p->head_weights().end());
    if (weights_.weights.empty()) {
      weights_.weights.assign(static_cast<size_t>(weights_.num_layers) * weights_.num_kv_heads,
                              1.0f);
    }
    return absl::OkStatus();
  }

  const BackendConfig config_;
  std::unique_ptr<Client> client_;
  uint64_t profile_id_ = 0;
  uint64_t context_id_ = 0;
  int64_t num_blocks_ = 0;
  uint64_t request_id_ = 0;
  index::HeadWeights weights_;
  std::unique_ptr<grpc::ClientContext> stream_ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SelectRequest, v1::SelectResponse>> stream_;
};

}  // namespace

v1::SelectionCalibration CalibrationToProto(const index::SelectionCalibration& c) {
  v1::SelectionCalibration p;
  p.set_num_q_heads(static_cast<uint32_t>(c.num_q_heads));
  for (const index::HeadRef& h : c.retrieval_heads) {
    v1::HeadRef* r = p.add_retrieval_heads();
    r->set_layer(static_cast<uint32_t>(h.layer));
    r->set_q_head(static_cast<uint32_t>(h.q_head));
  }
  for (float x : c.prior) p.add_prior(x);
  for (float x : c.prior_all) p.add_prior_all(x);
  for (float x : c.head_weights) p.add_head_weights(x);
  p.set_softmax_scale(c.softmax_scale);
  p.set_head_min_mass(c.head_min_mass);
  if (c.sink_blocks >= 0) p.set_sink_blocks(static_cast<uint32_t>(c.sink_blocks));
  if (c.local_blocks >= 0) p.set_local_blocks(static_cast<uint32_t>(c.local_blocks));
  if (c.retrieval_share != 1.0f) p.set_retrieval_share(c.retrieval_share);
  if (c.sink_mass >= 0) p.set_sink_mass(c.sink_mass);
  if (c.sink_mass_all >= 0) p.set_sink_mass_all(c.sink_mass_all);
  if (c.copy_run != 0) {
    p.set_copy_run(static_cast<uint32_t>(c.copy_run));
    p.set_copy_hold(static_cast<uint32_t>(c.copy_hold));
    p.set_copy_min_blocks(static_cast<uint32_t>(c.copy_min_blocks));
    if (c.copy_min_mass >= 0) p.set_copy_min_mass(c.copy_min_mass);
    p.set_uncopied_weight(c.uncopied_weight);
    p.set_copy_lead(static_cast<uint32_t>(c.copy_lead));
    p.set_copy_weight(c.copy_weight);
  }
  return p;
}

absl::StatusOr<BackendConfig> ShippedDefaults(const index::BlockLayout& layout) {
  absl::StatusOr<daemon::Config> config = daemon::LoadConfig("", {});
  if (!config.ok()) return config.status();
  BackendConfig c;
  c.layout = layout;
  c.selector = daemon::SelectorOptionsOf(*config);
  c.scorer = config->select.default_scorer;
  const daemon::ContextManagerOptions contexts = daemon::ContextManagerOptionsOf(*config);
  c.tree.pages_per_chunk = contexts.pages_per_chunk;
  c.tree.chunks_per_grid = contexts.chunks_per_grid;
  c.tree.keep_summaries = contexts.keep_summaries;
  const daemon::SummarizerOptions summaries = daemon::SummarizerOptionsOf(*config);
  c.summary_bounds = summaries.bounds;
  c.summary_per_layer = summaries.per_layer && contexts.keep_layer_means;
  c.codec.encoding = summaries.encoding;
  c.codec.layer_int8 = summaries.layer_int8;
  c.stability = (daemon::StabilityScorersOf(*config) >> static_cast<uint32_t>(c.scorer)) & 1u;
  c.centered = config->select.keykey_centered;
  c.recency_weight = static_cast<float>(config->select.keykey_recency_weight);
  c.shipped_defaults = true;
  return c;
}

void InstallDaemonBackend() {
  SetDaemonBackendFactory(&MakeKvtierdBackend);
  SetShippedDefaultsFactory(&ShippedDefaults);
}

void StopInProcessDaemons() {
  std::lock_guard<std::mutex> lock(ServersMutex());
  Servers().clear();
}

absl::StatusOr<std::unique_ptr<SelectionBackend>> MakeKvtierdBackend(const BackendConfig& config,
                                                                     const std::string& endpoint) {
  auto b = std::make_unique<DaemonBackend>(config);
  if (absl::Status s = b->Connect(endpoint); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("end-to-end mode (", endpoint, "): ", s.message()));
  }
  return std::unique_ptr<SelectionBackend>(std::move(b));
}

}  // namespace kvtier::quality
