#include "daemon/context_manager.h"

#include "storage/common/random_id.h"

#include <xxhash.h>

#include <algorithm>
#include <iterator>
#include <random>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "daemon/convert.h"
#include "daemon/tenant.h"
#include "index/summary/summary_codec.h"
#include "storage/catalog/records.h"
#include "storage/common/client_text.h"
#include "storage/common/status_macros.h"

namespace kvtier::daemon {
namespace {

// Blocks named in one error message; the rest are counted.
constexpr size_t kMaxListedBlocks = 8;
// Keys per BlockStore::GetSummaries call.
constexpr size_t kSummariesPerStoreCall = 256;

absl::Status CheckId(const std::string& id, const std::function<std::string()>& name) {
  if (id.empty() || id.size() > kMaxBlockIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        name(), ": ", id.size(), " bytes; a block id has 1..", kMaxBlockIdBytes, " bytes"));
  }
  return absl::OkStatus();
}

// Drops the arrays a tree does not read so that a large context is built
// without holding every block's full summary at once.
void Strip(const ContextManagerOptions& options, index::BlockSummary* s) {
  if (!options.keep_layer_means) {
    s->layer_mean = {};
    s->num_layers = 0;
  }
  s->layer_min = {};
  s->layer_max = {};
  if (options.keep_summaries) return;
  if (options.vector == index::TreeVector::kMean) {
    s->weighted_mean = {};
  } else {
    s->mean = {};
  }
  s->min = {};
  s->max = {};
}

}  // namespace

absl::Status NotOpen(const char* field, uint64_t context_id) {
  return absl::NotFoundError(absl::StrCat(field, ": context ", context_id,
                                          " is not open (never opened, closed or expired)"));
}

std::string DescribeBlockId(absl::string_view id) { return ClientHex(id); }

// ---- BlockIdList / Context -------------------------------------------------

void BlockIdList::Add(absl::string_view id) {
  positions_.emplace(XXH3_64bits(id.data(), id.size()), static_cast<uint32_t>(end_.size()));
  bytes_.append(id.data(), id.size());
  end_.push_back(static_cast<uint32_t>(bytes_.size()));
}

int64_t BlockIdList::Find(absl::string_view id) const {
  auto it = positions_.find(XXH3_64bits(id.data(), id.size()));
  if (it == positions_.end() || at(it->second) != id) {
    if (it == positions_.end()) return -1;
    // A hash collision with another id: scan (never in practice).
    for (size_t i = 0; i < size(); ++i) {
      if (at(i) == id) return static_cast<int64_t>(i);
    }
    return -1;
  }
  return it->second;
}

Context::Context(ContextIdentity identity, std::unique_ptr<index::ContextIndex> index,
                 BlockIdList block_ids)
    : id_(identity.id),
      tenant_(std::move(identity.tenant)),
      profile_(std::move(identity.profile)),
      ttl_ms_(identity.ttl_ms),
      num_retrieval_heads_(static_cast<int32_t>(index->calibration().retrieval_heads.size())),
      index_(std::move(index)),
      block_ids_(std::move(block_ids)) {
  num_blocks_.store(static_cast<uint32_t>(block_ids_.size()), std::memory_order_relaxed);
}

BlockKey Context::KeyAt(int64_t position) const {
  return BlockKey{tenant_, profile_.profile_id, std::string(block_id(position))};
}

absl::StatusOr<int64_t> Context::ResolveStep(uint64_t requested, const char* field) const {
  const int64_t last = static_cast<int64_t>(last_step_.load(std::memory_order_relaxed));
  if (requested == 0) return stepped_ ? last + 1 : 1;
  if (requested > static_cast<uint64_t>(INT64_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", requested, " is too large"));
  }
  if (stepped_ && static_cast<int64_t>(requested) < last) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", requested,
                                                   " is before the context's last step ", last,
                                                   " (steps never go back; 0 = the next step)"));
  }
  return static_cast<int64_t>(requested);
}

void Context::SetSelection(uint64_t lease_id, uint32_t pinned_blocks, int64_t step) {
  lease_id_ = lease_id;
  stepped_ = true;
  pinned_blocks_.store(pinned_blocks, std::memory_order_relaxed);
  // Selects of one context from several streams may finish out of step
  // order; the step never goes back.
  const uint64_t last = last_step_.load(std::memory_order_relaxed);
  last_step_.store(std::max(last, static_cast<uint64_t>(step)), std::memory_order_relaxed);
}

