#include "daemon/compaction/compactor.h"

#include <xxhash.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "daemon/compaction/head_codec.h"
#include "daemon/convert.h"
#include "index/selkv.h"
#include "storage/common/client_text.h"
#include "storage/common/status_macros.h"

namespace kvtier::daemon {
namespace {

// Ids and keys a client sent, cut (the service checks a context_key's length).
std::string Hex(const std::string& id) { return ClientHex(id); }

void AppendBe64(std::string* out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string Hash128(const std::string& bytes) {
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  std::string out;
  AppendBe64(&out, h.high64);
  AppendBe64(&out, h.low64);
  return out;
}

uint64_t NowUnixMs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

struct Method {
  index::CompactOptions options;
  v1::CompactImportance importance;
  v1::CompactMerge merge;
  v1::CompactBias bias;
};

absl::StatusOr<Method> MethodOf(const v1::CompactContextRequest& r, bool have_queries) {
  Method m;
  const float rho = r.retention();
  if (!std::isfinite(rho) || rho <= 0.0f || rho > 1.0f) {
    return absl::InvalidArgumentError(absl::StrCat("retention: ", rho, " is outside (0, 1]"));
  }
  m.options.rho = rho;
  switch (r.importance()) {
    case v1::COMPACT_IMPORTANCE_UNSPECIFIED:
      m.importance = have_queries ? v1::COMPACT_IMPORTANCE_SNAPKV : v1::COMPACT_IMPORTANCE_KEYDIFF;
      break;
    case v1::COMPACT_IMPORTANCE_KEYDIFF:
    case v1::COMPACT_IMPORTANCE_SNAPKV:
      m.importance = r.importance();
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "importance: ", static_cast<int>(r.importance()), " is not a CompactImportance"));
  }
  if (m.importance == v1::COMPACT_IMPORTANCE_SNAPKV && !have_queries) {
    return absl::InvalidArgumentError(
        "importance: SNAPKV needs observation_queries (none were given)");
  }
  m.options.importance = m.importance == v1::COMPACT_IMPORTANCE_SNAPKV
                             ? index::Importance::kSnapKV
                             : index::Importance::kKeyDiff;
  switch (r.merge()) {
    case v1::COMPACT_MERGE_UNSPECIFIED:
    case v1::COMPACT_MERGE_GATED:
      m.merge = v1::COMPACT_MERGE_GATED;
      m.options.merge = index::Merge::kGated;
      break;
    case v1::COMPACT_MERGE_UNIFORM:
      m.merge = r.merge();
      m.options.merge = index::Merge::kUniform;
      break;
    case v1::COMPACT_MERGE_NONE:
      m.merge = r.merge();
      m.options.merge = index::Merge::kNone;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("merge: ", static_cast<int>(r.merge()), " is not a CompactMerge"));
  }
  switch (r.bias()) {
    case v1::COMPACT_BIAS_UNSPECIFIED:
    case v1::COMPACT_BIAS_ATTENTION_RATIO:
      m.bias = v1::COMPACT_BIAS_ATTENTION_RATIO;
      m.options.bias = index::Bias::kAttentionRatio;
      break;
    case v1::COMPACT_BIAS_NONE:
      m.bias = r.bias();
      m.options.bias = index::Bias::kNone;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("bias: ", static_cast<int>(r.bias()), " is not a CompactBias"));
  }
  return m;
}

// Snapshot of an open context taken under its lock.
struct ContextCopy {
  ModelProfile profile;
  std::vector<std::string> block_ids;
};

absl::StatusOr<ContextCopy> CopyContext(ContextManager* contexts, const std::string& tenant,
                                        uint64_t context_id) {
  KVTIER_ASSIGN_OR_RETURN(std::shared_ptr<Context> ctx,
                          contexts->Find(tenant, context_id, "context_id"));
  absl::MutexLock lock(&ctx->mu);
  if (ctx->closed()) {
    return absl::NotFoundError(absl::StrCat("context_id: context ", context_id, " is closed"));
  }
  if (ctx->pinned_blocks() > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "context_id: context ", context_id, " is in use by Select (its lease pins ",
        ctx->pinned_blocks(),
        " blocks); Release the context (Release with context_id) before compacting it"));
  }
  ContextCopy copy;
  copy.profile = ctx->profile();
  copy.block_ids.reserve(static_cast<size_t>(ctx->num_blocks()));
  for (int64_t i = 0; i < ctx->num_blocks(); ++i) {
    copy.block_ids.emplace_back(ctx->block_id(i));
  }
  return copy;
}

