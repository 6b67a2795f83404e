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

class StabilityPolicy final : public PlacementPolicy {
 public:
  explicit StabilityPolicy(const StabilityPolicyOptions& options) : options_(options) {}

  const char* name() const override { return "stability"; }
  bool uses_wants() const override { return true; }

  void Insert(TierId tier, Entry* e) override {
    const int t = static_cast<int>(tier);
    if (!e->in_order[t]) {
      std::list<Entry*>& order = OrderOf(t, *e);
      order.push_back(e);
      e->order[t] = std::prev(order.end());
      e->in_order[t] = true;
    }
    // An arrival counts as wanted now (placement.h says why): the block
    // moves to the new end in every tier, so its copies keep one rank.
    MoveToNewest(*e);
  }

  void Touch(TierId /*tier*/, Entry* e) override {
    if (!Wanted(*e)) MoveToNewest(*e);  // LRU among never-wanted blocks
  }

  void Want(Entry* e, uint64_t now_micros) override {
    const bool first = !Wanted(*e);
    e->last_wanted_micros = now_micros == 0 ? 1 : now_micros;
    if (first && options_.unwanted_first) {
      // Every copy leaves the never-wanted order for the wanted one
      // (splices: no allocation).
      for (int t = 0; t < kNumTiers; ++t) {
        if (e->in_order[t]) wanted_[t].splice(wanted_[t].end(), never_wanted_[t], e->order[t]);
      }
    }
    MoveToNewest(*e);
  }

  void Remove(TierId tier, Entry* e) override {
    const int t = static_cast<int>(tier);
    if (!e->in_order[t]) return;
    OrderOf(t, *e).erase(e->order[t]);
    e->in_order[t] = false;
  }

  Entry* Victim(TierId tier, const std::function<bool(const Entry&)>& evictable) override {
    const int t = static_cast<int>(tier);
    // Without unwanted_first every copy is in wanted_ (one order).
    for (const std::list<Entry*>* order : {&never_wanted_[t], &wanted_[t]}) {
      for (Entry* e : *order) {
        if (evictable(*e)) return e;
      }
    }
    return nullptr;
  }

 private:
  static bool Wanted(const Entry& e) { return e.last_wanted_micros != 0; }

  // The order a copy of e belongs to in tier t.
  std::list<Entry*>& OrderOf(int t, const Entry& e) {
    return options_.unwanted_first && !Wanted(e) ? never_wanted_[t] : wanted_[t];
  }

  void MoveToNewest(Entry& e) {
    for (int t = 0; t < kNumTiers; ++t) {
      if (!e.in_order[t]) continue;
      std::list<Entry*>& order = OrderOf(t, e);
      order.splice(order.end(), order, e.order[t]);
    }
  }

  const StabilityPolicyOptions options_;
  // Oldest first. With unwanted_first, copies of blocks no Select has
  // wanted are in never_wanted_, the others in wanted_; without it every
  // copy is in wanted_.
  std::list<Entry*> never_wanted_[kNumTiers];
  std::list<Entry*> wanted_[kNumTiers];
};

}  // namespace

std::unique_ptr<PlacementPolicy> NewLruPolicy() { return std::make_unique<LruPolicy>(); }

std::unique_ptr<PlacementPolicy> NewStabilityPolicy(const StabilityPolicyOptions& options) {
  return std::make_unique<StabilityPolicy>(options);
}

}  // namespace kvtier
