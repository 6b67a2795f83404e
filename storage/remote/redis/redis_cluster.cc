#include "storage/remote/redis/redis_cluster.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "storage/common/status_macros.h"
#include "storage/remote/redis/host_port.h"
#include "storage/remote/redis/key_slot.h"

namespace kvtier::remote {

using Clock = std::chrono::steady_clock;

struct RedisCluster::Node {
  std::vector<std::unique_ptr<RedisConnection>> idle;
  Clock::time_point down_until;  // held down while now < down_until
  std::string down_reason;
};

namespace {

constexpr uint32_t kMaxTimeoutMs = 60000;
constexpr uint32_t kMaxRedirects = 64;
constexpr uint32_t kMaxIdlePerNode = 1024;
constexpr uint32_t kMaxDownBackoffMs = 600000;
constexpr size_t kMaxCredentialBytes = 4096;

// Debian's abseil has its own string_view type.
absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

const char kAsking[] = "*1\r\n$6\r\nASKING\r\n";

// What an error reply asks the client to do.
struct ErrorReply {
  enum Kind { kMoved, kAsk, kTryAgain, kClusterDown, kTransient, kOther } kind = kOther;
  uint16_t slot = 0;    // kMoved, kAsk
  std::string address;  // kMoved, kAsk: "host:port"
};

// Classifies an error reply. `from` is the node that sent it: a redirect
// with an empty or "?" host means that node's host.
ErrorReply ClassifyError(absl::string_view text, const std::string& from) {
  ErrorReply error;
  if (absl::StartsWith(text, "MOVED ") || absl::StartsWith(text, "ASK ")) {
    const std::vector<absl::string_view> words = absl::StrSplit(text, ' ', absl::SkipEmpty());
    uint32_t slot = 0;
    if (words.size() != 3 || !absl::SimpleAtoi(words[1], &slot) || slot >= kClusterSlots) {
      return error;  // kOther: reported as INTERNAL with the text
    }
    // ":6380" and "?:6380" name a node whose endpoint is unknown: the
    // replying node's host, on that port.
    absl::string_view address = words[2];
    std::string rebuilt;
    if (absl::StartsWith(address, ":") || absl::StartsWith(address, "?:")) {
      absl::StatusOr<HostPort> replier = ParseHostPort(from);
      if (!replier.ok()) return error;
      rebuilt = absl::StrCat(replier->host, address.substr(address.find(':')));
      address = rebuilt;
    }
    absl::StatusOr<HostPort> target = ParseHostPort(address);
    if (!target.ok()) return error;
    error.kind = words[0] == "MOVED" ? ErrorReply::kMoved : ErrorReply::kAsk;
    error.slot = static_cast<uint16_t>(slot);
    error.address = FormatHostPort(target->host, target->port);
  } else if (absl::StartsWith(text, "TRYAGAIN")) {
    error.kind = ErrorReply::kTryAgain;
  } else if (absl::StartsWith(text, "CLUSTERDOWN")) {
    error.kind = ErrorReply::kClusterDown;
  } else if (absl::StartsWith(text, "LOADING") || absl::StartsWith(text, "BUSY") ||
             absl::StartsWith(text, "MASTERDOWN")) {
    error.kind = ErrorReply::kTransient;
  }
  return error;
}

absl::Status CheckRange(absl::string_view field, uint64_t value, uint64_t low, uint64_t high) {
  if (value >= low && value <= high) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": must be ", low, "..", high, ", got ", value));
}

absl::Status CheckKey(absl::string_view key) {
  if (key.size() <= RedisCluster::kMaxKeyBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("key: ", key.size(), " bytes exceed the limit of ", RedisCluster::kMaxKeyBytes));
}

// "*2\r\n$3\r\nGET\r\n$<n>\r\n<key>\r\n" and the like.
std::string KeyCommand(absl::string_view verb, absl::string_view key) {
  std::string command;
  AppendArrayHeader(2, &command);
  AppendBulk(verb, &command);
  AppendBulk(key, &command);
  return command;
}

absl::Status UnexpectedReply(absl::string_view verb, const std::string& node,
                             const redisReply& reply) {
  return absl::InternalError(absl::StrCat("redis ", node, ": ", verb, ": unexpected reply type ",
                                          reply.type, " \"",
                                          absl::CHexEscape(ReplyText(reply).substr(0, 200)), "\""));
}

}  // namespace

