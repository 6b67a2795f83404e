// ContextManager: the daemon's open contexts. A context is what one request
// attends to: the blocks of its segments in order, then the blocks appended
// while decoding. Opening one builds its index::ContextIndex (Grid / Chunk /
// Page tree plus stability windows) from the key summaries the block store
// kept for each block; Select (select_handler.h) then pins the blocks it
// picks under the context's lease.
//
// Lifetime of a context:
//   Open     -> context_id (random 64-bit, never 0, not reused while open)
//   Append   extends the tree (the last segment)
//   Select   one at a time per context (Context::mu); each Select's pins
//            replace the previous Select's (Context::lease_id)
//   Release  unpins the current Select set; the context stays open
//   Close    frees the tree, the stability state and the pins
//   ReapIdle closes contexts idle (no Open/Append/Select/Release) for longer
//            than their lease TTL; their pins expire at the same time.
//
// Tenancy: a context belongs to the tenant that opened it; another tenant
// sees NOT_FOUND (the same answer as for an id nobody holds). Per-tenant
// limits (SetTenantLimits) cap open contexts and blocks per context
// (RESOURCE_EXHAUSTED naming the quota). A block id appears at most once in
// a context: a repeat in Open or Append is INVALID_ARGUMENT naming both
// positions.
//
// Thread safety: every method may be called concurrently. Lock order: a
// context's mu is never taken while holding mu_, and mu_ may be taken while
// holding a context's mu. Several contexts' mu are taken in increasing id.
#ifndef KVTIER_DAEMON_CONTEXT_MANAGER_H_
#define KVTIER_DAEMON_CONTEXT_MANAGER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "index/select/selector.h"
#include "storage/env/env.h"
#include "storage/store/block_store.h"

namespace kvtier::daemon {

struct ContextManagerOptions {
  int32_t pages_per_chunk = 16;
  int32_t chunks_per_grid = 16;
  // Which summary vector the trees hold: kMean for the key-key scorer,
  // kWeightedMean for the head-weighted one.
  index::TreeVector vector = index::TreeVector::kMean;
  // Keep full summaries per block (Quest / ArkVale scorers).
  bool keep_summaries = false;
  // Keep per-layer means (per-layer anchors); needs index.summary_per_layer.
  bool keep_layer_means = false;
  uint64_t max_contexts = 4096;
  uint64_t default_ttl_ms = 30000;  // lease_ttl_ms 0
  uint64_t max_ttl_ms = 600000;
  uint64_t max_append_blocks = 4096;  // block_ids per AppendBlocks
};

// A tenant's limits; 0 = none beyond the daemon-wide ones.
struct ContextLimits {
  uint64_t contexts = 0;            // open at once
  uint64_t blocks_per_context = 0;  // blocks in one context
};

// The ordered block ids of a context, stored back to back.
class BlockIdList {
 public:
  void Add(absl::string_view id);
  absl::string_view at(size_t i) const {
    const uint32_t begin = i == 0 ? 0 : end_[i - 1];
    return absl::string_view(bytes_.data() + begin, end_[i] - begin);
  }
  size_t size() const { return end_.size(); }
  // Position of id, or -1 when absent.
  int64_t Find(absl::string_view id) const;
  size_t MemoryBytes() const {
    return bytes_.capacity() + end_.capacity() * sizeof(uint32_t) +
           positions_.capacity() * (sizeof(uint64_t) + sizeof(uint32_t) + 1);
  }

 private:
  std::string bytes_;
  std::vector<uint32_t> end_;  // end offset of each id in bytes_
  // XXH3 of an id -> its first position (the id itself is compared on a hit).
  absl::flat_hash_map<uint64_t, uint32_t> positions_;
};

// What identifies a context and bounds its life: constant once it is open.
struct ContextIdentity {
  uint64_t id = 0;
  std::string tenant;
  ModelProfile profile;
  uint64_t ttl_ms = 0;
};

class Context {
 public:
  Context(ContextIdentity identity, std::unique_ptr<index::ContextIndex> index,
          BlockIdList block_ids);

