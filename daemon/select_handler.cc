#include "daemon/select_handler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/grpc_status.h"

namespace kvtier::daemon {
namespace {

std::string Field(int i, const char* name) { return absl::StrCat("contexts[", i, "].", name); }

// The same name in a buffer on the stack: the checks that run for every
// entry of every request take their field name this way, so a request
// that passes them allocates no strings (only an error message uses it).
class FieldName {
 public:
  FieldName(int i, const char* name) {
    std::snprintf(buf_, sizeof(buf_), "contexts[%d].%s", i, name);
  }
  const char* c_str() const { return buf_; }

 private:
  char buf_[48];  // "contexts[" + 10 digits + "]." + the longest name, 14
};

absl::StatusOr<index::ScorerKind> ScorerOf(v1::Scorer scorer, index::ScorerKind default_kind,
                                           int i) {
  switch (scorer) {
    case v1::SCORER_UNSPECIFIED:
      return default_kind;
    case v1::SCORER_KEY_KEY:
      return index::ScorerKind::kKeyKey;
    case v1::SCORER_KEY_KEY_WEIGHTED:
      return index::ScorerKind::kKeyKeyWeighted;
    case v1::SCORER_QUEST:
      return index::ScorerKind::kQuest;
    case v1::SCORER_ARKVALE:
      return index::ScorerKind::kArkVale;
    case v1::SCORER_KEYDIFF:
      return index::ScorerKind::kKeyDiff;
    case v1::SCORER_RECENCY:
      return index::ScorerKind::kRecency;
    case v1::SCORER_RANDOM:
      return index::ScorerKind::kRandom;
    case v1::SCORER_MASS:
      return index::ScorerKind::kMass;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(Field(i, "scorer"), ": unknown value ", static_cast<int>(scorer)));
  }
}

bool IsKeyKey(index::ScorerKind kind) {
  return kind == index::ScorerKind::kKeyKey || kind == index::ScorerKind::kKeyKeyWeighted;
}
bool NeedsQuery(index::ScorerKind kind) {
  return kind == index::ScorerKind::kQuest || kind == index::ScorerKind::kArkVale;
}

// Finite values, no row of `row_len` values all zero.
absl::Status CheckRows(const google::protobuf::RepeatedField<float>& v, int row_len,
                       const char* field) {
  for (int d = 0; d < v.size(); ++d) {
    if (!std::isfinite(v[d])) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", d, "]: ", v[d], " is not finite"));
    }
  }
  for (int row = 0; row * row_len < v.size(); ++row) {
    bool zero = true;
    for (int d = row * row_len; d < (row + 1) * row_len; ++d) zero &= v[d] == 0.0f;
    if (zero) {
      return absl::InvalidArgumentError(
          v.size() == row_len ? absl::StrCat(field, ": all zero")
                              : absl::StrCat(field, ": row ", row, " (values ", row * row_len, "..",
                                             (row + 1) * row_len - 1, ") is all zero"));
    }
  }
  return absl::OkStatus();
}

// The anchor: head_dim values (pooled) or num_layers * head_dim (per
// layer, when the daemon keeps per-layer means). Empty is fine unless
// required.
absl::Status CheckAnchor(const google::protobuf::RepeatedField<float>& v,
                         const ModelProfile& profile, bool per_layer, bool required,
                         const char* field) {
  const int dim = static_cast<int>(profile.head_dim);
  const int layered = static_cast<int>(profile.layers) * dim;
  if (v.empty() && !required) return absl::OkStatus();
  if (v.size() != dim && !(per_layer && v.size() == layered)) {
    const std::string sizes =
        per_layer ? absl::StrCat(dim, " (pooled over layers and KV heads) or ", layered, " (",
                                 profile.layers, " layers x ", dim, ", per layer)")
                  : absl::StrCat(dim, " (pooled over layers and KV heads; per-layer anchors of ",
                                 layered, " need index.summary_per_layer = true)");
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", v.size(), " values",
                                                   v.empty() ? " (required by this scorer)" : "",
                                                   "; expected ", sizes));
  }
  return CheckRows(v, dim, field);
}

