// SlotMap: which master serves each of the 16384 slots, as one node's
// CLUSTER SLOTS reply said, patched by MOVED redirects since.
//
// A slot no range covers has no master (MasterOf returns nullptr): the
// cluster, as that node saw it, does not serve it.
//
// Thread safety: none; a value type. RedisCluster guards its copy with its
// mutex.
#ifndef KVTIER_STORAGE_REMOTE_REDIS_SLOT_MAP_H_
#define KVTIER_STORAGE_REMOTE_REDIS_SLOT_MAP_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "storage/remote/redis/key_slot.h"

struct redisReply;

namespace kvtier::remote {

class SlotMap {
 public:
  // At most this many distinct nodes (masters and replicas) in one map; a
  // reply naming more is refused, a MOVED to one more node is not recorded.
  static constexpr size_t kMaxNodes = 4096;

  SlotMap();  // no slot has a master

  // Parses a CLUSTER SLOTS reply received from `asked` ("host:port"):
  // ranges of [start, end, master, replica...], each node [endpoint, port,
  // id?, metadata?]. An empty, nil or "?" endpoint means "the host you
  // asked" (Redis's rule for nodes that do not know their own address).
  // INTERNAL "redis <asked>: malformed CLUSTER SLOTS reply: ..." for any
  // other shape (slots outside 0..16383, start > end, no port, port outside
  // 1..65535, more than kMaxNodes nodes).
  static absl::StatusOr<SlotMap> FromClusterSlots(const redisReply& reply,
                                                  const std::string& asked);

  // "host:port" of the master serving `slot`, or nullptr when none does.
  // Valid until the map is next changed or destroyed.
  const std::string* MasterOf(uint16_t slot) const;

  // Where to read `slot` from when reads may go to replicas: the master
  // (spread % (1 + r) == 0) or one of its r replicas the last CLUSTER
  // SLOTS listed, so that successive spreads cycle over every copy. The
  // master alone once a MOVED changed the slot (its replicas are then
  // unknown until the next map). nullptr when no master serves it. Valid
  // as MasterOf's.
  const std::string* ReadNodeOf(uint16_t slot, uint64_t spread) const;

  // Records that `address` serves `slot` (a MOVED redirect said so); the
  // slot's replicas are forgotten.
  void SetMaster(uint16_t slot, const std::string& address);

  // Distinct masters serving at least one slot, sorted.
  std::vector<std::string> Masters() const;

  // Every node the map knows (masters first, then replicas, then nodes
  // learned from MOVED), each once: whom to ask for the next map.
  const std::vector<std::string>& nodes() const { return nodes_; }

  // Number of slots with a master.
  int served_slots() const;

 private:
  // Index of `address` in nodes_, appending it when new; -1 when full.
  int NodeIndex(const std::string& address);

  std::vector<std::string> nodes_;
  absl::flat_hash_map<std::string, int16_t> index_;  // address -> index in nodes_
  std::array<int16_t, kClusterSlots> owner_;         // index into nodes_, -1: none
  // Per slot an index into replica_sets_ (-1: no replicas known); each set
  // lists indices into nodes_.
  std::array<int16_t, kClusterSlots> replicas_;
  std::vector<std::vector<int16_t>> replica_sets_;
};

}  // namespace kvtier::remote

#endif  // KVTIER_STORAGE_REMOTE_REDIS_SLOT_MAP_H_
