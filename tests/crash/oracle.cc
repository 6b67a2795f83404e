#include "tests/crash/oracle.h"

#include <algorithm>

#include "tests/crash/crash_block.h"

namespace kvtier::crash {

void Oracle::IdSet::Insert(const std::string& id) {
  if (index_.contains(id)) return;
  index_[id] = ids_.size();
  ids_.push_back(id);
}

void Oracle::IdSet::Erase(const std::string& id) {
  auto it = index_.find(id);
  if (it == index_.end()) return;
  const size_t pos = it->second;
  index_.erase(it);
  if (pos + 1 != ids_.size()) {
    ids_[pos] = std::move(ids_.back());
    index_[ids_[pos]] = pos;
  }
  ids_.pop_back();
}

std::optional<std::string> Oracle::IdSet::Pick(std::mt19937_64& rng) const {
  if (ids_.empty()) return std::nullopt;
  return ids_[rng() % ids_.size()];
}

Oracle::Oracle(int owners) : owners_(owners) {}

std::string Oracle::NewId(uint8_t owner) {
  absl::MutexLock lock(&mu_);
  Owner& o = owners_.at(owner);
  std::string id = BlockId(owner, o.next_seq++);
  o.all.push_back(id);
  all_.push_back(id);
  facts_[id] = BlockFacts{.owner = owner};
  return id;
}

BlockFacts Oracle::Facts(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = facts_.find(id);
  return it == facts_.end() ? BlockFacts{} : it->second;
}

std::optional<std::string> Oracle::PickLive(uint8_t owner, bool retained,
                                            std::mt19937_64& rng) const {
  absl::MutexLock lock(&mu_);
  const Owner& o = owners_.at(owner);
  return retained ? o.live_retained.Pick(rng) : o.live_plain.Pick(rng);
}

std::optional<std::string> Oracle::PickOwn(uint8_t owner, std::mt19937_64& rng) const {
  absl::MutexLock lock(&mu_);
  const Owner& o = owners_.at(owner);
  if (o.all.empty()) return std::nullopt;
  return o.all[rng() % o.all.size()];
}

std::optional<std::string> Oracle::PickRecent(uint8_t owner, size_t recent,
                                              std::mt19937_64& rng) const {
  absl::MutexLock lock(&mu_);
  const Owner& o = owners_.at(owner);
  if (o.all.empty()) return std::nullopt;
  const size_t n = std::min(recent, o.all.size());
  return o.all[o.all.size() - 1 - rng() % n];
}

std::optional<std::string> Oracle::PickAny(std::mt19937_64& rng) const {
  absl::MutexLock lock(&mu_);
  if (all_.empty()) return std::nullopt;
  return all_[rng() % all_.size()];
}

void Oracle::PlaceLocked(const std::string& id, const BlockFacts& before, const BlockFacts& after) {
  Owner& o = owners_.at(after.owner);
  if (before.may_exist) (before.retained ? o.live_retained : o.live_plain).Erase(id);
  if (after.may_exist) (after.retained ? o.live_retained : o.live_plain).Insert(id);
}

template <typename Fn>
void Oracle::UpdateLocked(const std::string& id, Fn fn) {
  auto it = facts_.find(id);
  if (it == facts_.end()) return;
  const BlockFacts before = it->second;
  fn(it->second);
  PlaceLocked(id, before, it->second);
}

void Oracle::PutAcked(const std::string& id, bool durable, bool retained) {
  absl::MutexLock lock(&mu_);
  UpdateLocked(id, [&](BlockFacts& f) {
    // The result reports the block as it is now (an earlier durable copy
    // may have been evicted since, unless it is retained).
    f.may_exist = true;
    f.durable = durable;
    f.retained = retained;
  });
}

void Oracle::PutUncertain(const std::string& id) {
  absl::MutexLock lock(&mu_);
  UpdateLocked(id, [](BlockFacts& f) {
    f.may_exist = true;
    f.uncertain = true;
  });
}

void Oracle::DeleteAcked(const std::string& id) {
  absl::MutexLock lock(&mu_);
  UpdateLocked(id, [](BlockFacts& f) { f.may_exist = f.durable = f.retained = false; });
}

void Oracle::DeleteUncertain(const std::string& id) {
  absl::MutexLock lock(&mu_);
  UpdateLocked(id, [](BlockFacts& f) {
    f.durable = f.retained = false;
    f.uncertain = true;
  });
}

void Oracle::ObservedAbsent(const std::string& id) {
  absl::MutexLock lock(&mu_);
  UpdateLocked(id, [](BlockFacts& f) { f.may_exist = f.durable = f.retained = false; });
}

void Oracle::Resync(const std::string& id, bool present, bool retained) {
  absl::MutexLock lock(&mu_);
  UpdateLocked(id, [&](BlockFacts& f) {
    // A block that survived a restart is durable (NVMe-only, with a record).
    f.may_exist = f.durable = present;
    f.retained = present && retained;
    f.uncertain = false;
  });
}

std::vector<std::pair<std::string, BlockFacts>> Oracle::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<std::string, BlockFacts>> out;
  out.reserve(all_.size());
  for (const std::string& id : all_) out.emplace_back(id, facts_.at(id));
  return out;
}

size_t Oracle::size() const {
  absl::MutexLock lock(&mu_);
  return all_.size();
}

}  // namespace kvtier::crash
