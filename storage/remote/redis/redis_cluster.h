// RedisCluster: a Redis Cluster client for values under keys (GET, SET,
// DEL, EXISTS), each command sent to the master serving the key's slot.
// hiredis 0.14 with blocking sockets underneath.
//
//   RedisClusterOptions options;
//   options.seeds = {"10.0.0.5:7000", "10.0.0.6:7000"};
//   KVTIER_ASSIGN_OR_RETURN(auto cluster, RedisCluster::Create(options));
//   KVTIER_RETURN_IF_ERROR(cluster->Set("block:42", {header, payload}));
//   KVTIER_ASSIGN_OR_RETURN(bool found, cluster->Get("block:42",
//       [&](std::string_view value) { /* copy it out */ }));
//
// Model:
//   * Routing: a slot map (slot -> master "host:port") from CLUSTER SLOTS.
//     Create() does no I/O; the first call fetches the map. It is fetched
//     again from any reachable known node (every node of the last map,
//     then the seeds) after a MOVED, a node failure, CLUSTERDOWN or a call
//     for a slot no master serves. These refreshes are rate-limited (one
//     per kMinRefreshInterval, by one thread at a time; the others do not
//     wait) and ask at most kMaxRefreshNodes nodes; RefreshSlotMap()
//     refreshes now and asks every known node.
//   * Redirects, one hop each, at most max_redirects per call, then
//     UNAVAILABLE: MOVED updates that slot in the map (and makes the next
//     call refresh the whole map) and the command goes to the named node.
//     ASK sends ASKING + the command to the named node, map unchanged.
//     TRYAGAIN waits 10, 20, 40 .. ms (at most 100 ms) and sends again.
//   * Failures: a node that refuses or times out a connection, times out a
//     command, closes the connection, or answers CLUSTERDOWN is marked down
//     for down_backoff_ms: not dialled again meanwhile, and calls routed to
//     it fail fast. Such a call fails UNAVAILABLE naming the node, unless
//     a slot-map refresh (rate-limited, as above) shows that another master
//     now serves the slot: then the call goes there (one hop), so calls
//     find a promoted replica by themselves after a failover. A pooled
//     connection found closed (the node restarted) is retried once on a
//     fresh connection before the node counts as down.
//   * Time: a call that cannot finish fails within about
//     (max_redirects + 2) * (connect_timeout_ms + command_timeout_ms) (one
//     hop more for the stale-connection retry), plus one rate-limited
//     refresh (at most kMaxRefreshNodes nodes, each as long again), plus
//     TRYAGAIN waits. Hostnames are resolved (getaddrinfo) outside these
//     limits. The command timeout bounds every wait for the socket to make
//     progress, not a whole transfer (a 512 MiB value may take longer to
//     send; see connection.h).
//   * Connections: per node a pool of at most max_idle_connections_per_node
//     idle connections; a call takes one (or dials a new one, sending AUTH
//     when a password is set) and gives it back after a complete reply. A
//     connection that failed at transport level is closed, never pooled.
//   * Errors: INVALID_ARGUMENT naming the argument over a limit below.
//     UNAVAILABLE, naming the node, for what may go differently later:
//     unreachable or down nodes, timeouts, CLUSTERDOWN, LOADING, BUSY, too
//     many redirects, no slot map yet. PERMISSION_DENIED when AUTH is
//     refused on a new connection (before the first slot map that shows as
//     UNAVAILABLE "no slot map yet: ... AUTH refused"). INTERNAL naming
//     node and text for any other error reply, and for a reply of an
//     unexpected type. A Set or Del that failed UNAVAILABLE may or may not
//     have been applied.
//   * Limits: keys up to kMaxKeyBytes, values up to kMaxValueBytes (Redis's
//     default proto-max-bulk-len) in at most kMaxValuePieces pieces, ttl_ms
//     up to kMaxTtlMs; options as Create() documents. Get trusts the node
//     for the size of what it returns.
//
// Thread safety: every method may be called concurrently from any number
// of threads. One mutex guards the slot map, the connection pools and the
// node states; it is never held during network I/O (dial, send, receive,
// TRYAGAIN waits). Counters sit behind a mutex of their own (LockedStats).
#ifndef KVTIER_STORAGE_REMOTE_REDIS_REDIS_CLUSTER_H_
#define KVTIER_STORAGE_REMOTE_REDIS_REDIS_CLUSTER_H_

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "storage/common/locked_stats.h"
#include "storage/remote/redis/connection.h"
#include "storage/remote/redis/slot_map.h"