// Observation rows per KV head in the request's observation_queries (0
// when there are none): INVALID_ARGUMENT naming the field when they are
// not whole rows of layers x kv_heads x head_dim values, exceed max_rows
// or hold a value that is not finite.
absl::StatusOr<int64_t> ObservationRows(const v1::CompactContextRequest& request,
                                        const index::BlockLayout& shape, int64_t max_rows) {
  if (request.observation_queries_size() == 0) return 0;
  const int64_t row_values = int64_t{shape.num_layers} * shape.num_kv_heads * shape.head_dim;
  const int64_t n = request.observation_queries_size();
  if (n % row_values != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "observation_queries: ", n, " values are not a multiple of layers x kv_heads x ",
        "head_dim = ", row_values));
  }
  const int64_t rows = n / row_values;
  if (rows > max_rows) {
    return absl::InvalidArgumentError(absl::StrCat("observation_queries: ", rows,
                                                   " rows per KV head exceed ",
                                                   "compaction.max_observation_rows = ", max_rows));
  }
  for (float q : request.observation_queries()) {
    if (!std::isfinite(q)) {
      return absl::InvalidArgumentError("observation_queries: a value is not finite");
    }
  }
  return rows;
}

// Identity of a compaction of the context under `key`: the key, the method
// and a hash of the observation queries (0 without them). Compacted block b
// of it is named Hash128(identity + "|" + b).
std::string CompactionIdentity(const std::string& key, const Method& method,
                               const v1::CompactContextRequest& request) {
  const bool have_queries = request.observation_queries_size() > 0;
  std::string identity = key;
  absl::StrAppend(&identity, "|", method.options.rho, "|", static_cast<int>(method.importance), "|",
                  static_cast<int>(method.merge), "|", static_cast<int>(method.bias), "|",
                  have_queries ? XXH3_64bits(request.observation_queries().data(),
                                             sizeof(float) * request.observation_queries_size())
                               : 0);
  return identity;
}

// The payloads of the context's blocks, in order (the store verifies
// checksums on every disk read). FAILED_PRECONDITION naming the block
// when one is no longer stored; other store errors as they come.
absl::StatusOr<std::vector<std::string>> ReadOriginals(BlockStore* store, const std::string& tenant,
                                                       uint64_t profile_id,
                                                       const std::vector<std::string>& block_ids) {
  std::vector<std::string> payloads(block_ids.size());
  for (size_t b = 0; b < block_ids.size(); ++b) {
    TierId from = TierId::kHost;
    absl::Status st = store->Get(BlockKey{tenant, profile_id, block_ids[b]}, &payloads[b], &from);
    if (absl::IsNotFound(st)) {
      return absl::FailedPreconditionError(absl::StrCat("context_id: block ", Hex(block_ids[b]),
                                                        " (position ", b,
                                                        ") of the context is no longer stored"));
    }
    KVTIER_RETURN_IF_ERROR(st);
  }
  return payloads;
}

// What CompactHeads made: the compacted payload, packed into blocks of the
// profile's size (the last one padded with zeros), and each block's slots.
struct CompactedContext {
  int64_t tokens = 0;  // of the originals
  int32_t kept = 0;    // slots kept per (layer, KV head)
  std::vector<std::string> blocks;
  std::vector<CompactedSlotsRecord> slots;  // one per block, of `version`
};