std::vector<int64_t> Context::NewPrefetch(const std::vector<int64_t>& rising) {
  std::vector<int64_t> sorted = rising;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> fresh;
  std::set_difference(sorted.begin(), sorted.end(), prefetched_.begin(), prefetched_.end(),
                      std::back_inserter(fresh));
  prefetched_ = std::move(sorted);
  return fresh;
}

size_t Context::CountNewSelected(absl::Span<const int64_t> selected) {
  selected_next_.assign(selected.begin(), selected.end());
  std::sort(selected_next_.begin(), selected_next_.end());
  size_t fresh = 0;
  auto old = selected_.begin();
  for (int64_t p : selected_next_) {
    while (old != selected_.end() && *old < p) ++old;
    fresh += old == selected_.end() || *old != p;
  }
  selected_.swap(selected_next_);
  return fresh;
}

size_t Context::MemoryBytes() const {
  return sizeof(*this) + (index_ ? index_->MemoryBytes() : 0) + block_ids_.MemoryBytes();
}

// ---- ContextManager --------------------------------------------------------

ContextManager::ContextManager(BlockStore* store, Env* env, const ContextManagerOptions& options)
    : store_(store), env_(env), options_(options) {}

void ContextManager::SetTenantLimits(const std::string& tenant, const ContextLimits& limits) {
  absl::MutexLock lock(&mu_);
  tenants_[tenant].limits = limits;
}

uint64_t ContextManager::OpenCount(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? 0 : it->second.open;
}

void ContextManager::EraseLocked(uint64_t id) {
  mu_.AssertHeld();
  auto it = contexts_.find(id);
  if (it == contexts_.end()) return;
  --tenants_[it->second->tenant()].open;
  contexts_.erase(it);
}

absl::Status ContextManager::CheckBlocks(const std::string& tenant, size_t total,
                                         const char* field) {
  uint64_t limit = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = tenants_.find(tenant);
    if (it != tenants_.end()) limit = it->second.limits.blocks_per_context;
  }
  if (limit == 0 || total <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(field, ": the context would hold ", total,
                                                   " blocks; quota blocks_per_context of tenant \"",
                                                   tenant, "\" is ", limit));
}

ContextManager::~ContextManager() {
  absl::flat_hash_map<uint64_t, std::shared_ptr<Context>> contexts;
  {
    absl::MutexLock lock(&mu_);
    contexts.swap(contexts_);
  }
  for (auto& [id, ctx] : contexts) {
    absl::MutexLock lock(&ctx->mu);
    CloseLocked(ctx.get());
  }
}

absl::StatusOr<std::vector<index::BlockSummary>> ContextManager::LoadSummaries(
    const std::vector<BlockKey>& keys, const std::function<std::string(size_t)>& name) {
  // In slices, so that a large context does not hold the store's lock for
  // the copy of every summary at once.
  std::vector<BlockKey> missing;
  std::vector<std::string> blobs;
  blobs.reserve(keys.size());
  for (size_t first = 0; first < keys.size(); first += kSummariesPerStoreCall) {
    const size_t last = std::min(keys.size(), first + kSummariesPerStoreCall);
    std::vector<BlockKey> slice(keys.begin() + first, keys.begin() + last);
    std::vector<std::string> got = store_->GetSummaries(slice, &missing);
    for (std::string& blob : got) blobs.push_back(std::move(blob));
  }
  absl::flat_hash_set<absl::string_view> missing_ids;
  for (const BlockKey& k : missing) missing_ids.insert(k.block_id);
  std::string listed;
  size_t bad = 0;
  bool unsummarised = false;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!blobs[i].empty()) continue;
    const bool stored = !missing_ids.contains(keys[i].block_id);
    unsummarised |= stored;
    if (++bad > kMaxListedBlocks) continue;
    absl::StrAppend(&listed, bad == 1 ? "" : ", ", name(i), " = ",
                    DescribeBlockId(keys[i].block_id),
                    stored ? " (stored without a key summary)" : "");
  }
  if (bad > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        bad, " of ", keys.size(), " blocks are not stored",
        unsummarised ? " or have no key summary" : "", ": ", listed,
        bad > kMaxListedBlocks ? absl::StrCat(" and ", bad - kMaxListedBlocks, " more") : ""));
  }
  std::vector<index::BlockSummary> out;
  out.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    absl::StatusOr<index::BlockSummary> s = index::DecodeSummary(blobs[i]);
    if (!s.ok()) {
      return absl::DataLossError(absl::StrCat("the key summary of ", name(i), " = ",
                                              DescribeBlockId(keys[i].block_id),
                                              " is unreadable: ", s.status().message()));
    }
    std::string().swap(blobs[i]);
    Strip(options_, &*s);
    out.push_back(std::move(*s));
  }
  return out;
}

