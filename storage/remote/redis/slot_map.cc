#include "storage/remote/redis/slot_map.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "storage/common/status_macros.h"
#include "storage/remote/redis/host_port.h"

namespace kvtier::remote {
namespace {

absl::Status Malformed(const std::string& asked, absl::string_view what) {
  return absl::InternalError(
      absl::StrCat("redis ", asked, ": malformed CLUSTER SLOTS reply: ", what));
}

// "host:port" of one node entry [endpoint, port, ...] of a range.
absl::StatusOr<std::string> NodeAddress(const redisReply& node, const std::string& asked,
                                        const std::string& asked_host) {
  if (node.type != REDIS_REPLY_ARRAY || node.elements < 2) {
    return Malformed(asked, "a node entry is not [endpoint, port, ...]");
  }
  const redisReply& endpoint = *node.element[0];
  const redisReply& port = *node.element[1];
  std::string host;
  if (endpoint.type == REDIS_REPLY_STRING) {
    host.assign(endpoint.str, endpoint.len);
  } else if (endpoint.type != REDIS_REPLY_NIL) {
    return Malformed(asked, "a node endpoint is neither a string nor nil");
  }
  if (host.empty() || host == "?") host = asked_host;
  if (port.type != REDIS_REPLY_INTEGER || port.integer < 1 || port.integer > 65535) {
    return Malformed(asked, "a node port is not an integer in 1..65535");
  }
  return FormatHostPort(host, static_cast<uint16_t>(port.integer));
}

}  // namespace

SlotMap::SlotMap() {
  owner_.fill(-1);
  replicas_.fill(-1);
}

absl::StatusOr<SlotMap> SlotMap::FromClusterSlots(const redisReply& reply,
                                                  const std::string& asked) {
  KVTIER_ASSIGN_OR_RETURN(const HostPort asked_host_port, ParseHostPort(asked));
  if (reply.type != REDIS_REPLY_ARRAY) return Malformed(asked, "not an array");
  SlotMap map;
  // Masters first so that nodes() lists them first; replicas in a second
  // pass.
  for (const bool masters : {true, false}) {
    for (size_t i = 0; i < reply.elements; ++i) {
      const redisReply& range = *reply.element[i];
      if (range.type != REDIS_REPLY_ARRAY || range.elements < 3 ||
          range.element[0]->type != REDIS_REPLY_INTEGER ||
          range.element[1]->type != REDIS_REPLY_INTEGER) {
        return Malformed(asked, "a range is not [start, end, master, ...]");
      }
      const long long start = range.element[0]->integer;
      const long long end = range.element[1]->integer;
      if (start < 0 || end >= kClusterSlots || start > end) {
        return Malformed(asked, absl::StrCat("bad slot range ", start, "-", end));
      }
      const size_t first_node = masters ? 2 : 3;
      const size_t end_node = masters ? 3 : range.elements;
      std::vector<int16_t> replicas;
      for (size_t n = first_node; n < end_node; ++n) {
        KVTIER_ASSIGN_OR_RETURN(const std::string address,
                                NodeAddress(*range.element[n], asked, asked_host_port.host));
        const int index = map.NodeIndex(address);
        if (index < 0) {
          return Malformed(asked, absl::StrCat("more than ", kMaxNodes, " nodes"));
        }
        if (masters) {
          std::fill(map.owner_.begin() + start, map.owner_.begin() + end + 1,
                    static_cast<int16_t>(index));
        } else {
          replicas.push_back(static_cast<int16_t>(index));
        }
      }
      if (!replicas.empty() && map.replica_sets_.size() < kMaxNodes) {
        // At most one set per range, and ranges hold distinct slots.
        map.replica_sets_.push_back(std::move(replicas));
        std::fill(map.replicas_.begin() + start, map.replicas_.begin() + end + 1,
                  static_cast<int16_t>(map.replica_sets_.size() - 1));
      }
    }
  }
  return map;
}

int SlotMap::NodeIndex(const std::string& address) {
  const auto it = index_.find(address);
  if (it != index_.end()) return it->second;
  if (nodes_.size() >= kMaxNodes) return -1;
  nodes_.push_back(address);
  const auto index = static_cast<int16_t>(nodes_.size() - 1);
  index_.emplace(address, index);
  return index;
}

const std::string* SlotMap::MasterOf(uint16_t slot) const {
  if (slot >= kClusterSlots) return nullptr;
  const int16_t index = owner_[slot];
  return index < 0 ? nullptr : &nodes_[index];
}

const std::string* SlotMap::ReadNodeOf(uint16_t slot, uint64_t spread) const {
  const std::string* master = MasterOf(slot);
  if (master == nullptr || replicas_[slot] < 0) return master;
  const std::vector<int16_t>& set = replica_sets_[replicas_[slot]];
  const uint64_t pick = spread % (set.size() + 1);
  return pick == 0 ? master : &nodes_[set[pick - 1]];
}

void SlotMap::SetMaster(uint16_t slot, const std::string& address) {
  if (slot >= kClusterSlots) return;
  const int index = NodeIndex(address);
  if (index >= 0) {
    owner_[slot] = static_cast<int16_t>(index);
    replicas_[slot] = -1;
  }
}

std::vector<std::string> SlotMap::Masters() const {
  std::vector<bool> serves(nodes_.size(), false);
  for (const int16_t index : owner_) {
    if (index >= 0) serves[index] = true;
  }
  std::vector<std::string> masters;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (serves[i]) masters.push_back(nodes_[i]);
  }
  std::sort(masters.begin(), masters.end());
  return masters;
}

int SlotMap::served_slots() const {
  return static_cast<int>(
      std::count_if(owner_.begin(), owner_.end(), [](int16_t index) { return index >= 0; }));
}

}  // namespace kvtier::remote