// Compacts every (layer, KV head) of the payloads (the context's blocks in
// token order) on the calling thread with method, using `rows`
// observation rows per KV head of the request's observation_queries (none
// when rows is 0). RESOURCE_EXHAUSTED past 2^31 tokens; a head's error
// names its layer and KV head.
absl::StatusOr<CompactedContext> CompactHeads(const index::BlockLayout& shape,
                                              const std::vector<std::string>& payloads,
                                              const Method& method,
                                              const v1::CompactContextRequest& request,
                                              int64_t rows, uint32_t version) {
  const bool have_queries = request.observation_queries_size() > 0;
  std::vector<absl::string_view> views(payloads.begin(), payloads.end());
  CompactedContext c;
  c.tokens = static_cast<int64_t>(payloads.size()) * shape.block_size_tokens;
  if (c.tokens > std::numeric_limits<int32_t>::max()) {
    return absl::ResourceExhaustedError("context_id: more than 2^31 tokens");
  }
  c.kept = index::KeptSlots(static_cast<int32_t>(c.tokens), method.options.rho);
  const int32_t kept = c.kept;
  const int64_t out_blocks = (kept + shape.block_size_tokens - 1) / shape.block_size_tokens;
  c.blocks.assign(static_cast<size_t>(out_blocks),
                  std::string(static_cast<size_t>(index::PayloadSizeBytes(shape)), '\0'));
  const int64_t per_block_slots =
      int64_t{shape.num_layers} * shape.num_kv_heads * shape.block_size_tokens;
  c.slots.resize(static_cast<size_t>(out_blocks));
  for (CompactedSlotsRecord& s : c.slots) {
    s.version = version;
    s.positions.assign(static_cast<size_t>(per_block_slots), -1);
    s.logit_bias.assign(static_cast<size_t>(per_block_slots),
                        -std::numeric_limits<float>::infinity());
    s.merged.assign(static_cast<size_t>(per_block_slots), 0);
  }

  std::vector<float> keys(static_cast<size_t>(c.tokens * shape.head_dim));
  std::vector<float> values(keys.size());
  for (int32_t l = 0; l < shape.num_layers; ++l) {
    for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
      GatherHead(shape, views, {l, h}, keys.data(), values.data());
      index::HeadKv head;
      head.num_tokens = static_cast<int32_t>(c.tokens);
      head.head_dim = shape.head_dim;
      head.keys = keys;
      head.values = values;
      if (have_queries) {
        head.queries =
            absl::MakeConstSpan(request.observation_queries().data() +
                                    (int64_t{l} * shape.num_kv_heads + h) * rows * shape.head_dim,
                                static_cast<size_t>(rows * shape.head_dim));
      }
      auto compacted = index::CompactHead(head, method.options);
      if (!compacted.ok()) {
        return absl::Status(
            compacted.status().code(),
            absl::StrCat("layer ", l, ", kv head ", h, ": ", compacted.status().message()));
      }
      ScatterHead(shape, {l, h}, {compacted->keys.data(), compacted->values.data(), kept},
                  &c.blocks);
      for (int32_t s = 0; s < kept; ++s) {
        CompactedSlotsRecord& block = c.slots[static_cast<size_t>(s / shape.block_size_tokens)];
        const auto i =
            static_cast<size_t>((int64_t{l} * shape.num_kv_heads + h) * shape.block_size_tokens +
                                s % shape.block_size_tokens);
        block.positions[i] = compacted->positions[static_cast<size_t>(s)];
        block.logit_bias[i] = compacted->bias[static_cast<size_t>(s)];
        block.merged[i] = static_cast<uint32_t>(compacted->merged[static_cast<size_t>(s)]);
      }
    }
  }
  return c;
}

// Deletes the blocks of version (a compaction being undone), ignoring
// errors.
void DeleteBlocks(BlockStore* store, const std::string& tenant, uint64_t profile_id,
                  const ContextVersionRecord& version) {
  for (const std::string& done : version.block_ids) {
    store->Delete(BlockKey{tenant, profile_id, done}).IgnoreError();
  }
}

