// PlacementPolicy: decides which copy a full tier gives up first.
//
// The block store tells the policy when a copy appears in a tier (Insert),
// is used (Touch) or disappears (Remove), and asks it for the next victim
// among copies that `evictable` accepts. LRU is the built-in policy; the
// index layer plugs in KeyDiff-based placement through the same interface.
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
  // The copy to evict next from tier, or nullptr when evictable rejects
  // every copy. Does not remove it.
  virtual Entry* Victim(TierId tier, const std::function<bool(const Entry&)>& evictable) = 0;
};

// Least recently used first.
std::unique_ptr<PlacementPolicy> NewLruPolicy();

}  // namespace kvtier

#endif  // KVTIER_STORAGE_STORE_PLACEMENT_H_