absl::StatusOr<OpenedContext> ContextManager::Open(
    const std::string& tenant, uint64_t profile_id,
    const std::vector<std::vector<std::string>>& segments, uint64_t lease_ttl_ms) {
  if (segments.size() > kMaxContextSegments) {
    return absl::InvalidArgumentError(absl::StrCat(
        "segments: ", segments.size(), " segments exceed the limit of ", kMaxContextSegments));
  }
  size_t total = 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    for (size_t j = 0; j < segments[s].size(); ++j) {
      absl::Status st = CheckId(
          segments[s][j], [&] { return absl::StrCat("segments[", s, "].block_ids[", j, "]"); });
      if (!st.ok()) return st;
    }
    total += segments[s].size();
  }
  if (total > kMaxContextBlocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "segments: ", total, " blocks exceed the limit of ", kMaxContextBlocks, " per context"));
  }
  {
    // Each block at most once: a repeat would pin, score and cost memory
    // for nothing (and a request of one id many times is a cheap way to
    // make the daemon build a large tree).
    absl::flat_hash_map<absl::string_view, std::pair<size_t, size_t>> seen;
    for (size_t s = 0; s < segments.size(); ++s) {
      for (size_t j = 0; j < segments[s].size(); ++j) {
        auto [it, fresh] = seen.try_emplace(segments[s][j], s, j);
        if (!fresh) {
          return absl::InvalidArgumentError(absl::StrCat(
              "segments[", s, "].block_ids[", j, "]: repeats segments[", it->second.first,
              "].block_ids[", it->second.second, "] (a block appears at most once in a context)"));
        }
      }
    }
  }
  KVTIER_RETURN_IF_ERROR(CheckBlocks(tenant, total, "segments"));
  if (total == 0) {
    return absl::InvalidArgumentError("segments: no blocks (a context needs at least one)");
  }
  if (lease_ttl_ms > options_.max_ttl_ms) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lease_ttl_ms: ", lease_ttl_ms, " exceeds leases.max_ttl_ms = ", options_.max_ttl_ms));
  }
  const uint64_t ttl_ms = lease_ttl_ms == 0 ? options_.default_ttl_ms : lease_ttl_ms;
  absl::StatusOr<ModelProfile> profile = ProfileOf(store_, tenant, profile_id);
  if (!profile.ok()) return profile.status();

  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    if (contexts_.size() + opening_ >= options_.max_contexts) {
      return absl::ResourceExhaustedError(
          absl::StrCat("limits.max_contexts = ", options_.max_contexts,
                       " contexts are open; close some (CloseContext) first"));
    }
    TenantContexts& t = tenants_[tenant];
    if (t.limits.contexts != 0 && t.open >= t.limits.contexts) {
      return absl::ResourceExhaustedError(
          absl::StrCat("quota contexts of tenant \"", tenant, "\": ", t.open, " of ",
                       t.limits.contexts, " contexts are open; close some (CloseContext) first"));
    }
    ++t.open;
    ++opening_;
    // Random ids: not guessable from one another, and a restarted daemon
    // does not hand out an id a client of the previous one still holds.
    while (id == 0 || contexts_.contains(id) || reserved_ids_.contains(id)) id = RandomId();
    reserved_ids_.insert(id);
  }
  absl::StatusOr<std::shared_ptr<Context>> built = Build(tenant, *profile, id, segments, ttl_ms);
  absl::MutexLock lock(&mu_);
  --opening_;
  reserved_ids_.erase(id);
  if (!built.ok()) {
    --tenants_[tenant].open;
    return built.status();
  }
  const uint32_t num_blocks = (*built)->num_blocks_snapshot();
  contexts_[id] = std::move(*built);
  return OpenedContext{id, num_blocks};
}