// Stores c's blocks durably and retained (the cache never evicts them:
// once the originals are dropped they are the context's only copy),
// named after identity, adding their ids to
// *version and their slots (moved out of c) to *records. On error the
// blocks stored so far are deleted and the error names the block.
absl::Status StoreCompacted(BlockStore* store, const std::string& tenant, uint64_t profile_id,
                            const std::string& identity, CompactedContext* c,
                            ContextVersionRecord* version,
                            std::vector<VersionStore::SlotRecord>* records) {
  for (size_t b = 0; b < c->blocks.size(); ++b) {
    const std::string id = Hash128(absl::StrCat(identity, "|", b));
    const auto* data = reinterpret_cast<const uint8_t*>(c->blocks[b].data());
    absl::StatusOr<PutOutcome> put =
        store->Put(BlockKey{tenant, profile_id, id}, absl::MakeConstSpan(data, c->blocks[b].size()),
                   {.durable = true, .retain = true});
    if (!put.ok()) {
      DeleteBlocks(store, tenant, profile_id, *version);
      return absl::Status(put.status().code(), absl::StrCat("storing compacted block ", b, ": ",
                                                            put.status().message()));
    }
    version->block_ids.push_back(id);
    records->push_back(VersionStore::SlotRecord{id, std::move(c->slots[b])});
  }
  return absl::OkStatus();
}

}  // namespace

Compactor::Compactor(BlockStore* store, ContextManager* contexts, VersionStore* versions,
                     const CompactorOptions& options)
    : store_(store), contexts_(contexts), versions_(versions), options_(options) {}

std::string Compactor::ContextKey(const std::vector<std::string>& block_ids) {
  std::string bytes;
  for (const std::string& id : block_ids) {
    bytes.push_back(static_cast<char>(id.size()));
    bytes += id;
  }
  return Hash128(bytes);
}

absl::Mutex* Compactor::LockFor(const std::string& key) {
  return &stripes_[std::hash<std::string>()(key) % kStripes];
}

absl::StatusOr<Compactor::Result> Compactor::Compact(const std::string& tenant,
                                                     const v1::CompactContextRequest& request) {
  const bool have_queries = request.observation_queries_size() > 0;
  KVTIER_ASSIGN_OR_RETURN(Method method, MethodOf(request, have_queries));
  KVTIER_ASSIGN_OR_RETURN(ContextCopy ctx, CopyContext(contexts_, tenant, request.context_id()));
  const index::BlockLayout shape = LayoutOf(ctx.profile);
  const uint64_t profile_id = ctx.profile.profile_id;
  KVTIER_ASSIGN_OR_RETURN(const int64_t rows,
                          ObservationRows(request, shape, options_.max_observation_rows));
  const uint64_t bytes =
      ctx.block_ids.size() * static_cast<uint64_t>(index::PayloadSizeBytes(shape));
  if (bytes > options_.max_context_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("context_id: the context holds ", bytes, " bytes, more than ",
                     "compaction.max_context_bytes = ", options_.max_context_bytes));
  }

  const std::string key = ContextKey(ctx.block_ids);
  const std::string identity = CompactionIdentity(key, method, request);
  absl::MutexLock context_lock(LockFor(key));
  KVTIER_ASSIGN_OR_RETURN(std::vector<ContextVersionRecord> existing,
                          versions_->Versions(tenant, profile_id, key));
  const std::string first_id = Hash128(identity + "|0");
  uint32_t next_version = 1;
  for (const ContextVersionRecord& v : existing) {
    if (v.version > 0 && !v.dropped && !v.block_ids.empty() && v.block_ids[0] == first_id) {
      return Result{key, v, /*existed=*/true};
    }
    next_version = std::max(next_version, v.version + 1);
  }

  KVTIER_ASSIGN_OR_RETURN(std::vector<std::string> payloads,
                          ReadOriginals(store_, tenant, profile_id, ctx.block_ids));
  KVTIER_ASSIGN_OR_RETURN(CompactedContext compacted,
                          CompactHeads(shape, payloads, method, request, rows, next_version));

  // Store the new blocks durably; on error remove what was stored.
  ContextVersionRecord version;
  version.version = next_version;
  version.context_key = key;
  version.tokens = static_cast<uint32_t>(compacted.kept);
  version.retention = method.options.rho;
  version.importance = static_cast<uint8_t>(method.importance);
  version.merge = static_cast<uint8_t>(method.merge);
  version.bias = static_cast<uint8_t>(method.bias);
  version.created_unix_ms = NowUnixMs();
  std::vector<VersionStore::SlotRecord> records;
  KVTIER_RETURN_IF_ERROR(
      StoreCompacted(store_, tenant, profile_id, identity, &compacted, &version, &records));
  std::vector<ContextVersionRecord> to_write;
  if (existing.empty()) {
    ContextVersionRecord original;
    original.version = 0;
    original.context_key = key;
    original.tokens = static_cast<uint32_t>(compacted.tokens);
    original.retention = 1.0f;
    original.created_unix_ms = version.created_unix_ms;
    original.block_ids = ctx.block_ids;
    to_write.push_back(std::move(original));
  }
  to_write.push_back(version);
  if (absl::Status st = versions_->Put(tenant, profile_id, to_write, records); !st.ok()) {
    DeleteBlocks(store_, tenant, profile_id, version);
    return st;
  }

  // Demote the originals: device and host copies go as the cache would give
  // them up (a last copy is written to NVMe first); pinned copies stay.
  for (const std::string& id : ctx.block_ids) {
    const BlockKey k{tenant, profile_id, id};
    store_->Evict(k, TierId::kDevice).IgnoreError();
    store_->Evict(k, TierId::kHost).IgnoreError();
  }

  return Result{key, std::move(version), /*existed=*/false};
}