  // Constant after construction.
  uint64_t id() const { return id_; }
  const std::string& tenant() const { return tenant_; }
  const ModelProfile& profile() const { return profile_; }
  uint64_t ttl_ms() const { return ttl_ms_; }
  // Retrieval heads of the profile's calibration (rows of head_queries).
  int32_t num_retrieval_heads() const { return num_retrieval_heads_; }

  // Serialises Select, Append, Release and Close of this context.
  absl::Mutex mu;

  bool closed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return closed_; }
  index::ContextIndex& index() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return *index_; }
  int64_t num_blocks() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return static_cast<int64_t>(block_ids_.size());
  }
  absl::string_view block_id(int64_t position) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return block_ids_.at(static_cast<size_t>(position));
  }
  BlockKey KeyAt(int64_t position) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Step of the next Select: `requested`, or the last step + 1 when
  // requested is 0. InvalidArgument naming `field` when it goes back.
  absl::StatusOr<int64_t> ResolveStep(uint64_t requested, const char* field) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // The lease pinning the current Select set (0 = none).
  uint64_t lease_id() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return lease_id_; }
  // Records the new Select set's lease and what it pins; the last step
  // becomes max(last step, step).
  void SetSelection(uint64_t lease_id, uint32_t pinned_blocks, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // The positions of `rising` (a Select's prefetch candidates) that were
  // not among the previous call's; remembers `rising` for the next call.
  std::vector<int64_t> NewPrefetch(const std::vector<int64_t>& rising)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // How many of `selected` (a Select's positions) the previous call's did
  // not hold; remembers `selected` for the next call. No allocation once
  // its buffers have grown to the budget.
  size_t CountNewSelected(absl::Span<const int64_t> selected) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Tree + stability + block ids, bytes.
  size_t MemoryBytes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Readable without mu (ListContexts, the reaper).
  uint32_t num_blocks_snapshot() const { return num_blocks_.load(std::memory_order_relaxed); }
  uint32_t pinned_blocks() const { return pinned_blocks_.load(std::memory_order_relaxed); }
  uint64_t last_step() const { return last_step_.load(std::memory_order_relaxed); }
  uint64_t last_used_micros() const { return last_used_micros_.load(std::memory_order_relaxed); }
  void Touch(uint64_t now_micros) {
    last_used_micros_.store(now_micros, std::memory_order_relaxed);
  }

 private:
  friend class ContextManager;

  const uint64_t id_;
  const std::string tenant_;
  const ModelProfile profile_;
  const uint64_t ttl_ms_;
  const int32_t num_retrieval_heads_;

  bool closed_ ABSL_GUARDED_BY(mu) = false;
  std::unique_ptr<index::ContextIndex> index_ ABSL_GUARDED_BY(mu);
  BlockIdList block_ids_ ABSL_GUARDED_BY(mu);
  uint64_t lease_id_ ABSL_GUARDED_BY(mu) = 0;
  bool stepped_ ABSL_GUARDED_BY(mu) = false;
  std::vector<int64_t> prefetched_ ABSL_GUARDED_BY(mu);     // sorted
  std::vector<int64_t> selected_ ABSL_GUARDED_BY(mu);       // sorted, the last Select's
  std::vector<int64_t> selected_next_ ABSL_GUARDED_BY(mu);  // scratch

  std::atomic<uint32_t> num_blocks_{0};
  std::atomic<uint32_t> pinned_blocks_{0};
  std::atomic<uint64_t> last_step_{0};
  std::atomic<uint64_t> last_used_micros_{0};
};

struct OpenedContext {
  uint64_t context_id = 0;
  uint32_t num_blocks = 0;
};

struct ContextInfo {
  uint64_t context_id = 0;
  std::string tenant;
  uint64_t profile_id = 0;
  uint32_t num_blocks = 0;
  uint32_t pinned_blocks = 0;
  uint64_t last_step = 0;
  uint64_t idle_ms = 0;
};

class ContextManager {
 public:
  // store and env (clock) are not owned and outlive the manager.
  ContextManager(BlockStore* store, Env* env, const ContextManagerOptions& options);
  // Releases every open context's pins.
  ~ContextManager();

