// Compactor: SelKV compaction of contexts (index/selkv.h) as stored
// versions, behind the CompactContext, ListContextVersions and
// DropContextVersion RPCs (docs/API.md, "Compaction").
//
// Compact reads every block of an open context that Select is not using
// (checksums verified by the store), compacts each (layer, KV head) on the
// calling thread, packs the kept slots into new blocks of the same profile
// (the last one padded), stores them durably and retained (never evicted
// by the cache; they count against the tenant's retained_bytes quota),
// records the version (and
// version 0, the originals, the first time) in the VersionStore, and then
// demotes the original blocks to NVMe (device and host copies given up as
// the cache would; pinned copies stay; they remain cache blocks, evicted
// like any other unless retained). Nothing is deleted: the originals
// go only through Drop(version 0), which is refused while no compacted
// version exists, and the last compacted version cannot be dropped once
// the originals are gone.
//
// A context is named by its context key: XXH3-128 (16 bytes, big-endian
// high half first) of its block ids, each preceded by its length as one
// byte, in token order. The same compaction (retention, importance, merge,
// bias, and the same observation queries) of the same context is stored
// once: asking again returns it with existed = true.
//
// Limits: max_context_bytes of original payload per call
// (RESOURCE_EXHAUSTED naming compaction.max_context_bytes), and
// max_observation_rows query rows per KV head (INVALID_ARGUMENT). Memory
// per call: the context's payload plus 2 x T x head_dim floats for one
// head at a time, plus the compacted payload.
//
// Thread safety: thread-safe; calls on one context key are serialised,
// calls on different contexts run in parallel.
#ifndef KVTIER_DAEMON_COMPACTION_COMPACTOR_H_
#define KVTIER_DAEMON_COMPACTION_COMPACTOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/compaction/version_store.h"
#include "daemon/context_manager.h"
#include "kvtier/v1/kvtier.pb.h"
#include "storage/store/block_store.h"

namespace kvtier::daemon {

struct CompactorOptions {
  uint64_t max_context_bytes = uint64_t{1} << 30;
  uint32_t max_observation_rows = 4096;
};

class Compactor {
 public:
  // None owned; all outlive the compactor.
  Compactor(BlockStore* store, ContextManager* contexts, VersionStore* versions,
            const CompactorOptions& options);

  // INVALID_ARGUMENT naming the field (retention, importance, merge, bias,
  // observation_queries); NOT_FOUND for context_id; FAILED_PRECONDITION when
  // Select holds the context's blocks (Release it first) or a block of it
  // is no longer stored; RESOURCE_EXHAUSTED past max_context_bytes or the
  // tenant's retained_bytes quota; store
  // errors as they come (nothing of the new version is kept on error).
  //
  // The request is the API's message (its fields are what errors name);
  // everything the compactor keeps and returns is a domain record.
  struct Result {
    std::string context_key;
    ContextVersionRecord version;
    bool existed = false;  // the same compaction was stored before
  };
  absl::StatusOr<Result> Compact(const std::string& tenant,
                                 const v1::CompactContextRequest& request);
  // NOT_FOUND for a context_key with no versions; an empty key lists all.
  absl::StatusOr<std::vector<ContextVersionRecord>> List(const std::string& tenant,
                                                         uint64_t profile_id,
                                                         const std::string& context_key);
  // Deletes a version's blocks (see the file comment); returns how many
  // blocks were deleted. NOT_FOUND for an unknown key or version;
  // FAILED_PRECONDITION when the drop would leave no copy of the context
  // or a block is pinned (the blocks deleted before it stay deleted, and
  // the call can be repeated).
  absl::StatusOr<uint32_t> Drop(const std::string& tenant, uint64_t profile_id,
                                const std::string& context_key, uint32_t version);
  // Sets result->compacted (the API's form of its slots) when result's
  // block is a compacted block.
  void Annotate(const std::string& tenant, uint64_t profile_id, v1::BlockResult* result);

  // A context's key: a 128-bit hash of its block ids (kContextKeyBytes).
  static constexpr size_t kContextKeyBytes = 16;
  static std::string ContextKey(const std::vector<std::string>& block_ids);

 private:
  // One of kStripes mutexes, by the key's hash: calls on one context key
  // take the same one.
  absl::Mutex* LockFor(const std::string& key);
  static constexpr size_t kStripes = 64;

  BlockStore* const store_;
  ContextManager* const contexts_;
  VersionStore* const versions_;
  const CompactorOptions options_;
  absl::Mutex stripes_[kStripes];
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_COMPACTION_COMPACTOR_H_