absl::StatusOr<std::shared_ptr<Context>> ContextManager::Build(
    const std::string& tenant, const ModelProfile& profile, uint64_t id,
    const std::vector<std::vector<std::string>>& segments, uint64_t ttl_ms) {
  index::TreeOptions tree;
  tree.dim = static_cast<int32_t>(profile.head_dim);
  tree.block_size_tokens = static_cast<int32_t>(profile.block_size_tokens);
  tree.pages_per_chunk = options_.pages_per_chunk;
  tree.chunks_per_grid = options_.chunks_per_grid;
  tree.vector = options_.vector;
  tree.keep_summaries = options_.keep_summaries;
  index::ContextIndexOptions o;
  o.tree = tree;
  o.num_layers = static_cast<int32_t>(profile.layers);
  o.num_kv_heads = static_cast<int32_t>(profile.kv_heads);
  o.keep_layer_means = options_.keep_layer_means;
  absl::StatusOr<index::SelectionCalibration> calibration = CalibrationOf(profile);
  if (!calibration.ok()) return calibration.status();
  o.calibration = std::move(*calibration);
  absl::StatusOr<std::unique_ptr<index::ContextIndex>> index = index::ContextIndex::Create(o);
  if (!index.ok()) return index.status();

  BlockIdList ids;
  for (size_t s = 0; s < segments.size(); ++s) {
    if (segments[s].empty()) continue;
    std::vector<BlockKey> keys;
    keys.reserve(segments[s].size());
    for (const std::string& block_id : segments[s]) {
      keys.push_back(BlockKey{tenant, profile.profile_id, block_id});
    }
    absl::StatusOr<std::vector<index::BlockSummary>> summaries = LoadSummaries(
        keys, [s](size_t j) { return absl::StrCat("segments[", s, "].block_ids[", j, "]"); });
    if (!summaries.ok()) return summaries.status();
    absl::Status added = (*index)->AddSegment(*summaries);
    if (!added.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("segments[", s,
                       "]: the stored key summaries cannot form a context (stored under "
                       "another index.* configuration?): ",
                       added.message()));
    }
    for (const std::string& block_id : segments[s]) ids.Add(block_id);
  }
  auto ctx = std::make_shared<Context>(ContextIdentity{id, tenant, profile, ttl_ms},
                                       std::move(*index), std::move(ids));
  ctx->Touch(env_->NowMicros());
  return ctx;
}

absl::StatusOr<std::shared_ptr<Context>> ContextManager::Find(const std::string& tenant,
                                                              uint64_t context_id,
                                                              const char* field) {
  absl::MutexLock lock(&mu_);
  auto it = contexts_.find(context_id);
  if (it == contexts_.end() || it->second->tenant() != tenant) {
    return NotOpen(field, context_id);
  }
  return it->second;
}

absl::StatusOr<uint32_t> ContextManager::Append(const std::string& tenant, uint64_t context_id,
                                                const std::vector<std::string>& block_ids) {
  if (block_ids.empty()) return absl::InvalidArgumentError("block_ids: empty");
  if (block_ids.size() > options_.max_append_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_ids: ", block_ids.size(),
                     " ids exceed limits.max_batch_blocks = ", options_.max_append_blocks));
  }
  for (size_t j = 0; j < block_ids.size(); ++j) {
    absl::Status st = CheckId(block_ids[j], [j] { return absl::StrCat("block_ids[", j, "]"); });
    if (!st.ok()) return st;
  }
  absl::StatusOr<std::shared_ptr<Context>> found = Find(tenant, context_id);
  if (!found.ok()) return found.status();
  Context* ctx = found->get();
  absl::MutexLock lock(&ctx->mu);
  if (ctx->closed()) return NotOpen("context_id", context_id);
  const size_t total = ctx->block_ids_.size() + block_ids.size();
  if (total > kMaxContextBlocks) {
    return absl::InvalidArgumentError(absl::StrCat("block_ids: the context would hold ", total,
                                                   " blocks, the limit is ", kMaxContextBlocks));
  }
  KVTIER_RETURN_IF_ERROR(CheckBlocks(tenant, total, "block_ids"));
  {
    absl::flat_hash_map<absl::string_view, size_t> batch;
    for (size_t j = 0; j < block_ids.size(); ++j) {
      const int64_t at = ctx->block_ids_.Find(block_ids[j]);
      if (at >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("block_ids[", j, "]: already at position ", at,
                         " of the context (a block appears at most once in a context)"));
      }
      auto [it, fresh] = batch.try_emplace(block_ids[j], j);
      if (!fresh) {
        return absl::InvalidArgumentError(
            absl::StrCat("block_ids[", j, "]: repeats block_ids[", it->second, "]"));
      }
    }
  }
  std::vector<BlockKey> keys;
  keys.reserve(block_ids.size());
  for (const std::string& id : block_ids) {
    keys.push_back(BlockKey{tenant, ctx->profile().profile_id, id});
  }
  absl::StatusOr<std::vector<index::BlockSummary>> summaries =
      LoadSummaries(keys, [](size_t j) { return absl::StrCat("block_ids[", j, "]"); });
  if (!summaries.ok()) return summaries.status();
  for (size_t j = 0; j < summaries->size(); ++j) {
    // Tree and id list grow in step, so a failure leaves them consistent.
    absl::Status st = ctx->index_->Append((*summaries)[j]);
    if (!st.ok()) {
      ctx->num_blocks_.store(static_cast<uint32_t>(ctx->block_ids_.size()));
      return absl::FailedPreconditionError(
          absl::StrCat("block_ids[", j, "]: its key summary cannot join the context (", j,
                       " blocks before it were appended): ", st.message()));
    }
    ctx->block_ids_.Add(block_ids[j]);
  }
  ctx->num_blocks_.store(static_cast<uint32_t>(ctx->block_ids_.size()));
  ctx->Touch(env_->NowMicros());
  return static_cast<uint32_t>(ctx->block_ids_.size());
}

