// KeyDiff placement: a storage PlacementPolicy (storage/store/placement.h)
// that, when a tier must give up a copy, demotes first the least recently
// used blocks that are most redundant with their profile's mean key.
//
// For every stored block the policy reads v_b (the `mean` of the key summary
// in Entry::summary, index/summary/summary_codec.h) and keeps, per profile, the
// running mean m of the normalised v_b of every stored block (any tier).
// Victim(tier) walks the tier's least-recently-used order and takes the
// first `sample_blocks` copies `evictable` accepts among the older
// (1 - newest_protected) of the tier; among them it demotes the one of
// highest
//
//   priority = redundancy_weight * (1 + cos(v_b, m)) / 2
//            + age_weight * age      (0 newest .. 1 oldest of the sample)
//
// (index::RankForDemotion, index/placement.h, per profile). A block whose
// summary is missing or unreadable counts as redundancy 0.5. With
// redundancy_weight = 0 this is LRU. Pins need no term: a pinned device copy
// is never offered by `evictable`. Per-context stability is not known to the
// store and is not used.
//
// Cost: Insert/Remove read v_b from a summary (its first section only, no
// full decode) when a block enters or leaves the device and host tiers
// altogether (or the store altogether); Victim is
// O(sample_blocks * head_dim) plus the walk past copies `evictable` rejects
// (at most the tier's size, as for LRU). Memory: head_dim fp16 values per
// block held in the device or host tier.
//
// Thread safety: none; the block store calls it under its mutex.
#ifndef KVTIER_DAEMON_KEYDIFF_PLACEMENT_H_
#define KVTIER_DAEMON_KEYDIFF_PLACEMENT_H_

#include <cstdint>
#include <memory>

#include "storage/store/placement.h"

namespace kvtier::daemon {

struct KeyDiffPlacementOptions {
  float redundancy_weight = 1.0f;  // >= 0
  float age_weight = 0.5f;         // >= 0
  int32_t sample_blocks = 16;      // >= 1 least recently used copies compared
  // [0, 1): the newest floor(newest_protected * tier size) copies of a tier
  // are never sampled, so a block that just entered it (a prefetch, a
  // promotion for Select) is not the next victim of a burst of inserts.
  // When no older copy is evictable the least recently used evictable copy
  // anywhere in the tier goes, as under LRU.
  float newest_protected = 0.5f;
};

std::unique_ptr<PlacementPolicy> NewKeyDiffPlacement(const KeyDiffPlacementOptions& options);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KEYDIFF_PLACEMENT_H_
