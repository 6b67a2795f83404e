// RedisCluster::GetMany: pipelined GETs per master, or per copy with
// read_from_replicas (the rest of the client is in redis_cluster.cc).
#include <sys/uio.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "storage/remote/redis/key_slot.h"
#include "storage/remote/redis/redis_cluster.h"

namespace kvtier::remote {
namespace {

// A connection's buffer beyond this is given back after a batch.
constexpr size_t kKeepBufferBytes = size_t{8} << 20;

}  // namespace

std::vector<absl::StatusOr<bool>> RedisCluster::GetMany(
    absl::Span<const std::string> keys,
    absl::FunctionRef<void(size_t index, std::string_view value)> consume) {
  std::vector<absl::StatusOr<bool>> results(keys.size(), false);
  std::vector<bool> retry(keys.size(), false);

  // Keys by the node to read them from (their master, or with
  // read_from_replicas a copy in turn), in order.
  struct Group {
    std::string address;
    bool replica = false;  // not the key's master: a nil is asked again
    std::vector<size_t> keys;
    std::unique_ptr<RedisConnection> connection;
    size_t sent = 0;  // keys whose GET went out
    size_t read = 0;  // of those, replies read
  };
  std::vector<Group> groups;
  absl::flat_hash_map<std::string, size_t> group_of;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].size() > kMaxKeyBytes) {
      results[i] = absl::InvalidArgumentError(
          absl::StrCat("key: ", keys[i].size(), " bytes exceed the limit of ", kMaxKeyBytes));
      continue;
    }
    const uint16_t slot = KeyHashSlot(keys[i]);
    absl::StatusOr<std::string> master = Route(slot);
    if (!master.ok()) {
      retry[i] = true;  // Get reports it, after its own refresh
      continue;
    }
    std::string node = ReadNode(slot, *master);
    const bool replica = node != *master;
    auto [it, added] = group_of.try_emplace(node, groups.size());
    if (added) groups.push_back(Group{std::move(node), replica, {}, nullptr});
    groups[it->second].keys.push_back(i);
  }
  for (Group& g : groups) {
    absl::StatusOr<Lease> lease = Acquire(g.address, /*ignore_down=*/false);
    if (lease.ok()) g.connection = std::move(lease->connection);
  }

  // Rounds of at most kMaxPipelinedGets per master: send to every master,
  // then read every master's replies.
  std::string commands;
  for (bool more = true; more;) {
    more = false;
    for (Group& g : groups) {
      if (g.connection == nullptr || g.sent == g.keys.size()) continue;
      const size_t end = std::min(g.keys.size(), g.sent + kMaxPipelinedGets);
      commands.clear();
      for (size_t k = g.sent; k < end; ++k) {
        AppendArrayHeader(2, &commands);
        AppendBulk("GET", &commands);
        AppendBulk(keys[g.keys[k]], &commands);
      }
      if (!g.connection->Send(commands).ok()) {
        g.connection.reset();  // Get retries these on a connection of its own
        continue;
      }
      g.sent = end;
    }
    for (Group& g : groups) {
      while (g.connection != nullptr && g.read < g.sent) {
        const size_t i = g.keys[g.read];
        absl::StatusOr<RedisConnection::ValueReply> reply = g.connection->ReadValue();
        if (!reply.ok()) {
          if (g.connection->failure() == TransportFailure::kTimeout) {
            stats_.Add(&RedisClusterStats::timeouts);
          }
          g.connection.reset();
          break;
        }
        ++g.read;
        switch (reply->kind) {
          case RedisConnection::ValueReply::Kind::kValue:
            consume(i, std::string_view(reply->bytes.data(), reply->bytes.size()));
            results[i] = true;
            if (g.replica) stats_.Add(&RedisClusterStats::replica_reads);
            break;
          case RedisConnection::ValueReply::Kind::kNil:
            results[i] = false;
            if (g.replica) retry[i] = true;  // not replicated yet? the master says
            break;
          case RedisConnection::ValueReply::Kind::kError:
            retry[i] = true;  // MOVED, ASK, TRYAGAIN ...: Get follows it
            break;
        }
      }
      if (g.connection != nullptr && g.sent < g.keys.size()) more = true;
    }
  }
  for (Group& g : groups) {
    for (size_t k = g.read; k < g.keys.size(); ++k) retry[g.keys[k]] = true;
    if (g.connection != nullptr) {
      g.connection->TrimBuffer(kKeepBufferBytes);
      Release(std::move(g.connection));
    }
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!retry[i]) continue;
    results[i] = Get(keys[i], [&](std::string_view value) { consume(i, value); });
  }
  return results;
}

}  // namespace kvtier::remote