absl::StatusOr<uint32_t> ContextManager::Release(const std::string& tenant, uint64_t context_id) {
  absl::StatusOr<std::shared_ptr<Context>> found = Find(tenant, context_id);
  if (!found.ok()) return found.status();
  Context* ctx = found->get();
  absl::MutexLock lock(&ctx->mu);
  if (ctx->closed()) return NotOpen("context_id", context_id);
  ctx->Touch(env_->NowMicros());
  if (ctx->lease_id_ == 0) return 0u;
  absl::StatusOr<uint32_t> released = store_->Release(ctx->tenant(), ctx->lease_id_);
  ctx->lease_id_ = 0;
  ctx->pinned_blocks_.store(0, std::memory_order_relaxed);
  return released.ok() ? *released : 0u;  // NOT_FOUND: the lease expired
}

void ContextManager::CloseLocked(Context* ctx) {
  ctx->mu.AssertHeld();
  if (ctx->closed_) return;
  ctx->closed_ = true;
  if (ctx->lease_id_ != 0)
    store_->Release(ctx->tenant(), ctx->lease_id_).IgnoreError();  // may have expired
  ctx->lease_id_ = 0;
  ctx->pinned_blocks_.store(0, std::memory_order_relaxed);
  ctx->index_.reset();
  ctx->block_ids_ = BlockIdList();
}

absl::Status ContextManager::Close(const std::string& tenant, uint64_t context_id) {
  std::shared_ptr<Context> ctx;
  {
    absl::MutexLock lock(&mu_);
    auto it = contexts_.find(context_id);
    if (it == contexts_.end() || it->second->tenant() != tenant) {
      return NotOpen("context_id", context_id);
    }
    ctx = it->second;
    EraseLocked(context_id);
  }
  absl::MutexLock lock(&ctx->mu);
  CloseLocked(ctx.get());
  return absl::OkStatus();
}

size_t ContextManager::ReapIdle() {
  const uint64_t now = env_->NowMicros();
  auto idle = [now](const Context& ctx) {
    const uint64_t last = ctx.last_used_micros();
    return now > last && now - last > ctx.ttl_ms() * 1000;
  };
  std::vector<std::shared_ptr<Context>> candidates;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, ctx] : contexts_) {
      if (idle(*ctx)) candidates.push_back(ctx);
    }
  }
  size_t closed = 0;
  for (const std::shared_ptr<Context>& ctx : candidates) {
    {
      absl::MutexLock lock(&ctx->mu);
      if (ctx->closed() || !idle(*ctx)) continue;  // used or closed meanwhile
      CloseLocked(ctx.get());
    }
    absl::MutexLock lock(&mu_);
    auto it = contexts_.find(ctx->id());
    if (it != contexts_.end() && it->second == ctx) EraseLocked(ctx->id());
    ++closed;
  }
  return closed;
}

std::vector<ContextInfo> ContextManager::List() {
  const uint64_t now = env_->NowMicros();
  std::vector<ContextInfo> out;
  absl::MutexLock lock(&mu_);
  out.reserve(contexts_.size());
  for (const auto& [id, ctx] : contexts_) {
    ContextInfo info;
    info.context_id = id;
    info.tenant = ctx->tenant();
    info.profile_id = ctx->profile().profile_id;
    info.num_blocks = ctx->num_blocks_snapshot();
    info.pinned_blocks = ctx->pinned_blocks();
    info.last_step = ctx->last_step();
    const uint64_t last = ctx->last_used_micros();
    info.idle_ms = now > last ? (now - last) / 1000 : 0;
    out.push_back(std::move(info));
  }
  return out;
}

size_t ContextManager::size() {
  absl::MutexLock lock(&mu_);
  return contexts_.size();
}

}  // namespace kvtier::daemon