  // Replaces a tenant's limits (open contexts stay open).
  void SetTenantLimits(const std::string& tenant, const ContextLimits& limits);
  // The tenant's open contexts.
  uint64_t OpenCount(const std::string& tenant);

  // Builds a context from segments of block ids (each 1..32 bytes).
  // INVALID_ARGUMENT naming the field: no blocks, too many blocks or
  // segments, a bad id, lease_ttl_ms above max_ttl_ms, profile_id 0.
  // NOT_FOUND: profile_id is not one of the tenant's profiles (ProfileOf).
  // FAILED_PRECONDITION listing (up to 8 of) the blocks that are not stored
  // or have no key summary. RESOURCE_EXHAUSTED: max_contexts are open.
  // lease_ttl_ms 0 = default_ttl_ms.
  absl::StatusOr<OpenedContext> Open(const std::string& tenant, uint64_t profile_id,
                                     const std::vector<std::vector<std::string>>& segments,
                                     uint64_t lease_ttl_ms);

  // Appends blocks to the context's last segment; returns its block count.
  // NOT_FOUND: context_id. INVALID_ARGUMENT: empty, over max_append_blocks,
  // bad ids, context limit. FAILED_PRECONDITION: blocks not stored (listed).
  absl::StatusOr<uint32_t> Append(const std::string& tenant, uint64_t context_id,
                                  const std::vector<std::string>& block_ids);

  // Unpins the context's current Select set; returns how many blocks were
  // unpinned (0 when none, or when its lease already expired).
  absl::StatusOr<uint32_t> Release(const std::string& tenant, uint64_t context_id);

  // Frees the context and its pins. NOT_FOUND: context_id.
  absl::Status Close(const std::string& tenant, uint64_t context_id);

  // The open context (lock its mu and check closed() before use).
  // NOT_FOUND naming `field`.
  absl::StatusOr<std::shared_ptr<Context>> Find(const std::string& tenant, uint64_t context_id,
                                                const char* field = "context_id");

  // Closes every context idle for longer than its TTL; returns how many.
  size_t ReapIdle();

  std::vector<ContextInfo> List();
  size_t size();
  uint64_t NowMicros() { return env_->NowMicros(); }
  BlockStore* store() const { return store_; }

 private:
  // Builds the tree of a new context (no lock held).
  absl::StatusOr<std::shared_ptr<Context>> Build(
      const std::string& tenant, const ModelProfile& profile, uint64_t id,
      const std::vector<std::vector<std::string>>& segments, uint64_t ttl_ms);
  struct TenantContexts {
    ContextLimits limits;
    uint64_t open = 0;  // in contexts_ or being opened
  };
  // Removes ctx from contexts_ and its tenant's count.
  void EraseLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The tenant's blocks_per_context limit checked against `total`.
  absl::Status CheckBlocks(const std::string& tenant, size_t total, const char* field);
  // Marks ctx closed and unpins its set. Requires ctx->mu.
  void CloseLocked(Context* ctx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx->mu);
  // Decodes the summaries of keys; FAILED_PRECONDITION listing blocks that
  // are missing or have none (`name(i)` names key i).
  absl::StatusOr<std::vector<index::BlockSummary>> LoadSummaries(
      const std::vector<BlockKey>& keys, const std::function<std::string(size_t)>& name);

  BlockStore* const store_;
  Env* const env_;
  const ContextManagerOptions options_;

  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Context>> contexts_ ABSL_GUARDED_BY(mu_);
  uint64_t opening_ ABSL_GUARDED_BY(mu_) = 0;  // Opens past the limit check
  absl::flat_hash_map<std::string, TenantContexts> tenants_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> reserved_ids_ ABSL_GUARDED_BY(mu_);  // being opened
};

// "0a1b..." for ids of bytes, as error messages show them.
std::string DescribeBlockId(absl::string_view id);

// NOT_FOUND naming `field`: the context is not open.
absl::Status NotOpen(const char* field, uint64_t context_id);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_CONTEXT_MANAGER_H_