// An optional query of head_dim values.
absl::Status CheckQuery(const google::protobuf::RepeatedField<float>& v, uint32_t head_dim,
                        bool required, const char* field) {
  if (v.empty() && !required) return absl::OkStatus();
  if (static_cast<uint32_t>(v.size()) != head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", v.size(), " values", v.empty() ? " (required by this scorer)" : "",
        "; expected the profile's head_dim, ", head_dim));
  }
  return CheckRows(v, static_cast<int>(head_dim), field);
}

// head_queries: empty, or one head_dim row per retrieval head.
absl::Status CheckHeadQueries(const google::protobuf::RepeatedField<float>& v,
                              const ModelProfile& profile, int32_t heads, const char* field) {
  if (v.empty()) return absl::OkStatus();
  const int dim = static_cast<int>(profile.head_dim);
  if (heads == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", v.size(), " values, but profile ", profile.profile_id,
                     " has no calibration with retrieval heads (send none)"));
  }
  if (v.size() != heads * dim) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", v.size(), " values; expected ",
                                                   heads * dim, " (", heads, " retrieval heads x ",
                                                   dim, ") or none"));
  }
  return CheckRows(v, dim, field);
}

// Microseconds since *t; moves *t to now.
double Lap(std::chrono::steady_clock::time_point* t) {
  const auto now = std::chrono::steady_clock::now();
  const double us = std::chrono::duration<double, std::micro>(now - *t).count();
  *t = now;
  return us;
}

// Holds several mutexes for one scope: locked in the order given (callers
// sort them by context id, so two batches naming the same contexts never
// wait on each other) and unlocked in reverse order when the scope ends.
// Clang's -Wthread-safety cannot follow a set whose size is known only at
// run time; the methods that run inside the scope say so in their contract.
class OrderedMutexLocks {
 public:
  // mus must outlive the object and not change meanwhile.
  explicit OrderedMutexLocks(absl::Span<absl::Mutex* const> mus) : mus_(mus) {
    for (absl::Mutex* mu : mus_) mu->Lock();
  }
  ~OrderedMutexLocks() {
    for (auto it = mus_.rbegin(); it != mus_.rend(); ++it) (*it)->Unlock();
  }
  OrderedMutexLocks(const OrderedMutexLocks&) = delete;
  OrderedMutexLocks& operator=(const OrderedMutexLocks&) = delete;

 private:
  const absl::Span<absl::Mutex* const> mus_;
};

}  // namespace

struct SelectHandler::Item {
  int entry = -1;
  std::shared_ptr<Context> ctx;
  index::ScorerKind scorer = index::ScorerKind::kKeyKey;
  int64_t budget_blocks = 0;
  absl::Status status;
  index::SelectRequest request;
  size_t result = 0;           // index into results_
  std::vector<BlockKey> keys;  // the chosen blocks
  std::vector<absl::StatusOr<DeviceHandle>> handles;
  uint64_t lease = 0;  // pins the chosen blocks (Pin)
  uint32_t pinned = 0;

  // For a new request; keeps the vectors' capacity.
  void Reset() {
    entry = -1;
    ctx.reset();
    status = absl::OkStatus();
    result = 0;
    handles.clear();
    lease = 0;
    pinned = 0;
  }
};

absl::StatusOr<std::unique_ptr<SelectHandler>> SelectHandler::Create(Runtime* runtime,
                                                                     std::string tenant) {
  // Each tenant's Selectors share one lane of the helper pool, so a tenant
  // flooding Select holds helpers only until they finish their calls.
  index::SelectorOptions options = runtime->selector_options();
  options.pool_lane = std::hash<std::string>{}(tenant);
  absl::StatusOr<std::unique_ptr<index::Selector>> selector = index::Selector::Create(options);
  if (!selector.ok()) return selector.status();
  return std::unique_ptr<SelectHandler>(
      new SelectHandler(runtime, std::move(tenant), std::move(*selector)));
}