// ---- Construction -----------------------------------------------------------

absl::StatusOr<std::unique_ptr<RedisCluster>> RedisCluster::Create(
    const RedisClusterOptions& options) {
  if (options.seeds.empty()) {
    return absl::InvalidArgumentError("seeds: at least one host:port is required");
  }
  if (options.seeds.size() > kMaxSeeds) {
    return absl::InvalidArgumentError(
        absl::StrCat("seeds: ", options.seeds.size(), " entries exceed the limit of ", kMaxSeeds));
  }
  std::vector<std::string> seeds;
  for (size_t i = 0; i < options.seeds.size(); ++i) {
    absl::StatusOr<HostPort> seed = ParseHostPort(options.seeds[i]);
    if (!seed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("seeds[", i, "]: ", seed.status().message()));
    }
    std::string address = FormatHostPort(seed->host, seed->port);
    if (std::find(seeds.begin(), seeds.end(), address) == seeds.end()) {
      seeds.push_back(std::move(address));
    }
  }
  KVTIER_RETURN_IF_ERROR(
      CheckRange("connect_timeout_ms", options.connect_timeout_ms, 1, kMaxTimeoutMs));
  KVTIER_RETURN_IF_ERROR(
      CheckRange("command_timeout_ms", options.command_timeout_ms, 1, kMaxTimeoutMs));
  KVTIER_RETURN_IF_ERROR(CheckRange("max_redirects", options.max_redirects, 0, kMaxRedirects));
  KVTIER_RETURN_IF_ERROR(CheckRange("max_idle_connections_per_node",
                                    options.max_idle_connections_per_node, 0, kMaxIdlePerNode));
  KVTIER_RETURN_IF_ERROR(
      CheckRange("down_backoff_ms", options.down_backoff_ms, 0, kMaxDownBackoffMs));
  if (options.password.size() > kMaxCredentialBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("password: longer than ", kMaxCredentialBytes, " bytes"));
  }
  if (options.username.size() > kMaxCredentialBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("username: longer than ", kMaxCredentialBytes, " bytes"));
  }
  if (!options.username.empty() && options.password.empty()) {
    return absl::InvalidArgumentError("username: set without a password");
  }
  return std::unique_ptr<RedisCluster>(new RedisCluster(options, std::move(seeds)));
}

RedisCluster::RedisCluster(const RedisClusterOptions& options, std::vector<std::string> seeds)
    : options_(options),
      seeds_(std::move(seeds)),
      dial_options_{options.connect_timeout_ms, options.command_timeout_ms, options.username,
                    options.password, options.read_from_replicas} {}

RedisCluster::~RedisCluster() = default;

uint16_t RedisCluster::KeySlot(std::string_view key) { return KeyHashSlot(key); }

// ---- Commands -----------------------------------------------------------------

absl::StatusOr<bool> RedisCluster::Get(std::string_view key,
                                       absl::FunctionRef<void(std::string_view value)> consume) {
  KVTIER_RETURN_IF_ERROR(CheckKey(AsAbsl(key)));
  const std::string command = KeyCommand("GET", AsAbsl(key));
  const iovec part{const_cast<char*>(command.data()), command.size()};
  KVTIER_ASSIGN_OR_RETURN(Answer answer,
                          Execute("GET", KeyHashSlot(key), absl::MakeConstSpan(&part, 1)));
  if (answer.reply->type == REDIS_REPLY_NIL) return false;
  if (answer.reply->type != REDIS_REPLY_STRING) {
    return UnexpectedReply("GET", answer.node, *answer.reply);
  }
  consume(std::string_view(answer.reply->str, answer.reply->len));
  return true;
}

