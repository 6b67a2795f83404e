// LeaseTable: which blocks each lease pins, and until when.
//
// A lease is created for a set of blocks handed to a client (device
// handles from GetBlocks, a context's Select set, staging slots) and ends
// by Release or when its deadline passes. The table only does the
// bookkeeping; the block store applies the pins.
//
// Thread safety: none; the block store calls it under its mutex. A lease
// holds pointers to the entries it pins: the block store never frees an
// entry with pins (BlockStoreImpl invariant 8), so they stay valid until
// the lease ends.
#ifndef KVTIER_STORAGE_STORE_LEASE_TABLE_H_
#define KVTIER_STORAGE_STORE_LEASE_TABLE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "storage/catalog/records.h"

namespace kvtier {

struct Entry;  // storage/store/entry.h

struct Lease {
  uint64_t lease_id = 0;
  std::string owner;             // who may release it (the tenant)
  uint64_t deadline_micros = 0;  // monotonic clock (Env::NowMicros)
  std::vector<Entry*> blocks;    // each pin of this lease (an entry may repeat)
};

class LeaseTable {
 public:
  // Adds a lease of `owner`. Ids are random 64-bit values (not guessable
  // from one another), never 0 and never reused while the lease exists.
  uint64_t Add(std::string owner, std::vector<Entry*> blocks, uint64_t deadline_micros);

  // Removes and returns the lease, or nullopt when unknown (released or
  // expired already) or held by another owner (the same answer, so that a
  // caller cannot learn another owner's lease ids).
  std::optional<Lease> Remove(uint64_t lease_id, const std::string& owner);

  // Removes and returns every lease whose deadline is <= now_micros.
  std::vector<Lease> TakeExpired(uint64_t now_micros);

  // Earliest deadline, or nullopt when there are no leases.
  std::optional<uint64_t> NextDeadline() const;

  size_t size() const { return leases_.size(); }
  // Leases held by `owner` (O(1)).
  size_t CountOf(const std::string& owner) const;
  // True when lease_id exists and belongs to owner.
  bool Holds(uint64_t lease_id, const std::string& owner) const;

 private:
  std::optional<Lease> Take(uint64_t lease_id);

  absl::flat_hash_map<uint64_t, Lease> leases_;
  std::set<std::pair<uint64_t, uint64_t>> by_deadline_;  // (deadline, id)
  // Leases per owner; owners with none are erased.
  absl::flat_hash_map<std::string, size_t> count_by_owner_;
};

}  // namespace kvtier

#endif  // KVTIER_STORAGE_STORE_LEASE_TABLE_H_