namespace kvtier::remote {

struct RedisClusterOptions {
  // "host:port" (IPv4, hostname or [IPv6]), at least one, at most kMaxSeeds.
  std::vector<std::string> seeds;
  // AUTH <password> (AUTH <username> <password> when username is set too)
  // on every new connection when non-empty; at most 4096 bytes each.
  std::string password;
  std::string username;
  uint32_t connect_timeout_ms = 100;  // 1 .. 60000
  uint32_t command_timeout_ms = 250;  // 1 .. 60000
  // MOVED / ASK / TRYAGAIN hops per call before UNAVAILABLE; 0 .. 64.
  uint32_t max_redirects = 5;
  // 0 (no pooling: a connection per call) .. 1024.
  uint32_t max_idle_connections_per_node = 8;
  // A node that failed to connect or timed out is not dialled again for
  // this long; calls routed to it fail fast with UNAVAILABLE (and trigger
  // a rate-limited slot-map refresh). 0 (never held down) .. 600000.
  uint32_t down_backoff_ms = 500;
  // GetMany reads from replicas too: every connection sends READONLY, and
  // each key's GET goes to the next copy of its slot in turn (the master,
  // then each replica the last CLUSTER SLOTS listed), so hot blocks are
  // read from every copy. A replica's nil is confirmed at the master
  // (replication lags), as are its redirects and failures. Off: every
  // read goes to the master.
  bool read_from_replicas = false;
};

struct RedisClusterStats {
  uint64_t moved = 0;               // MOVED redirects followed
  uint64_t ask = 0;                 // ASK redirects followed
  uint64_t try_again = 0;           // TRYAGAIN replies
  uint64_t slot_map_refreshes = 0;  // slot maps fetched and installed
  uint64_t connect_failures = 0;    // dials that failed at transport level
  uint64_t timeouts = 0;            // commands that timed out (not dials)
  uint64_t errors = 0;              // error replies other than redirects
  uint64_t replica_reads = 0;       // GetMany values a replica served
};

class RedisCluster {
 public:
  static constexpr size_t kMaxSeeds = 1024;
  static constexpr size_t kMaxKeyBytes = size_t{64} << 10;
  static constexpr uint64_t kMaxValueBytes = RedisConnection::kMaxValueBytes;
  static constexpr size_t kMaxValuePieces = size_t{1} << 16;
  static constexpr uint64_t kMaxTtlMs = uint64_t{10} * 366 * 24 * 3600 * 1000;  // ~10 years
  static constexpr std::chrono::milliseconds kMinRefreshInterval{100};
  static constexpr int kMaxRefreshNodes = 3;

  // Validates options: INVALID_ARGUMENT naming the field, e.g.
  // `seeds[1]: "x" is not host:port (no ':')`. Does no I/O: the cluster
  // need not be reachable yet.
  static absl::StatusOr<std::unique_ptr<RedisCluster>> Create(const RedisClusterOptions& options);

  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;
  ~RedisCluster();

  // GET key: calls consume(value) once, while the reply is alive (no
  // copy; the view dies when consume returns), and returns true; returns
  // false, without calling consume, when the key does not exist. Errors as
  // in the header comment. consume's own failure is the caller's to record
  // (e.g. in captured state).
  absl::StatusOr<bool> Get(std::string_view key,
                           absl::FunctionRef<void(std::string_view value)> consume);

  // GET of several keys at once: the keys are grouped by the master their
  // slot maps to, and each master gets its GETs pipelined on one
  // connection (at most kMaxPipelinedGets in flight), every master's sent
  // before any reply is read, so the masters work in parallel. Each reply
  // is parsed in the connection's buffer (RedisConnection::ReadValue): no
  // copy before consume. consume(i, value) is called at most once per
  // key, on this thread, in no particular order; result[i] is as Get's.
  // A key whose pipelined reply was not a value or nil (a redirect,
  // TRYAGAIN, an error) or whose node failed mid-pipeline is then asked
  // again alone through Get, with Get's redirects, retries and errors.
  // With read_from_replicas the keys are spread over the masters and
  // their replicas instead, and a replica's nil is asked again too.
  // A pooled connection keeps its receive buffer (the largest reply it
  // read, plus 64 KiB) between calls up to 8 MiB, and frees a larger one.
  static constexpr size_t kMaxPipelinedGets = 16;
  std::vector<absl::StatusOr<bool>> GetMany(
      absl::Span<const std::string> keys,
      absl::FunctionRef<void(size_t index, std::string_view value)> consume);

  // SET key to the concatenation of pieces, sent from the pieces
  // themselves (no concatenated copy is ever made). ttl_ms > 0 adds
  // PX ttl_ms. INVALID_ARGUMENT naming "key", "value" or "ttl_ms" over the
  // limits.
  absl::Status Set(std::string_view key, absl::Span<const absl::Span<const uint8_t>> pieces,
                   uint64_t ttl_ms = 0);

  // DEL key: true if a key was removed.
  absl::StatusOr<bool> Del(std::string_view key);

  // EXISTS key: whether key holds a value (no value is transferred);
  // errors as Get.
  absl::StatusOr<bool> Exists(std::string_view key);