SelectHandler::SelectHandler(Runtime* runtime, std::string tenant,
                             std::unique_ptr<index::Selector> selector)
    : runtime_(runtime), tenant_(std::move(tenant)), selector_(std::move(selector)) {}

SelectHandler::~SelectHandler() = default;

uint64_t SelectHandler::Cost(const v1::SelectRequest& request) const {
  uint64_t blocks = 0;
  for (const v1::ContextSelect& entry : request.contexts()) {
    absl::StatusOr<std::shared_ptr<Context>> ctx =
        runtime_->contexts()->Find(tenant_, entry.context_id());
    blocks += ctx.ok() ? std::max<uint64_t>(1, (*ctx)->num_blocks_snapshot()) : 1;
  }
  return 64 * std::max<uint64_t>(1, blocks);
}

absl::Status SelectHandler::Check(const v1::ContextSelect& entry, int i, Item* item) {
  const Config& config = runtime_->config();
  const FieldName id_field(i, "context_id");
  absl::StatusOr<std::shared_ptr<Context>> ctx =
      runtime_->contexts()->Find(tenant_, entry.context_id(), id_field.c_str());
  if (!ctx.ok()) return ctx.status();
  item->ctx = std::move(*ctx);
  absl::StatusOr<index::ScorerKind> scorer =
      ScorerOf(entry.scorer(), runtime_->default_scorer(), i);
  if (!scorer.ok()) return scorer.status();
  item->scorer = *scorer;
  if (entry.wait_ms() > kMaxSelectWaitMs) {
    return absl::InvalidArgumentError(absl::StrCat(Field(i, "wait_ms"), ": ", entry.wait_ms(),
                                                   " exceeds the limit of ", kMaxSelectWaitMs));
  }

  const ModelProfile& profile = item->ctx->profile();
  const uint64_t max_blocks = config.limits.max_batch_blocks;
  switch (entry.budget_case()) {
    case v1::ContextSelect::kMaxBlocks:
      if (entry.max_blocks() == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(Field(i, "max_blocks"), ": 0; the budget must be at least 1 block"));
      }
      item->budget_blocks = entry.max_blocks();
      break;
    case v1::ContextSelect::kMaxTokens:
      item->budget_blocks = entry.max_tokens() / profile.block_size_tokens;
      if (item->budget_blocks == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            Field(i, "max_tokens"), ": ", entry.max_tokens(), " tokens are less than one block (",
            profile.block_size_tokens, " tokens)"));
      }
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(Field(i, "max_blocks"), ": no budget; set max_blocks or max_tokens"));
  }
  if (static_cast<uint64_t>(item->budget_blocks) > max_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat(Field(i, entry.has_max_tokens() ? "max_tokens" : "max_blocks"), ": ",
                     item->budget_blocks, " blocks exceed limits.max_batch_blocks = ", max_blocks));
  }
  if (absl::Status st = CheckAnchor(entry.anchor(), profile, config.index.summary_per_layer,
                                    IsKeyKey(item->scorer), FieldName(i, "anchor").c_str());
      !st.ok()) {
    return st;
  }
  if (absl::Status st = CheckQuery(entry.query(), profile.head_dim, NeedsQuery(item->scorer),
                                   FieldName(i, "query").c_str());
      !st.ok()) {
    return st;
  }
  if (entry.has_recency_weight() &&
      !(entry.recency_weight() >= 0.0f && entry.recency_weight() <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(Field(i, "recency_weight"), ": ",
                                                   entry.recency_weight(), " is not in [0, 1]"));
  }
  return CheckHeadQueries(entry.head_queries(), profile, item->ctx->num_retrieval_heads(),
                          FieldName(i, "head_queries").c_str());
}

