#include "storage/store/placement.h"

namespace kvtier {
namespace {

class LruPolicy final : public PlacementPolicy {
 public:
  const char* name() const override { return "lru"; }

  void Insert(TierId tier, Entry* entry) override {
    int t = static_cast<int>(tier);
    if (entry->in_order[t]) {
      Touch(tier, entry);
      return;
    }
    order_[t].push_back(entry);
    entry->order[t] = std::prev(order_[t].end());
    entry->in_order[t] = true;
  }

  void Touch(TierId tier, Entry* entry) override {
    int t = static_cast<int>(tier);
    if (!entry->in_order[t]) return;
    order_[t].splice(order_[t].end(), order_[t], entry->order[t]);
  }

  void Remove(TierId tier, Entry* entry) override {
    int t = static_cast<int>(tier);
    if (!entry->in_order[t]) return;
    order_[t].erase(entry->order[t]);
    entry->in_order[t] = false;
  }

  Entry* Victim(TierId tier, const std::function<bool(const Entry&)>& evictable) override {
    for (Entry* e : order_[static_cast<int>(tier)]) {
      if (evictable(*e)) return e;
    }
    return nullptr;
  }

 private:
  std::list<Entry*> order_[kNumTiers];  // least recently used first
};

}  // namespace

std::unique_ptr<PlacementPolicy> NewLruPolicy() { return std::make_unique<LruPolicy>(); }

}  // namespace kvtier