  // Fetches CLUSTER SLOTS now, asking every known node in turn (nodes held
  // down last) until one answers; waits for a refresh already running
  // first. UNAVAILABLE listing what each node answered when none did.
  absl::Status RefreshSlotMap();

  // Masters serving at least one slot in the current map, "host:port",
  // sorted; empty before the first successful refresh.
  std::vector<std::string> Masters() const;

  // The master the current map routes `slot` to; empty when none.
  std::string MasterOfSlot(uint16_t slot) const;

  RedisClusterStats stats() const;

  // CRC16-XMODEM mod 16384 with the {hash tag} rule, exactly as Redis
  // (see key_slot.h).
  static uint16_t KeySlot(std::string_view key);

 private:
  struct Node;  // a node's idle connections and down state
  struct Lease {
    std::unique_ptr<RedisConnection> connection;
    bool pooled = false;  // taken from the pool, not dialled for this call
  };
  struct Answer {
    ReplyPtr reply;    // never an error reply
    std::string node;  // who sent it
  };
  enum class RefreshMode {
    kIfDue,        // skip if one runs now or ran < kMinRefreshInterval ago
    kIfDueOrWait,  // as kIfDue, but wait for a running one
    kNow,          // wait for a running one, then ask every known node
  };

  RedisCluster(const RedisClusterOptions& options, std::vector<std::string> seeds);

  // DEL or EXISTS of one key: true when the integer reply is > 0.
  absl::StatusOr<bool> IntegerCommand(absl::string_view verb, std::string_view key);
  // Sends `command` (formatted RESP) for `slot`, following redirects, and
  // returns the first reply that is not a redirect; error replies become
  // statuses (see the header comment).
  absl::StatusOr<Answer> Execute(absl::string_view verb, uint16_t slot,
                                 absl::Span<const iovec> command);
  // The master the map routes `slot` to; fetches the map first when there
  // is none or it is stale (and a refresh is due).
  absl::StatusOr<std::string> Route(uint16_t slot);
  // After `failed` failed for `slot`: refreshes (if due) and says whether
  // the map now routes `slot` elsewhere.
  bool Reroute(uint16_t slot, const std::string& failed);
  // The node to read `slot` from: `master` unless read_from_replicas picks
  // one of its replicas (SlotMap::ReadNodeOf, the next in turn).
  std::string ReadNode(uint16_t slot, const std::string& master);

  // A pooled connection to `address`, or a new one. UNAVAILABLE when the
  // node is held down (unless ignore_down) or cannot be dialled (which
  // holds it down).
  absl::StatusOr<Lease> Acquire(const std::string& address, bool ignore_down);
  // Back to the pool, or closed when broken, the pool is full or the node
  // is down or unknown.
  void Release(std::unique_ptr<RedisConnection> connection);
  // Holds `address` down for down_backoff_ms, closes its idle connections
  // and makes the next call refresh the map.
  void MarkDown(const std::string& address, const absl::Status& why);
  // Closes the idle connections of `address`.
  void DropIdle(const std::string& address);
  // nullptr when the table is full (the node then gets no pool and no
  // down state).
  Node* FindOrAddNode(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status Refresh(RefreshMode mode);
  // Asks `candidates` in turn for CLUSTER SLOTS, at most max_nodes of them,
  // and installs the first map that serves any slot.
  absl::Status FetchSlotMap(const std::vector<std::string>& candidates, size_t max_nodes);
  void Install(SlotMap map);

  // ---- Constant after construction ----
  const RedisClusterOptions options_;
  const std::vector<std::string> seeds_;  // normalised "host:port"
  const DialOptions dial_options_;

  // ---- Counters ----
  LockedStats<RedisClusterStats> stats_;
  std::atomic<uint64_t> read_turn_{0};  // ReadNode's rotation

  // ---- State below is protected by mu_ ----
  mutable absl::Mutex mu_;
  SlotMap map_ ABSL_GUARDED_BY(mu_);
  bool has_map_ ABSL_GUARDED_BY(mu_) = false;
  // A MOVED or a failure since the map was fetched: refresh when due.
  bool map_stale_ ABSL_GUARDED_BY(mu_) = false;
  bool refreshing_ ABSL_GUARDED_BY(mu_) = false;
  std::chrono::steady_clock::time_point last_refresh_start_ ABSL_GUARDED_BY(mu_);
  absl::Status last_refresh_status_ ABSL_GUARDED_BY(mu_) =
      absl::UnavailableError("redis: the slot map was never fetched");
  // Nodes of the current map, seeds, and nodes named by redirects since
  // the last refresh; at most SlotMap::kMaxNodes + kMaxSeeds entries.
  absl::flat_hash_map<std::string, std::unique_ptr<Node>> nodes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier::remote

#endif  // KVTIER_STORAGE_REMOTE_REDIS_REDIS_CLUSTER_H_