absl::Status SelectHandler::Prepare(const v1::ContextSelect& entry, int i, Item* item) {
  Context* ctx = item->ctx.get();
  ctx->mu.AssertHeld();  // one of the batch's OrderedMutexLocks
  if (ctx->closed()) return NotOpen(FieldName(i, "context_id").c_str(), ctx->id());
  const FieldName step_field(i, "step");
  absl::StatusOr<int64_t> step = ctx->ResolveStep(entry.step(), step_field.c_str());
  if (!step.ok()) return step.status();
  // The profile's calibration may set its own sink and local blocks.
  const index::SelectorOptions& options = selector_->options();
  const index::SelectionCalibration& cal = ctx->index().calibration();
  const bool mass = item->scorer == index::ScorerKind::kMass;
  const bool own = mass && (cal.sink_blocks >= 0 || cal.local_blocks >= 0);
  const int64_t sinks = mass && cal.sink_blocks >= 0 ? cal.sink_blocks : options.sink_blocks;
  const int64_t locals = mass && cal.local_blocks >= 0 ? cal.local_blocks : options.local_blocks;
  const int64_t forced = std::min<int64_t>(ctx->num_blocks(), sinks + locals);
  if (item->budget_blocks < forced) {
    return absl::InvalidArgumentError(absl::StrCat(
        Field(i, entry.has_max_tokens() ? "max_tokens" : "max_blocks"), ": ", item->budget_blocks,
        " blocks are fewer than the always-selected sink and local blocks (",
        own ? "the profile's calibration" : "select.sink_blocks + select.local_blocks",
        ") = ", forced));
  }
  const index::TreeOptions& tree = ctx->index().tree().options();
  if (IsKeyKey(item->scorer) && (item->scorer == index::ScorerKind::kKeyKeyWeighted) !=
                                    (tree.vector == index::TreeVector::kWeightedMean)) {
    return absl::FailedPreconditionError(absl::StrCat(
        Field(i, "scorer"), ": ", index::ScorerName(item->scorer),
        " needs contexts built for it; this daemon builds them for select.default_scorer = ",
        index::ScorerName(runtime_->config().select.default_scorer)));
  }
  if (NeedsQuery(item->scorer) &&
      (!tree.keep_summaries || ctx->index().tree().summaries().min == nullptr)) {
    return absl::FailedPreconditionError(
        absl::StrCat(Field(i, "scorer"), ": ", index::ScorerName(item->scorer),
                     " needs index.keep_summaries = true and index.summary_bounds = true"));
  }
  index::SelectRequest& r = item->request;
  r = index::SelectRequest();
  r.context = &ctx->index();
  r.anchor = absl::MakeConstSpan(entry.anchor().data(), entry.anchor_size());
  r.query = absl::MakeConstSpan(entry.query().data(), entry.query_size());
  r.scorer = item->scorer;
  if (item->scorer == index::ScorerKind::kMass) {
    r.head_queries = absl::MakeConstSpan(entry.head_queries().data(), entry.head_queries_size());
  }
  const Config::Select& select = runtime_->config().select;
  r.stability = runtime_->uses_stability(item->scorer);
  r.centered = entry.has_centered() ? entry.centered() : select.keykey_centered;
  r.recency_weight = entry.has_recency_weight() ? entry.recency_weight()
                                                : static_cast<float>(select.keykey_recency_weight);
  r.budget_blocks = item->budget_blocks;
  r.step = *step;
  r.seed = ctx->id();
  return absl::OkStatus();
}

