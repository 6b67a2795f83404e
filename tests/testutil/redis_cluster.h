// RedisClusterFixture: a real Redis Cluster for tests, made of redis-server
// child processes on 127.0.0.1 (no persistence), joined with
// `redis-cli --cluster create` and waited for until it serves every slot.
// Nodes can be killed one by one to test failover; all die with the
// fixture.
//
//   RedisClusterFixtureOptions options;
//   options.dir = temp_dir;  // one subdirectory per node, logs included
//   auto cluster = RedisClusterFixture::Start(options);
//   RedisClusterOptions client;
//   client.seeds = (*cluster)->Seeds();
//
// Children get PR_SET_PDEATHSIG(SIGKILL), which Linux ties to the thread
// that forked them: call Start() from a thread that outlives the fixture
// (the test's main thread), or the nodes die with the thread.
//
// Node names are "127.0.0.1:<port>", as Seeds() and CLUSTER SLOTS give them.
//
// Thread safety: every method may be called concurrently (the node table
// is under a mutex; Command() dials a connection of its own per call),
// except that nothing may run concurrently with the destructor.
#ifndef KVTIER_TESTS_TESTUTIL_REDIS_CLUSTER_H_
#define KVTIER_TESTS_TESTUTIL_REDIS_CLUSTER_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace kvtier::testing {

struct RedisClusterFixtureOptions {
  std::string dir;                  // existing working dir (the caller's temp dir); required
  int masters = 3;                  // 3 .. 16 (redis-cli --cluster create needs 3)
  int replicas_per_master = 1;      // 0 .. 4
  uint32_t node_timeout_ms = 1000;  // cluster-node-timeout
  // cluster-require-full-coverage: with false, the masters left keep
  // serving their slots while a failed master's slots have no owner.
  bool require_full_coverage = true;
  std::string redis_server = "/usr/bin/redis-server";
  std::string redis_cli = "/usr/bin/redis-cli";
  std::chrono::milliseconds ready_timeout{20000};
};

class RedisClusterFixture {
 public:
  // Starts masters * (1 + replicas_per_master) redis-server children, each
  // on a free 127.0.0.1 port P <= 55535 whose cluster bus port P + 10000 is
  // free too (a port lost to a race is retried, 3 times per node), with
  // cluster-enabled yes, --save "" --appendonly no, nodes.conf and log in
  // <dir>/node-<i>/; runs `redis-cli --cluster create ... --cluster-replicas
  // R --cluster-yes`; and returns once every node reports cluster_state:ok
  // and 16384 slots ok, every node's CLUSTER SLOTS covers all slots with
  // 1 + R nodes per range, and every replica's link to its master is up.
  // INVALID_ARGUMENT for bad options; FAILED_PRECONDITION when a binary is
  // missing; DEADLINE_EXCEEDED (what was not ready, with the tails of the
  // logs) when ready_timeout passes; the children are killed on failure.
  static absl::StatusOr<std::unique_ptr<RedisClusterFixture>> Start(
      const RedisClusterFixtureOptions& options);

  RedisClusterFixture(const RedisClusterFixture&) = delete;
  RedisClusterFixture& operator=(const RedisClusterFixture&) = delete;
  ~RedisClusterFixture();  // SIGKILL and reap every child still running

  // "127.0.0.1:<port>" of every node started, killed ones included.
  std::vector<std::string> Seeds() const;

  // The master serving `slot`, as a live node's CLUSTER SLOTS says.
  // NOT_FOUND when no range covers it; UNAVAILABLE when no live node
  // answers.
  absl::StatusOr<std::string> MasterOf(uint16_t slot);

  // Masters serving at least one slot, sorted, as a live node's CLUSTER
  // SLOTS says.
  absl::StatusOr<std::vector<std::string>> Masters();

  // CLUSTER MYID of `node`.
  absl::StatusOr<std::string> NodeId(const std::string& node);

  // SIGKILLs that node's process and reaps it. NOT_FOUND for a node that
  // is not a running child of this fixture.
  absl::Status Kill(const std::string& node);

  // Polls the live nodes until every one of them reports cluster_state:ok
  // and says `slot` is served by the same live master, other than
  // old_master. DEADLINE_EXCEEDED with the last observation otherwise.
  absl::Status WaitForFailover(uint16_t slot, const std::string& old_master,
                               std::chrono::milliseconds timeout);

  // Waits until every live replica has applied everything its master had
  // written when the call began (slave_repl_offset >= the master's
  // master_repl_offset then) and its link is up; the polling equivalent of
  // WAIT for writes made on other connections. DEADLINE_EXCEEDED naming
  // the replica that lags.
  absl::Status WaitForReplication(std::chrono::milliseconds timeout);

  // Moves `slot` (and every key in it) from its master to the master `to`
  // the way redis-cli --cluster reshard does (SETSLOT IMPORTING on `to`,
  // MIGRATING on the source, MIGRATE the keys, SETSLOT NODE on every
  // master), then waits up to `timeout` until every live node says `to`
  // serves it.
  absl::Status MoveSlot(uint16_t slot, const std::string& to, std::chrono::milliseconds timeout);

  // One command on one node (a connection of its own, 1 s to connect, 10 s
  // per reply), the reply rendered as text: string and status replies as
  // their bytes, integers in decimal, arrays as their rendered elements
  // joined by '\n' (nil elements as ""). A nil reply is NOT_FOUND, an
  // error reply INTERNAL with its text, an unreachable node UNAVAILABLE.
  absl::StatusOr<std::string> Command(const std::string& node,
                                      const std::vector<std::string>& argv);

 private:
  struct Node {
    std::string address;  // "127.0.0.1:<port>"
    int port = 0;
    pid_t pid = -1;  // -1 once reaped
    std::string dir;
    std::string log_path;
  };

  explicit RedisClusterFixture(RedisClusterFixtureOptions options) : options_(std::move(options)) {}

  absl::Status StartNodes();
  absl::Status CreateCluster();
  // Empty when the cluster is ready, else what is not.
  std::string NotReadyReason();
  std::vector<std::string> LiveNodes() const;
  std::string LogTails() const;

  const RedisClusterFixtureOptions options_;
  mutable absl::Mutex mu_;
  std::vector<Node> nodes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTUTIL_REDIS_CLUSTER_H_
