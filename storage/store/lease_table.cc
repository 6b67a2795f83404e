#include "storage/store/lease_table.h"

#include "storage/common/random_id.h"

namespace kvtier {

uint64_t LeaseTable::Add(std::string owner, std::vector<Entry*> blocks, uint64_t deadline_micros) {
  uint64_t id = 0;
  while (id == 0 || leases_.contains(id)) id = RandomId();
  by_deadline_.emplace(deadline_micros, id);
  ++count_by_owner_[owner];
  leases_.emplace(id, Lease{id, std::move(owner), deadline_micros, std::move(blocks)});
  return id;
}

std::optional<Lease> LeaseTable::Remove(uint64_t lease_id, const std::string& owner) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.owner != owner) return std::nullopt;
  return Take(lease_id);
}

size_t LeaseTable::CountOf(const std::string& owner) const {
  auto it = count_by_owner_.find(owner);
  return it == count_by_owner_.end() ? 0 : it->second;
}

bool LeaseTable::Holds(uint64_t lease_id, const std::string& owner) const {
  auto it = leases_.find(lease_id);
  return it != leases_.end() && it->second.owner == owner;
}

std::optional<Lease> LeaseTable::Take(uint64_t lease_id) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) return std::nullopt;
  Lease lease = std::move(it->second);
  leases_.erase(it);
  by_deadline_.erase({lease.deadline_micros, lease.lease_id});
  auto count = count_by_owner_.find(lease.owner);
  if (--count->second == 0) count_by_owner_.erase(count);
  return lease;
}

std::vector<Lease> LeaseTable::TakeExpired(uint64_t now_micros) {
  std::vector<Lease> expired;
  while (!by_deadline_.empty() && by_deadline_.begin()->first <= now_micros) {
    uint64_t id = by_deadline_.begin()->second;
    auto lease = Take(id);
    if (lease) expired.push_back(std::move(*lease));
  }
  return expired;
}

std::optional<uint64_t> LeaseTable::NextDeadline() const {
  if (by_deadline_.empty()) return std::nullopt;
  return by_deadline_.begin()->first;
}

}  // namespace kvtier