absl::Status RedisCluster::Set(std::string_view key,
                               absl::Span<const absl::Span<const uint8_t>> pieces,
                               uint64_t ttl_ms) {
  KVTIER_RETURN_IF_ERROR(CheckKey(AsAbsl(key)));
  if (pieces.size() > kMaxValuePieces) {
    return absl::InvalidArgumentError(
        absl::StrCat("value: ", pieces.size(), " pieces exceed the limit of ", kMaxValuePieces));
  }
  uint64_t value_bytes = 0;
  for (const absl::Span<const uint8_t> piece : pieces) {
    value_bytes += piece.size();
    if (value_bytes > kMaxValueBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("value: more than ", kMaxValueBytes, " bytes (the limit)"));
    }
  }
  KVTIER_RETURN_IF_ERROR(CheckRange("ttl_ms", ttl_ms, 0, kMaxTtlMs));

  // SET key <value> [PX ttl]: the value's bytes go out from the pieces.
  std::string head;
  AppendArrayHeader(ttl_ms > 0 ? 5 : 3, &head);
  AppendBulk("SET", &head);
  AppendBulk(AsAbsl(key), &head);
  AppendBulkHeader(value_bytes, &head);
  std::string tail = "\r\n";
  if (ttl_ms > 0) {
    AppendBulk("PX", &tail);
    AppendBulk(absl::StrCat(ttl_ms), &tail);
  }
  std::vector<iovec> parts;
  parts.reserve(pieces.size() + 2);
  parts.push_back({head.data(), head.size()});
  for (const absl::Span<const uint8_t> piece : pieces) {
    parts.push_back({const_cast<uint8_t*>(piece.data()), piece.size()});
  }
  parts.push_back({tail.data(), tail.size()});

  KVTIER_ASSIGN_OR_RETURN(Answer answer, Execute("SET", KeyHashSlot(key), parts));
  if (answer.reply->type != REDIS_REPLY_STATUS || ReplyText(*answer.reply) != "OK") {
    return UnexpectedReply("SET", answer.node, *answer.reply);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> RedisCluster::Del(std::string_view key) { return IntegerCommand("DEL", key); }

absl::StatusOr<bool> RedisCluster::Exists(std::string_view key) {
  return IntegerCommand("EXISTS", key);
}

absl::StatusOr<bool> RedisCluster::IntegerCommand(absl::string_view verb, std::string_view key) {
  KVTIER_RETURN_IF_ERROR(CheckKey(AsAbsl(key)));
  const std::string command = KeyCommand(verb, AsAbsl(key));
  const iovec part{const_cast<char*>(command.data()), command.size()};
  KVTIER_ASSIGN_OR_RETURN(Answer answer,
                          Execute(verb, KeyHashSlot(key), absl::MakeConstSpan(&part, 1)));
  if (answer.reply->type != REDIS_REPLY_INTEGER) {
    return UnexpectedReply(verb, answer.node, *answer.reply);
  }
  return answer.reply->integer > 0;
}

// ---- Routing and redirects ----------------------------------------------------

absl::StatusOr<RedisCluster::Answer> RedisCluster::Execute(absl::string_view verb, uint16_t slot,
                                                           absl::Span<const iovec> command) {
  std::string target;  // empty: ask the slot map
  bool asking = false;
  bool fresh_retry_used = false;
  std::string last;  // what the previous hop ran into, for the final error
  // Redirects and reroutes are hops; the one retry of a stale pooled
  // connection is not.
  uint32_t hops = options_.max_redirects + 1;
  for (uint32_t hop = 0; hop < hops; ++hop) {
    if (target.empty()) {
      KVTIER_ASSIGN_OR_RETURN(target, Route(slot));
    }
    absl::StatusOr<Lease> lease = Acquire(target, /*ignore_down=*/false);
    if (!lease.ok()) {
      if (absl::IsUnavailable(lease.status()) && !asking && Reroute(slot, target)) {
        last = std::string(lease.status().message());
        target.clear();
        continue;
      }
      return lease.status();
    }
    std::unique_ptr<RedisConnection> connection = std::move(lease->connection);

    absl::InlinedVector<iovec, 4> parts;
    if (asking) parts.push_back({const_cast<char*>(kAsking), sizeof(kAsking) - 1});
    parts.insert(parts.end(), command.begin(), command.end());
    absl::Status sent = connection->Send(parts);
    absl::StatusOr<ReplyPtr> reply = sent.ok() ? connection->Read() : sent;
    if (reply.ok() && asking) {
      // The ASKING reply came first; the command's follows. An error
      // answer to ASKING is what we report (after reading the second
      // reply, so that the connection stays in step).
      ReplyPtr asking_reply = std::move(*reply);
      reply = connection->Read();
      if (reply.ok() && asking_reply->type == REDIS_REPLY_ERROR) reply = std::move(asking_reply);
    }

    if (!reply.ok()) {
      const TransportFailure failure = connection->failure();
      connection.reset();  // never pooled again
      if (failure == TransportFailure::kTimeout) stats_.Add(&RedisClusterStats::timeouts);
      if (lease->pooled && failure == TransportFailure::kClosed && !fresh_retry_used) {
        // A stale pooled connection (the node restarted or dropped it):
        // its siblings are likely stale too; try once on a new one.
        DropIdle(target);
        fresh_retry_used = true;
        ++hops;
        last = std::string(reply.status().message());
        continue;
      }
      MarkDown(target, reply.status());
      if (!asking && Reroute(slot, target)) {
        last = std::string(reply.status().message());
        target.clear();
        continue;
      }
      return reply.status();
    }

    if ((*reply)->type != REDIS_REPLY_ERROR) {
      Release(std::move(connection));
      return Answer{std::move(*reply), std::move(target)};
    }
    const absl::string_view text = ReplyText(**reply);
    const ErrorReply error = ClassifyError(text, target);
    Release(std::move(connection));
    switch (error.kind) {
      case ErrorReply::kMoved: {
        stats_.Add(&RedisClusterStats::moved);
        absl::MutexLock lock(&mu_);
        map_.SetMaster(error.slot, error.address);
        map_stale_ = true;
        last = absl::StrCat("MOVED from ", target, " to ", error.address);
        target = error.address;
        asking = false;
        continue;
      }
      case ErrorReply::kAsk:
        stats_.Add(&RedisClusterStats::ask);
        last = absl::StrCat("ASK from ", target, " to ", error.address);
        target = error.address;
        asking = true;
        continue;
      case ErrorReply::kTryAgain: {
        stats_.Add(&RedisClusterStats::try_again);
        last = absl::StrCat("TRYAGAIN from ", target);
        const int64_t wait_ms = std::min<int64_t>(int64_t{10} << std::min<uint32_t>(hop, 4), 100);
        std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
        continue;
      }
      case ErrorReply::kClusterDown: {
        stats_.Add(&RedisClusterStats::errors);
        const absl::Status status =
            absl::UnavailableError(absl::StrCat("redis ", target, ": ", verb, ": ", text));
        MarkDown(target, status);
        Refresh(RefreshMode::kIfDue).IgnoreError();  // failure is recorded in the node state
        return status;
      }
      case ErrorReply::kTransient:
        stats_.Add(&RedisClusterStats::errors);
        return absl::UnavailableError(absl::StrCat("redis ", target, ": ", verb, ": ", text));
      case ErrorReply::kOther:
        stats_.Add(&RedisClusterStats::errors);
        return absl::InternalError(absl::StrCat("redis ", target, ": ", verb, ": ", text));
    }
  }
  return absl::UnavailableError(absl::StrCat("redis: ", verb, " for slot ", slot, " gave up after ",
                                             options_.max_redirects + 1, " hops (max_redirects ",
                                             options_.max_redirects, "); last: ", last));
}

absl::StatusOr<std::string> RedisCluster::Route(uint16_t slot) {
  bool have_map;
  bool stale;
  {
    absl::MutexLock lock(&mu_);
    have_map = has_map_;
    stale = map_stale_;
  }
  if (!have_map || stale) {
    // Without any map there is nothing to route by: wait for a running
    // refresh. With one, route by it and let a due refresh happen.
    Refresh(have_map ? RefreshMode::kIfDue : RefreshMode::kIfDueOrWait).IgnoreError();
  }
  absl::MutexLock lock(&mu_);
  if (!has_map_) {
    return absl::UnavailableError(
        absl::StrCat("redis: no slot map yet: ", last_refresh_status_.message()));
  }
  const std::string* master = map_.MasterOf(slot);
  if (master == nullptr) {
    map_stale_ = true;
    return absl::UnavailableError(
        absl::StrCat("redis: slot ", slot, " is not served by any master in the slot map"));
  }
  return *master;
}

std::string RedisCluster::ReadNode(uint16_t slot, const std::string& master) {
  if (!options_.read_from_replicas) return master;
  const uint64_t turn = read_turn_.fetch_add(1, std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  const std::string* node = map_.ReadNodeOf(slot, turn);
  return node != nullptr ? *node : master;
}

bool RedisCluster::Reroute(uint16_t slot, const std::string& failed) {
  Refresh(RefreshMode::kIfDue).IgnoreError();  // only its effect on the map matters here
  absl::MutexLock lock(&mu_);
  const std::string* master = map_.MasterOf(slot);
  return master != nullptr && *master != failed;
}

// ---- Connections and node states ------------------------------------------------

RedisCluster::Node* RedisCluster::FindOrAddNode(const std::string& address) {
  auto it = nodes_.find(address);
  if (it != nodes_.end()) return it->second.get();
  if (nodes_.size() >= SlotMap::kMaxNodes + kMaxSeeds) return nullptr;
  return nodes_.emplace(address, std::make_unique<Node>()).first->second.get();
}

absl::StatusOr<RedisCluster::Lease> RedisCluster::Acquire(const std::string& address,
                                                          bool ignore_down) {
  {
    absl::MutexLock lock(&mu_);
    Node* node = FindOrAddNode(address);
    if (node != nullptr) {
      const Clock::time_point now = Clock::now();
      if (!ignore_down && now < node->down_until) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(node->down_until - now);
        return absl::UnavailableError(absl::StrCat("redis ", address, ": held down for another ",
                                                   left.count(), " ms after: ", node->down_reason));
      }
      if (!node->idle.empty()) {
        Lease lease{std::move(node->idle.back()), true};
        node->idle.pop_back();
        return lease;
      }
    }
  }
  absl::StatusOr<std::unique_ptr<RedisConnection>> dialed =
      RedisConnection::Dial(address, dial_options_);
  if (!dialed.ok()) {
    if (absl::IsUnavailable(dialed.status())) {
      stats_.Add(&RedisClusterStats::connect_failures);
      MarkDown(address, dialed.status());
    } else {
      stats_.Add(&RedisClusterStats::errors);  // AUTH refused, or a malformed address
    }
    return dialed.status();
  }
  return Lease{std::move(*dialed), false};
}

void RedisCluster::Release(std::unique_ptr<RedisConnection> connection) {
  if (connection == nullptr || connection->broken()) return;
  std::unique_ptr<RedisConnection> doomed;  // closed after the lock is released
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(connection->address());
  if (it == nodes_.end() || Clock::now() < it->second->down_until ||
      it->second->idle.size() >= options_.max_idle_connections_per_node) {
    doomed = std::move(connection);
    return;
  }
  it->second->idle.push_back(std::move(connection));
}

void RedisCluster::MarkDown(const std::string& address, const absl::Status& why) {
  std::vector<std::unique_ptr<RedisConnection>> doomed;
  absl::MutexLock lock(&mu_);
  map_stale_ = true;
  Node* node = FindOrAddNode(address);
  if (node == nullptr) return;
  node->down_until = Clock::now() + std::chrono::milliseconds(options_.down_backoff_ms);
  node->down_reason = std::string(why.message());
  doomed.swap(node->idle);
}

void RedisCluster::DropIdle(const std::string& address) {
  std::vector<std::unique_ptr<RedisConnection>> doomed;
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(address);
  if (it != nodes_.end()) doomed.swap(it->second->idle);
}

// ---- Slot map -------------------------------------------------------------------

absl::Status RedisCluster::RefreshSlotMap() { return Refresh(RefreshMode::kNow); }

absl::Status RedisCluster::Refresh(RefreshMode mode) {
  std::vector<std::string> candidates;
  {
    absl::MutexLock lock(&mu_);
    if (refreshing_) {
      if (mode == RefreshMode::kIfDue) return last_refresh_status_;
      mu_.Await(absl::Condition(
          +[](bool* refreshing) { return !*refreshing; }, &refreshing_));
      if (mode == RefreshMode::kIfDueOrWait) return last_refresh_status_;
    }
    const Clock::time_point now = Clock::now();
    if (mode != RefreshMode::kNow && last_refresh_start_ != Clock::time_point() &&
        now - last_refresh_start_ < kMinRefreshInterval) {
      return last_refresh_status_;
    }
    refreshing_ = true;
    last_refresh_start_ = now;
    // The map's nodes (masters first), then the seeds; nodes held down are
    // skipped, or tried last by kNow.
    std::vector<std::string> all = map_.nodes();
    all.insert(all.end(), seeds_.begin(), seeds_.end());
    std::vector<std::string> down;
    absl::flat_hash_set<std::string> seen;
    for (std::string& address : all) {
      if (!seen.insert(address).second) continue;
      auto it = nodes_.find(address);
      const bool is_down = it != nodes_.end() && now < it->second->down_until;
      (is_down ? down : candidates).push_back(std::move(address));
    }
    if (mode == RefreshMode::kNow) candidates.insert(candidates.end(), down.begin(), down.end());
    if (candidates.empty()) {
      refreshing_ = false;
      last_refresh_status_ = absl::UnavailableError(absl::StrCat(
          "redis: no node to fetch the slot map from: all ", down.size(),
          " known nodes are held down (first: ", down.empty() ? "" : down.front(), ")"));
      return last_refresh_status_;
    }
  }
  absl::Status status =
      FetchSlotMap(candidates, mode == RefreshMode::kNow ? candidates.size() : kMaxRefreshNodes);
  absl::MutexLock lock(&mu_);
  refreshing_ = false;
  last_refresh_status_ = status;
  return status;
}

absl::Status RedisCluster::FetchSlotMap(const std::vector<std::string>& candidates,
                                        size_t max_nodes) {
  std::vector<std::string> failures;
  std::optional<SlotMap> empty_map;  // a node that serves no slot, if nothing better
  for (size_t i = 0; i < candidates.size() && i < max_nodes; ++i) {
    const std::string& address = candidates[i];
    absl::StatusOr<Lease> lease = Acquire(address, /*ignore_down=*/true);
    if (!lease.ok()) {
      failures.push_back(std::string(lease.status().message()));
      continue;
    }
    std::unique_ptr<RedisConnection> connection = std::move(lease->connection);
    absl::StatusOr<ReplyPtr> reply = connection->Command({"CLUSTER", "SLOTS"});
    if (!reply.ok()) {
      if (connection->failure() == TransportFailure::kTimeout)
        stats_.Add(&RedisClusterStats::timeouts);
      connection.reset();
      MarkDown(address, reply.status());
      failures.push_back(std::string(reply.status().message()));
      continue;
    }
    Release(std::move(connection));
    if ((*reply)->type == REDIS_REPLY_ERROR) {
      stats_.Add(&RedisClusterStats::errors);
      failures.push_back(absl::StrCat("redis ", address, ": CLUSTER SLOTS: ", ReplyText(**reply)));
      continue;
    }
    absl::StatusOr<SlotMap> map = SlotMap::FromClusterSlots(**reply, address);
    if (!map.ok()) {
      failures.push_back(std::string(map.status().message()));
      continue;
    }
    if (map->served_slots() == 0) {
      failures.push_back(absl::StrCat("redis ", address, ": CLUSTER SLOTS: no slot is served"));
      if (!empty_map.has_value()) empty_map = std::move(*map);
      continue;
    }
    Install(std::move(*map));
    return absl::OkStatus();
  }
  if (empty_map.has_value()) {
    Install(std::move(*empty_map));
    return absl::OkStatus();
  }
  return absl::UnavailableError(
      absl::StrCat("redis: cannot fetch the slot map: ", absl::StrJoin(failures, "; ")));
}

void RedisCluster::Install(SlotMap map) {
  std::vector<std::unique_ptr<RedisConnection>> doomed;
  absl::MutexLock lock(&mu_);
  map_ = std::move(map);
  has_map_ = true;
  map_stale_ = false;
  stats_.Add(&RedisClusterStats::slot_map_refreshes);
  // Forget nodes neither the map nor the seeds name (their pools go).
  absl::flat_hash_set<std::string> keep(map_.nodes().begin(), map_.nodes().end());
  keep.insert(seeds_.begin(), seeds_.end());
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    if (keep.contains(it->first)) {
      ++it;
      continue;
    }
    for (auto& connection : it->second->idle) doomed.push_back(std::move(connection));
    nodes_.erase(it++);
  }
}

std::vector<std::string> RedisCluster::Masters() const {
  absl::MutexLock lock(&mu_);
  return map_.Masters();
}

std::string RedisCluster::MasterOfSlot(uint16_t slot) const {
  absl::MutexLock lock(&mu_);
  const std::string* master = map_.MasterOf(slot);
  return master == nullptr ? std::string() : *master;
}

RedisClusterStats RedisCluster::stats() const { return stats_.Get(); }

}  // namespace kvtier::remote
