#include "daemon/keydiff_placement.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <list>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "index/kernels/simd.h"
#include "index/placement.h"
#include "index/summary/summary_codec.h"

namespace kvtier::daemon {
namespace {

int TierIndex(TierId tier) { return static_cast<int>(tier); }

bool InMemory(const Entry& e) {
  return e.in_order[TierIndex(TierId::kDevice)] || e.in_order[TierIndex(TierId::kHost)];
}
bool InAnyTier(const Entry& e) { return InMemory(e) || e.in_order[TierIndex(TierId::kNvme)]; }

// v_b / |v_b| of the entry; nullopt when it has no readable summary or v_b
// is zero or not finite.
std::optional<std::vector<float>> UnitVector(const Entry& e) {
  if (e.summary.empty()) return std::nullopt;
  std::optional<std::vector<float>> v = index::PeekSummaryMean(e.summary);
  if (!v) return std::nullopt;
  const float norm = std::sqrt(index::simd::Dot(v->data(), v->data(), v->size()));
  if (!(norm > 0) || !std::isfinite(norm)) return std::nullopt;
  for (float& x : *v) x /= norm;
  return v;
}

class KeyDiffPlacement final : public PlacementPolicy {
 public:
  explicit KeyDiffPlacement(const KeyDiffPlacementOptions& options) : options_(options) {
    weights_.redundancy_weight = options.redundancy_weight;
    weights_.age_weight = options.age_weight;
    weights_.stability_weight = 0.0f;
  }

  const char* name() const override { return "keydiff"; }

  void Insert(TierId tier, Entry* e) override {
    const int t = TierIndex(tier);
    if (e->in_order[t]) {
      Touch(tier, e);
      return;
    }
    const bool was_stored = InAnyTier(*e);
    const bool was_in_memory = InMemory(*e);
    order_[t].push_back(e);
    e->order[t] = std::prev(order_[t].end());
    e->in_order[t] = true;
    const bool enters_memory = tier != TierId::kNvme && !was_in_memory;
    if (was_stored && !enters_memory) return;
    std::optional<std::vector<float>> unit = UnitVector(*e);
    if (!unit) return;
    if (!was_stored) AddToMean(e->key.profile_id, *unit, +1.0);
    if (enters_memory) {
      std::vector<uint16_t>& cached = vectors_[e];
      cached.resize(unit->size());
      index::simd::FloatToHalfN(unit->data(), cached.data(), unit->size());
    }
  }

  void Touch(TierId tier, Entry* e) override {
    const int t = TierIndex(tier);
    if (!e->in_order[t]) return;
    order_[t].splice(order_[t].end(), order_[t], e->order[t]);
  }

  void Remove(TierId tier, Entry* e) override {
    const int t = TierIndex(tier);
    if (!e->in_order[t]) return;
    order_[t].erase(e->order[t]);
    e->in_order[t] = false;
    if (!InMemory(*e)) vectors_.erase(e);
    if (!InAnyTier(*e)) {
      if (std::optional<std::vector<float>> unit = UnitVector(*e)) {
        AddToMean(e->key.profile_id, *unit, -1.0);
      }
    }
  }

  Entry* Victim(TierId tier, const std::function<bool(const Entry&)>& evictable) override {
    const size_t sample = static_cast<size_t>(std::max(options_.sample_blocks, 1));
    const std::list<Entry*>& order = order_[TierIndex(tier)];
    // Copies past `older` (the newest ones) are never sampled.
    const size_t protected_copies = static_cast<size_t>(
        std::clamp(options_.newest_protected, 0.0f, 0.99f) * static_cast<float>(order.size()));
    const size_t older = std::max<size_t>(order.size() - protected_copies, 1);
    candidates_.clear();
    size_t walked = 0;
    for (Entry* e : order) {
      if (walked++ >= older) break;
      if (!evictable(*e)) continue;
      candidates_.push_back(e);
      if (candidates_.size() >= sample) break;
    }
    if (candidates_.empty()) {
      // Every older copy is pinned or busy: the least recently used
      // evictable one, as LRU would.
      for (Entry* e : order) {
        if (evictable(*e)) return e;
      }
      return nullptr;
    }
    if (candidates_.size() == 1) return candidates_[0];
    Entry* best = candidates_[0];  // least recently used: the fallback
    float best_priority = -INFINITY;
    done_.assign(candidates_.size(), false);
    for (size_t first = 0; first < candidates_.size(); ++first) {
      if (done_[first]) continue;
      // One ranking per profile: each has its own mean key direction.
      const uint64_t profile = candidates_[first]->key.profile_id;
      group_.clear();
      for (size_t i = first; i < candidates_.size(); ++i) {
        if (!done_[i] && candidates_[i]->key.profile_id == profile) {
          group_.push_back(candidates_[i]);
          done_[i] = true;
        }
      }
      int32_t winner = -1;
      float priority = 0;
      if (RankGroup(profile, &winner, &priority) &&
          (priority > best_priority ||
           (priority == best_priority &&
            group_[winner]->last_access_micros < best->last_access_micros))) {
        best_priority = priority;
        best = group_[winner];
      }
    }
    return best;
  }