void SelectHandler::Collect(Item* item, v1::ContextSelection* out,
                            std::vector<BlockKey>* prefetch) {
  Context* ctx = item->ctx.get();
  ctx->mu.AssertHeld();  // one of the batch's OrderedMutexLocks
  const index::SelectResult& result = results_[item->result];
  // item->keys keeps its capacity (and its strings') across calls.
  std::vector<BlockKey>& keys = item->keys;
  keys.resize(result.blocks.size());
  for (size_t k = 0; k < result.blocks.size(); ++k) {
    keys[k].tenant.assign(ctx->tenant());
    keys[k].profile_id = ctx->profile().profile_id;
    const absl::string_view id = ctx->block_id(result.blocks[k]);
    keys[k].block_id.assign(id.data(), id.size());
  }
  const int32_t window = selector_->options().stability.window_steps;
  const index::StabilityTracker& stability = ctx->index().stability();
  for (size_t k = 0; k < result.blocks.size(); ++k) {
    const int64_t p = result.blocks[k];
    v1::SelectedBlock* b = out->add_blocks();
    b->set_position(static_cast<uint32_t>(p));
    b->set_block_id(keys[k].block_id);
    b->set_score(result.scores[k]);
    b->set_stability(p < stability.num_pages() ? stability.Stability(p, window) : 0.0f);
  }
  // Rising blocks stay rising for several steps: only those not handed to
  // the prefetcher at the previous step are.
  for (int64_t p : ctx->NewPrefetch(result.prefetch)) prefetch->push_back(ctx->KeyAt(p));
  selected_blocks_ += result.blocks.size();
  new_blocks_ += ctx->CountNewSelected(result.blocks);
  mass_.reused += static_cast<uint64_t>(result.mass_heads_reused);
  mass_.descended += static_cast<uint64_t>(result.mass_heads_descended);
  mass_.opened += static_cast<uint64_t>(result.mass_pages_opened);
}

void SelectHandler::Pin(const v1::ContextSelect& entry, absl::Time deadline, Item* item,
                        v1::ContextSelection* out, LaterWork* later) {
  std::vector<BlockKey>* prefetch = &later->prefetch;
  std::vector<BlockKey>* deferred = &later->deferred;
  Context* ctx = item->ctx.get();
  BlockStore* store = runtime_->store();
  const std::vector<BlockKey>& keys = item->keys;
  std::vector<absl::StatusOr<DeviceHandle>>& handles = item->handles;
  // No disk I/O on this thread: blocks on NVMe only are brought into host
  // memory by the prefetcher. With wait_ms the call waits for that (until
  // the entry's deadline); otherwise they come back PENDING ("on its way")
  // and are promoted from memory at a later step. With a remote tier, blocks
  // no local tier holds are fetched by the prefetcher the same way. No
  // context lock is held here, so appends and other contexts' Selects go on
  // meanwhile.
  Prefetcher* prefetcher = runtime_->prefetcher();
  if (entry.wait_ms() > 0) {
    const bool remote = runtime_->remote() != nullptr;
    std::vector<BlockKey> on_nvme;
    for (const BlockKey& key : keys) {
      const BlockLocation loc = store->Lookup(key);
      if (loc.present ? loc.tier == TierId::kNvme : remote) on_nvme.push_back(key);
    }
    if (!on_nvme.empty()) {
      // What the prefetcher brings in must not push out this selection's
      // other blocks: the policy hears of them before it makes room.
      store->MarkWanted(keys);
      prefetcher->WaitFor(prefetcher->Enqueue(std::move(on_nvme)),
                          std::max(deadline - absl::Now(), absl::ZeroDuration()));
    }
  }
  // The request's inline promotion budget; an entry that waits is not held
  // to it (its promotions still count against the entries after it).
  PromotionBudget unlimited;
  PromotionBudget* budget = entry.wait_ms() > 0 ? &unlimited : &promotion_;
  // The placement policy learns what was chosen (NVMe-only blocks too)
  // before any room is made for it (mark_wanted: what BlockStore::MarkWanted
  // does, in the same pass; it matters for tiers.placement = stability).
  // The new lease replaces the context's current one (Install releases
  // it), so the tenant's leases limit never refuses a context's next step.
  uint64_t replaces = 0;
  {
    absl::MutexLock lock(&ctx->mu);
    replaces = ctx->lease_id();
  }
  absl::StatusOr<uint64_t> lease = store->AcquireHandles(
      ctx->tenant(), keys, ctx->ttl_ms(), &handles,
      {.memory_only = true, .mark_wanted = true, .budget = budget, .replaces_lease = replaces});
  if (budget == &unlimited) promotion_.promoted_bytes += unlimited.promoted_bytes;
  if (!lease.ok()) {
    item->status = lease.status();
    out->clear_blocks();
    return;
  }
  item->lease = *lease;
  item->pinned = 0;
  for (size_t k = 0; k < handles.size(); ++k) {
    v1::SelectedBlock* b = out->mutable_blocks(static_cast<int>(k));
    if (handles[k].ok()) {
      ++item->pinned;
      b->set_residency(v1::RESIDENCY_RESIDENT);
      v1::BlockHandle* handle = b->mutable_handle();
      handle->set_arena_id(handles[k]->arena_id);
      handle->set_offset_bytes(handles[k]->offset_bytes);
      handle->set_size_bytes(handles[k]->size_bytes);
      handle->set_generation(handles[k]->generation);
    } else if (IsPromotionDeferred(handles[k].status())) {
      b->set_residency(v1::RESIDENCY_PENDING);  // in host memory: promoted off this thread
      deferred->push_back(keys[k]);
    } else if (handles[k].status().code() == absl::StatusCode::kUnavailable) {
      b->set_residency(v1::RESIDENCY_PENDING);  // on NVMe or remote only: on its way
      prefetch->push_back(keys[k]);
    } else if (handles[k].status().code() != absl::StatusCode::kNotFound) {
      b->set_residency(v1::RESIDENCY_PENDING);
    }
  }
}

