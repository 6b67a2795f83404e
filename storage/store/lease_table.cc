#include "storage/store/lease_table.h"

namespace kvtier {

uint64_t LeaseTable::Add(std::vector<BlockKey> blocks, uint64_t deadline_micros) {
  uint64_t id = next_id_++;
  by_deadline_.emplace(deadline_micros, id);
  leases_.emplace(id, Lease{id, deadline_micros, std::move(blocks)});
  return id;
}

std::optional<Lease> LeaseTable::Remove(uint64_t lease_id) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) return std::nullopt;
  Lease lease = std::move(it->second);
  leases_.erase(it);
  by_deadline_.erase({lease.deadline_micros, lease.lease_id});
  return lease;
}

std::vector<Lease> LeaseTable::TakeExpired(uint64_t now_micros) {
  std::vector<Lease> expired;
  while (!by_deadline_.empty() && by_deadline_.begin()->first <= now_micros) {
    uint64_t id = by_deadline_.begin()->second;
    auto lease = Remove(id);
    if (lease) expired.push_back(std::move(*lease));
  }
  return expired;
}

std::optional<uint64_t> LeaseTable::NextDeadline() const {
  if (by_deadline_.empty()) return std::nullopt;
  return by_deadline_.begin()->first;
}

}  // namespace kvtier
