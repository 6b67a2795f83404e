// PlacementPolicy: decides which copy a full tier gives up first.
//
// The block store tells the policy when a copy appears in a tier (Insert),
// is used (Touch) or disappears (Remove), and when a selection wants a
// block (Want, from BlockStore::MarkWanted: the daemon's Select), and asks
// it for the next victim among copies that `evictable` accepts. LRU is the
// built-in baseline; "stability" ranks by Select's demand; the daemon
// plugs in KeyDiff-based placement (daemon/keydiff_placement.h) through the
// same interface.
//
// A policy owns Entry::order and Entry::in_order (its per-tier order);
// nothing else reads them.
//
// Thread safety: none; called under the block store's mutex.
#ifndef KVTIER_STORAGE_STORE_PLACEMENT_H_
#define KVTIER_STORAGE_STORE_PLACEMENT_H_

#include <functional>
#include <list>
#include <memory>

#include "storage/store/entry.h"

namespace kvtier {

class PlacementPolicy {
 public:
  virtual ~PlacementPolicy() = default;
  virtual const char* name() const = 0;
  virtual void Insert(TierId tier, Entry* entry) = 0;
  virtual void Touch(TierId tier, Entry* entry) = 0;
  virtual void Remove(TierId tier, Entry* entry) = 0;
  // A selection wants the block at now_micros (monotonic; from
  // BlockStore::MarkWanted), whatever tiers hold it, NVMe-only blocks
  // included. A policy that uses wants records it in
  // entry->last_wanted_micros (never 0 once wanted). Default: ignored.
  virtual void Want(Entry* /*entry*/, uint64_t /*now_micros*/) {}
  // False when Want is ignored: the store then skips MarkWanted entirely
  // (no lock, no lookup).
  virtual bool uses_wants() const { return false; }
  // The copy to evict next from tier, or nullptr when evictable rejects
  // every copy. Does not remove it.
  virtual Entry* Victim(TierId tier, const std::function<bool(const Entry&)>& evictable) = 0;
};

// Least recently used first: Insert and Touch make a copy the most
// recently used of its tier; Want is ignored. (A Select's handle request
// touches the block's device copy only: BlockStore::AcquireHandles.)
std::unique_ptr<PlacementPolicy> NewLruPolicy();

// Stability: demote what Select has not wanted lately.
//
// Each tier keeps one order, oldest first. A block moves to the new end of
// the order of every tier holding it
//   * when a Select wants it (Want), and
//   * when a copy of it arrives in a tier (Insert: a put, a promotion, a
//     prefetch, a demotion into that tier).
// Touch (Get, a put of identical bytes, a handle request) moves it only
// while no Select has ever wanted it: among never-wanted copies the order
// is LRU, and a block wanted once is ranked by Select's demand alone, not
// by other reads. A block always moves in every tier at once, so two blocks
// keep one relative order in every tier holding both (a block is never the
// oldest in the host tier and the newest in the arena, as under LRU, whose
// handle requests refresh the arena copy only). Victim walks the order from
// the oldest end and returns the first copy `evictable` accepts, so a block
// that a Select keeps wanting stays behind every copy no Select asked for
// since. An arrival counts because the blocks that arrive are the ones
// about to be wanted: a block an engine just wrote (its local window), one
// prefetched for a Select or because its stability is rising; demoting
// them first would undo the work that brought them.
//
// unwanted_first (the literal reading of "never-wanted copies go first"):
// every copy no Select has ever wanted goes before any wanted copy (LRU
// among them), then wanted copies as above. Measured worse on the shared
// real-model KV (docs/QUALITY.md, "Placement"), because a block written a
// moment ago has not been wanted yet and is demoted before the Select that
// would want it; better only when one step's selected blocks outnumber the
// arena. Kept for that comparison.
//
// Cost: Insert, Touch, Want and Remove are O(1) per tier holding a copy
// (list splices; Want allocates nothing); Victim walks past the copies
// `evictable` rejects, as LRU does. Memory: one list node per copy, as
// LRU.
struct StabilityPolicyOptions {
  bool unwanted_first = false;
};
std::unique_ptr<PlacementPolicy> NewStabilityPolicy(const StabilityPolicyOptions& options);

}  // namespace kvtier

#endif  // KVTIER_STORAGE_STORE_PLACEMENT_H_