void SelectHandler::Install(Item* item, v1::ContextSelection* out) {
  Context* ctx = item->ctx.get();
  BlockStore* store = runtime_->store();
  const int64_t step = item->request.step;
  uint64_t drop = 0;  // the lease that goes: the previous set's, or ours
  {
    absl::MutexLock lock(&ctx->mu);
    if (ctx->closed()) {
      item->status = absl::NotFoundError(
          absl::StrCat(Field(item->entry, "context_id"), ": context ", ctx->id(),
                       " was closed while this Select was pinning its blocks"));
      drop = item->lease;
    } else {
      // The new set is pinned: now the previous one may go.
      drop = ctx->lease_id();
      ctx->SetSelection(item->lease, item->pinned, step);
      ctx->Touch(runtime_->contexts()->NowMicros());
    }
  }
  if (drop != 0) store->Release(ctx->tenant(), drop).IgnoreError();  // may have expired
  if (!item->status.ok()) out->clear_blocks();
}

void SelectHandler::Handle(const v1::SelectRequest& request, v1::SelectResponse* response) {
  timings_ = Timings();
  selected_blocks_ = 0;
  new_blocks_ = 0;
  mass_ = MassWork();
  const absl::Time start = absl::Now();  // wait_ms counts from here
  auto lap = std::chrono::steady_clock::now();
  response->Clear();
  response->set_request_id(request.request_id());
  const int n = request.contexts_size();
  for (int i = 0; i < n; ++i) {
    response->add_contexts()->set_context_id(request.contexts(i).context_id());
  }
  const uint64_t limit = runtime_->config().select.max_contexts_per_request;
  if (static_cast<uint64_t>(n) > limit) {
    const absl::Status st = absl::InvalidArgumentError(
        absl::StrCat("contexts: ", n, " entries exceed select.max_contexts_per_request = ", limit));
    for (int i = 0; i < n; ++i) ToItemStatus(st, response->mutable_contexts(i)->mutable_status());
    return;
  }

  // 1. Checks that need no lock.
  // Items keep their vectors' capacity across calls.
  if (items_.size() < static_cast<size_t>(n)) items_.resize(n);
  for (int i = 0; i < n; ++i) items_[i].Reset();
  absl::flat_hash_map<uint64_t, int>& first_use = first_use_;
  std::vector<Item*>& valid = valid_;
  first_use.clear();
  valid.clear();
  for (int i = 0; i < n; ++i) {
    const v1::ContextSelect& entry = request.contexts(i);
    Item& item = items_[i];
    item.entry = i;
    item.status = Check(entry, i, &item);
    if (item.status.ok()) {
      auto [it, inserted] = first_use.emplace(entry.context_id(), i);
      if (!inserted) {
        item.status = absl::InvalidArgumentError(
            absl::StrCat(Field(i, "context_id"), ": context ", entry.context_id(),
                         " is already named by contexts[", it->second, "]"));
      }
    }
    if (item.status.ok()) valid.push_back(&item);
  }

  // 2. Lock in increasing context id, check what needs the lock, select.
  std::sort(valid.begin(), valid.end(),
            [](const Item* a, const Item* b) { return a->ctx->id() < b->ctx->id(); });
  LaterWork later;
  {
    context_mus_.clear();  // reused: a warm Select allocates nothing here
    for (Item* item : valid) context_mus_.push_back(&item->ctx->mu);
    OrderedMutexLocks locked(context_mus_);
    requests_.clear();
    for (Item* item : valid) {
      item->status = Prepare(request.contexts(item->entry), item->entry, item);
      if (!item->status.ok()) continue;
      item->result = requests_.size();
      requests_.push_back(item->request);
    }
    results_.resize(requests_.size());
    timings_.check_us = Lap(&lap);
    absl::Status batch = selector_->SelectBatch(requests_, absl::MakeSpan(results_));
    timings_.select_us = Lap(&lap);
    for (Item* item : valid) {
      if (!item->status.ok()) continue;
      if (!batch.ok()) {
        // Not expected after Prepare; select alone so only this entry fails.
        item->status = selector_->Select(requests_[item->result], &results_[item->result]);
        if (!item->status.ok()) {
          item->status =
              absl::Status(item->status.code(),
                           absl::StrCat("contexts[", item->entry, "]: ", item->status.message()));
          continue;
        }
      }
      Collect(item, response->mutable_contexts(item->entry), &later.prefetch);
    }
  }
  timings_.build_us = Lap(&lap);

  // 3. Pin outside the context locks (promotion from memory within the
  // request's budget, the wait_ms wait for NVMe-only blocks), then install
  // each new set under its lock.
  promotion_ = PromotionBudget();
  promotion_.limit_bytes = runtime_->config().select.inline_promotion_bytes;
  for (Item* item : valid) {
    if (!item->status.ok()) continue;
    const v1::ContextSelect& entry = request.contexts(item->entry);
    Pin(entry, start + absl::Milliseconds(entry.wait_ms()), item,
        response->mutable_contexts(item->entry), &later);
  }
  for (Item* item : valid) {
    if (item->status.ok()) Install(item, response->mutable_contexts(item->entry));
  }
  timings_.pin_us = Lap(&lap);

  for (int i = 0; i < n; ++i) {
    Item& item = items_[i];
    v1::ContextSelection* out = response->mutable_contexts(item.entry);
    if (!item.status.ok() || !out->has_status()) ToItemStatus(item.status, out->mutable_status());
    item.ctx.reset();
  }
  if (!later.prefetch.empty()) runtime_->prefetcher()->Submit(std::move(later.prefetch));
  if (!later.deferred.empty()) {
    runtime_->metrics()->SelectPromotionsDeferred(later.deferred.size());
    runtime_->prefetcher()->SubmitPromotion(std::move(later.deferred));
  }
  runtime_->metrics()->SelectPhases(timings_.check_us * 1e-6, timings_.select_us * 1e-6,
                                    timings_.build_us * 1e-6, timings_.pin_us * 1e-6,
                                    request.contexts_size());
  runtime_->metrics()->SelectChurn(selected_blocks_, new_blocks_);
  if (mass_.reused + mass_.descended > 0) {
    runtime_->metrics()->SelectMassTree(mass_.reused, mass_.descended, mass_.opened);
  }
}

}  // namespace kvtier::daemon