absl::StatusOr<std::vector<ContextVersionRecord>> Compactor::List(const std::string& tenant,
                                                                  uint64_t profile_id,
                                                                  const std::string& context_key) {
  if (context_key.empty()) return versions_->AllVersions(tenant, profile_id);
  KVTIER_ASSIGN_OR_RETURN(std::vector<ContextVersionRecord> versions,
                          versions_->Versions(tenant, profile_id, context_key));
  if (versions.empty()) {
    return absl::NotFoundError(absl::StrCat("context_key: ", Hex(context_key),
                                            " has no compacted versions in profile ", profile_id));
  }
  return versions;
}

absl::StatusOr<uint32_t> Compactor::Drop(const std::string& tenant, uint64_t profile_id,
                                         const std::string& context_key, uint32_t version) {
  absl::MutexLock context_lock(LockFor(context_key));
  KVTIER_ASSIGN_OR_RETURN(std::vector<ContextVersionRecord> versions,
                          List(tenant, profile_id, context_key));
  const ContextVersionRecord* target = nullptr;
  bool originals_dropped = false;
  int compacted = 0;
  for (const ContextVersionRecord& v : versions) {
    if (v.version == version) target = &v;
    if (v.version == 0) originals_dropped = v.dropped;
    if (v.version > 0 && !v.dropped) ++compacted;
  }
  if (target == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("version: context ", Hex(context_key), " has no version ", version));
  }
  if (target->dropped) return 0u;  // already dropped: nothing to do
  if (version == 0 && compacted == 0) {
    return absl::FailedPreconditionError(
        "version: 0 (the originals) is the only copy of the context; compact it first");
  }
  if (version > 0 && originals_dropped && compacted == 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "version: ", version, " is the last copy of the context (the originals were dropped)"));
  }
  uint32_t deleted = 0;
  for (const std::string& id : target->block_ids) {
    absl::Status st = store_->Delete(BlockKey{tenant, profile_id, id});
    if (absl::IsNotFound(st)) continue;
    if (!st.ok()) {
      return absl::Status(
          st.code(), absl::StrCat("block ", Hex(id), " of version ", version, ": ", st.message(),
                                  " (", deleted, " blocks deleted before it)"));
    }
    ++deleted;
  }
  // The record stays, marked dropped: version numbers are never reused. A
  // dropped compacted version keeps its method but not its block ids (a
  // later compaction with the same method stores blocks under them again).
  ContextVersionRecord dropped = *target;
  dropped.dropped = true;
  std::vector<std::string> slot_ids;
  if (version > 0) slot_ids = std::exchange(dropped.block_ids, {});
  KVTIER_RETURN_IF_ERROR(versions_->MarkDropped(tenant, profile_id, dropped, slot_ids));
  return deleted;
}

void Compactor::Annotate(const std::string& tenant, uint64_t profile_id, v1::BlockResult* result) {
  // Slots answers NOT_FOUND from memory for blocks that were never compacted.
  auto slots = versions_->Slots(tenant, profile_id, result->block_id());
  if (slots.ok()) *result->mutable_compacted() = ToProto(*slots);
}

}  // namespace kvtier::daemon