 private:
  struct ProfileMean {
    std::vector<double> sum;  // of unit v_b
    int64_t count = 0;
  };

  void AddToMean(uint64_t profile_id, const std::vector<float>& unit, double sign) {
    ProfileMean& m = means_[profile_id];
    if (m.sum.size() != unit.size()) {
      if (m.count != 0) return;  // a dimension mismatch cannot happen within a profile
      m.sum.assign(unit.size(), 0.0);
    }
    for (size_t d = 0; d < unit.size(); ++d) m.sum[d] += sign * unit[d];
    m.count += sign > 0 ? 1 : -1;
    if (m.count <= 0) means_.erase(profile_id);
  }

  // Ranks group_ (blocks of one profile) with index::RankForDemotion and
  // returns its first block and that block's priority.
  bool RankGroup(uint64_t profile_id, int32_t* winner, float* priority) {
    auto mean = means_.find(profile_id);
    size_t dim = 0;
    if (mean != means_.end()) dim = mean->second.sum.size();
    for (Entry* e : group_) {
      auto v = vectors_.find(e);
      if (v != vectors_.end() && dim == 0) dim = v->second.size();
    }
    if (dim == 0) dim = 1;  // no block has a summary: redundancy 0.5 for all
    vectors_scratch_.assign(group_.size() * dim, 0.0f);
    last_access_.clear();
    for (size_t i = 0; i < group_.size(); ++i) {
      auto v = vectors_.find(group_[i]);
      if (v != vectors_.end() && v->second.size() == dim) {
        index::simd::HalfToFloatN(v->second.data(), &vectors_scratch_[i * dim], dim);
      }
      last_access_.push_back(static_cast<int64_t>(group_[i]->last_access_micros));
    }
    context_mean_.assign(dim, 0.0f);
    if (mean != means_.end() && mean->second.sum.size() == dim) {
      const double inv = 1.0 / static_cast<double>(mean->second.count);
      for (size_t d = 0; d < dim; ++d) {
        context_mean_[d] = static_cast<float>(mean->second.sum[d] * inv);
      }
    }
    index::DemotionInput input;
    input.dim = static_cast<int32_t>(dim);
    input.vectors = vectors_scratch_;
    input.last_access = last_access_;
    input.context_mean = context_mean_;
    absl::StatusOr<std::vector<int32_t>> order =
        index::RankForDemotion(input, weights_, &priorities_);
    if (!order.ok() || order->empty()) return false;
    *winner = order->front();
    *priority = priorities_[*winner];
    return true;
  }

  const KeyDiffPlacementOptions options_;
  index::DemotionWeights weights_;
  std::list<Entry*> order_[kNumTiers];  // least recently used first
  // Unit v_b (fp16) of every block with a device or host copy.
  absl::flat_hash_map<const Entry*, std::vector<uint16_t>> vectors_;
  absl::flat_hash_map<uint64_t, ProfileMean> means_;
  // Scratch reused by Victim.
  std::vector<Entry*> candidates_, group_;
  std::vector<bool> done_;
  std::vector<float> vectors_scratch_, context_mean_, priorities_;
  std::vector<int64_t> last_access_;
};

}  // namespace

std::unique_ptr<PlacementPolicy> NewKeyDiffPlacement(const KeyDiffPlacementOptions& options) {
  return std::make_unique<KeyDiffPlacement>(options);
}

}  // namespace kvtier::daemon
