// RedisCluster against scripted fake nodes: the protocol paths a real
// cluster rarely shows on cue (TRYAGAIN, redirect loops, stalls, closed
// connections, AUTH, unknown endpoints).
#include <chrono>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "storage/remote/redis/redis_cluster.h"
#include "storage/remote/redis/scripted_node.h"
#include "tests/testutil/status_matchers.h"

using ::kvtier::testing::StatusIs;

namespace kvtier::remote {
namespace {

using Argv = std::vector<std::string>;
using Clock = std::chrono::steady_clock;

std::unique_ptr<RedisCluster> Connect(const std::string& seed, RedisClusterOptions options = {}) {
  options.seeds = {seed};
  auto cluster = RedisCluster::Create(options);
  EXPECT_OK(cluster) << cluster.status();
  return cluster.ok() ? std::move(*cluster) : nullptr;
}

absl::StatusOr<std::string> GetString(RedisCluster& cluster, std::string_view key) {
  std::string value;
  absl::StatusOr<bool> found =
      cluster.Get(key, [&](std::string_view v) { value.assign(v.data(), v.size()); });
  if (!found.ok()) return found.status();
  if (!*found) return absl::NotFoundError("no such key");
  return value;
}

bool Contains(const absl::Status& status, std::string_view text) {
  return status.message().find(absl::string_view(text.data(), text.size())) !=
         absl::string_view::npos;
}

// A node that owns every slot (announced with an empty endpoint: "the node
// you asked") and answers GET through `get`.
std::string OwnAllSlots(const Argv& argv, int port) { return ScriptedNode::AllSlotsTo("", port); }

TEST(RedisClusterFakeTest, EmptyEndpointMeansTheNodeAsked) {
  int port = 0;
  ScriptedNode node([&](const Argv& argv) -> std::string {
    if (argv[0] == "CLUSTER") return OwnAllSlots(argv, port);
    return ScriptedNode::Bulk("v");
  });
  port = node.port();
  auto cluster = Connect(node.address());
  ASSERT_OK(cluster->RefreshSlotMap());
  EXPECT_EQ(cluster->Masters(), std::vector<std::string>{node.address()});
  EXPECT_EQ(GetString(*cluster, "k").value_or("error"), "v");
  EXPECT_EQ(cluster->stats().slot_map_refreshes, 1u);
}

TEST(RedisClusterFakeTest, TryAgainIsRetriedWithinTheRedirectBudget) {
  int port = 0;
  int gets = 0;
  ScriptedNode node([&](const Argv& argv) -> std::string {
    if (argv[0] == "CLUSTER") return OwnAllSlots(argv, port);
    if (++gets <= 2) return "-TRYAGAIN Multiple keys request during rehashing of slot\r\n";
    return ScriptedNode::Bulk("after-tryagain");
  });
  port = node.port();
  auto cluster = Connect(node.address());
  EXPECT_EQ(GetString(*cluster, "k").value_or("error"), "after-tryagain");
  EXPECT_EQ(cluster->stats().try_again, 2u);
  EXPECT_EQ(cluster->stats().errors, 0u);
}

TEST(RedisClusterFakeTest, RedirectLoopGivesUpAfterMaxRedirects) {
  int port = 0;
  ScriptedNode node([&](const Argv& argv) -> std::string {
    if (argv[0] == "CLUSTER") return OwnAllSlots(argv, port);
    // Always "it is somewhere else": that is, here again.
    return "-MOVED " + std::to_string(RedisCluster::KeySlot(argv[1])) +
           " 127.0.0.1:" + std::to_string(port) + "\r\n";
  });
  port = node.port();
  RedisClusterOptions options;
  options.max_redirects = 3;
  auto cluster = Connect(node.address(), options);
  const absl::Status status = GetString(*cluster, "loop").status();
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable)) << status;
  EXPECT_TRUE(Contains(status, "max_redirects 3")) << status;
  EXPECT_EQ(cluster->stats().moved, 4u);  // one per hop: 1 + max_redirects
}

TEST(RedisClusterFakeTest, MovedToUnknownEndpointUsesTheRepliersHost) {
  int port_b = 0;
  ScriptedNode b([&](const Argv& argv) -> std::string {
    return argv[0] == "GET" ? ScriptedNode::Bulk("from-b") : "-ERR unexpected\r\n";
  });
  port_b = b.port();
  int port_a = 0;
  ScriptedNode a([&](const Argv& argv) -> std::string {
    if (argv[0] == "CLUSTER") return OwnAllSlots(argv, port_a);
    return "-MOVED " + std::to_string(RedisCluster::KeySlot(argv[1])) + " :" +
           std::to_string(port_b) + "\r\n";
  });
  port_a = a.port();
  auto cluster = Connect(a.address());
  EXPECT_EQ(GetString(*cluster, "k").value_or("error"), "from-b");
  EXPECT_EQ(cluster->MasterOfSlot(RedisCluster::KeySlot("k")), b.address());
}

TEST(RedisClusterFakeTest, StalledNodeTimesOutAndIsHeldDown) {
  int port = 0;
  ScriptedNode node([&](const Argv& argv) -> std::string {
    if (argv[0] == "CLUSTER") return OwnAllSlots(argv, port);
    return ScriptedNode::kNoReply;
  });
  port = node.port();
  RedisClusterOptions options;
  options.command_timeout_ms = 100;
  options.down_backoff_ms = 5000;
  auto cluster = Connect(node.address(), options);
  ASSERT_OK(cluster->RefreshSlotMap());

  auto start = Clock::now();
  absl::Status status = GetString(*cluster, "k").status();
  auto elapsed = Clock::now() - start;
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable)) << status;
  EXPECT_TRUE(Contains(status, node.address())) << status;
  EXPECT_TRUE(Contains(status, "timed out")) << status;
  EXPECT_LT(elapsed, std::chrono::milliseconds(1000));
  EXPECT_EQ(cluster->stats().timeouts, 1u);

  // Held down: the next call fails at once, without dialling.
  const int dialled = node.connections();
  start = Clock::now();
  status = GetString(*cluster, "k").status();
  elapsed = Clock::now() - start;
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable)) << status;
  EXPECT_TRUE(Contains(status, "held down")) << status;
  EXPECT_LT(elapsed, std::chrono::milliseconds(100));  // no timeout waited out
  EXPECT_EQ(node.connections(), dialled);
}

TEST(RedisClusterFakeTest, StalePooledConnectionIsRetriedOnAFreshOne) {
  int port = 0;
  int gets = 0;
  ScriptedNode node([&](const Argv& argv) -> std::string {
    if (argv[0] == "CLUSTER") return OwnAllSlots(argv, port);
    // The second GET finds the pooled connection closed (as after a node
    // restart); the third, on a new connection, is answered.
    if (++gets == 2) return ScriptedNode::kClose;
    return ScriptedNode::Bulk("v" + std::to_string(gets));
  });
  port = node.port();
  RedisClusterOptions options;
  options.max_redirects = 0;  // the retry is not a redirect
  auto cluster = Connect(node.address(), options);
  EXPECT_EQ(GetString(*cluster, "k").value_or("error"), "v1");
  EXPECT_EQ(node.connections(), 1);  // CLUSTER SLOTS and GET shared it
  EXPECT_EQ(GetString(*cluster, "k").value_or("error"), "v3");
  EXPECT_EQ(node.connections(), 2);
  EXPECT_EQ(cluster->stats().connect_failures, 0u);
  EXPECT_EQ(GetString(*cluster, "k").value_or("error"), "v4");  // not held down
}

TEST(RedisClusterFakeTest, ErrorRepliesAreInternalAndKeepTheConnection) {
  int port = 0;
  ScriptedNode node([&](const Argv& argv) -> std::string {
    if (argv[0] == "CLUSTER") return OwnAllSlots(argv, port);
    return "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n";
  });
  port = node.port();
  auto cluster = Connect(node.address());
  for (int i = 0; i < 3; ++i) {
    const absl::Status status = GetString(*cluster, "k").status();
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kInternal)) << status;
    EXPECT_TRUE(Contains(status, "WRONGTYPE")) << status;
    EXPECT_TRUE(Contains(status, node.address())) << status;
  }
  EXPECT_EQ(cluster->stats().errors, 3u);
  EXPECT_EQ(node.connections(), 1);
}

TEST(RedisClusterFakeTest, ClusterDownIsUnavailable) {
  int port = 0;
  ScriptedNode node([&](const Argv& argv) -> std::string {
    if (argv[0] == "CLUSTER") return OwnAllSlots(argv, port);
    return "-CLUSTERDOWN The cluster is down\r\n";
  });
  port = node.port();
  auto cluster = Connect(node.address());
  const absl::Status status = GetString(*cluster, "k").status();
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable)) << status;
  EXPECT_TRUE(Contains(status, "CLUSTERDOWN")) << status;
  // The node is held down now: the next call fails fast saying so.
  const absl::Status again = GetString(*cluster, "k").status();
  EXPECT_THAT(again, StatusIs(absl::StatusCode::kUnavailable)) << again;
  EXPECT_TRUE(Contains(again, "held down")) << again;
}

TEST(RedisClusterFakeTest, AuthIsSentFirstOnEveryConnection) {
  int port = 0;
  ScriptedNode node([&](const Argv& argv) -> std::string {
    if (argv[0] == "AUTH") return argv.back() == "s3cret" ? "+OK\r\n" : "-WRONGPASS invalid\r\n";
    if (argv[0] == "CLUSTER") return OwnAllSlots(argv, port);
    return ScriptedNode::Bulk("v");
  });
  port = node.port();
  RedisClusterOptions options;
  options.username = "kv";
  options.password = "s3cret";
  auto cluster = Connect(node.address(), options);
  EXPECT_EQ(GetString(*cluster, "k").value_or("error"), "v");
  const std::vector<Argv> commands = node.commands();
  ASSERT_GE(commands.size(), 2u);
  EXPECT_EQ(commands[0], (Argv{"AUTH", "kv", "s3cret"}));
  EXPECT_EQ(commands[1], (Argv{"CLUSTER", "SLOTS"}));

  options.password = "not-the-password";
  auto refused = Connect(node.address(), options);
  const absl::Status status = refused->RefreshSlotMap();
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable)) << status;  // no node answered
  EXPECT_TRUE(Contains(status, "AUTH refused")) << status;
  EXPECT_FALSE(Contains(status, "not-the-password")) << "the password leaked into " << status;
  EXPECT_THAT(GetString(*refused, "k").status(), StatusIs(absl::StatusCode::kUnavailable));
}

TEST(RedisClusterFakeTest, SetSendsConcatenatedPiecesAndTtl) {
  int port = 0;
  ScriptedNode node([&](const Argv& argv) -> std::string {
    if (argv[0] == "CLUSTER") return OwnAllSlots(argv, port);
    return "+OK\r\n";
  });
  port = node.port();
  auto cluster = Connect(node.address());
  // More pieces than IOV_MAX (1024), some empty.
  std::vector<std::vector<uint8_t>> buffers;
  std::string expected;
  for (int i = 0; i < 3000; ++i) {
    std::vector<uint8_t> piece(static_cast<size_t>(i % 7), static_cast<uint8_t>(i));
    expected.append(piece.begin(), piece.end());
    buffers.push_back(std::move(piece));
  }
  std::vector<absl::Span<const uint8_t>> pieces(buffers.begin(), buffers.end());
  ASSERT_OK(cluster->Set("key", pieces, 1500));
  ASSERT_OK(cluster->Set("plain", {}));
  const std::vector<Argv> commands = node.commands();
  ASSERT_EQ(commands.size(), 3u);
  EXPECT_EQ(commands[1], (Argv{"SET", "key", expected, "PX", "1500"}));
  EXPECT_EQ(commands[2], (Argv{"SET", "plain", ""}));
}

// ---- GetMany: pipelined GETs ------------------------------------------------

// GetMany's outcome per key: the value, "<nil>" for a missing key, or the
// error's code name.
std::vector<std::string> GetManyStrings(RedisCluster& cluster,
                                        const std::vector<std::string>& keys) {
  std::vector<std::string> values(keys.size());
  std::vector<int> calls(keys.size(), 0);
  std::vector<absl::StatusOr<bool>> found =
      cluster.GetMany(keys, [&](size_t i, std::string_view v) {
        values[i].assign(v.data(), v.size());
        ++calls[i];
      });
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_LE(calls[i], 1) << "consume called twice for " << keys[i];
    if (!found[i].ok()) {
      values[i] = absl::StatusCodeToString(found[i].status().code());
    } else if (!*found[i]) {
      EXPECT_EQ(calls[i], 0);
      values[i] = "<nil>";
    }
  }
  return values;
}

size_t CountGets(const ScriptedNode& node) {
  size_t gets = 0;
  for (const Argv& argv : node.commands()) gets += !argv.empty() && argv[0] == "GET";
  return gets;
}

TEST(RedisClusterFakeTest, GetManyPipelinesOnOneConnection) {
  int port = 0;
  ScriptedNode node([&](const Argv& argv) -> std::string {
    if (argv[0] == "CLUSTER") return OwnAllSlots(argv, port);
    if (argv[1] == "missing") return "$-1\r\n";
    return ScriptedNode::Bulk("value of " + argv[1]);
  });
  port = node.port();
  auto cluster = Connect(node.address());
  std::vector<std::string> keys;
  std::vector<std::string> want;
  for (int i = 0; i < 40; ++i) {  // more than one round of kMaxPipelinedGets
    keys.push_back(i % 7 == 3 ? "missing" : absl::StrCat("k", i));
    want.push_back(i % 7 == 3 ? "<nil>" : absl::StrCat("value of k", i));
  }
  EXPECT_EQ(GetManyStrings(*cluster, keys), want);
  EXPECT_EQ(CountGets(node), keys.size());  // each asked once
  EXPECT_LE(node.connections(), 2);         // the slot map's, and one for all the GETs
}

TEST(RedisClusterFakeTest, GetManyAsksAgainAloneAfterAnErrorReply) {
  int port = 0;
  int tried_b = 0;
  ScriptedNode node([&](const Argv& argv) -> std::string {
    if (argv[0] == "CLUSTER") return OwnAllSlots(argv, port);
    if (argv[1] == "b" && tried_b++ == 0)
      return "-TRYAGAIN Multiple keys request during rehashing\r\n";
    return ScriptedNode::Bulk(argv[1] + argv[1]);
  });
  port = node.port();
  auto cluster = Connect(node.address());
  EXPECT_EQ(GetManyStrings(*cluster, {"a", "b", "c"}),
            (std::vector<std::string>{"aa", "bb", "cc"}));
  EXPECT_EQ(tried_b, 2);  // once in the pipeline, once alone (through Get)
}

TEST(RedisClusterFakeTest, GetManyRecoversFromANodeClosingMidPipeline) {
  int port = 0;
  int gets = 0;
  ScriptedNode node([&](const Argv& argv) -> std::string {
    if (argv[0] == "CLUSTER") return OwnAllSlots(argv, port);
    if (++gets == 3) return ScriptedNode::kClose;  // the third GET ever
    return ScriptedNode::Bulk("v" + argv[1]);
  });
  port = node.port();
  auto cluster = Connect(node.address());
  const std::vector<std::string> keys = {"1", "2", "3", "4", "5"};
  EXPECT_EQ(GetManyStrings(*cluster, keys),
            (std::vector<std::string>{"v1", "v2", "v3", "v4", "v5"}));
}

TEST(RedisClusterFakeTest, GetManyRefusesAReplyThatIsNotAValue) {
  int port = 0;
  ScriptedNode node([&](const Argv& argv) -> std::string {
    if (argv[0] == "CLUSTER") return OwnAllSlots(argv, port);
    if (argv[1] == "odd") return "+OK\r\n";
    if (argv[1] == "huge") return "$999999999999\r\n";
    return ScriptedNode::Bulk("fine");
  });
  port = node.port();
  auto cluster = Connect(node.address());
  // A bad reply breaks the pipelined connection; its key and those after
  // it are asked alone, and Get reports the reply it cannot use.
  EXPECT_EQ(GetManyStrings(*cluster, {"x", "odd", "y"}),
            (std::vector<std::string>{"fine", "INTERNAL", "fine"}));
  // A length past the value limit is refused before anything is allocated
  // for it (Get then times out waiting for the bytes).
  EXPECT_EQ(GetManyStrings(*cluster, {"huge"}), (std::vector<std::string>{"UNAVAILABLE"}));
}

TEST(RedisClusterFakeTest, GetManyRefusesAnOversizedKeyOnly) {
  int port = 0;
  ScriptedNode node([&](const Argv& argv) -> std::string {
    if (argv[0] == "CLUSTER") return OwnAllSlots(argv, port);
    return ScriptedNode::Bulk("ok");
  });
  port = node.port();
  auto cluster = Connect(node.address());
  const std::string big(RedisCluster::kMaxKeyBytes + 1, 'k');
  EXPECT_EQ(GetManyStrings(*cluster, {"a", big, "b"}),
            (std::vector<std::string>{"ok", "INVALID_ARGUMENT", "ok"}));
  EXPECT_EQ(CountGets(node), 2u);
}

// read_from_replicas: READONLY on every connection, the keys' GETs spread
// over the master and its replica, and a key the replica does not have
// yet (replication lag) confirmed at the master. Off: the replica is never
// dialled.
TEST(RedisClusterFakeTest, GetManyReadsReplicasAndConfirmsTheirMisses) {
  int master_port = 0;
  int replica_port = 0;
  auto slots = [&] {
    return absl::StrCat("*1\r\n*4\r\n:0\r\n:16383\r\n*2\r\n", ScriptedNode::Bulk("127.0.0.1"), ":",
                        master_port, "\r\n*2\r\n", ScriptedNode::Bulk("127.0.0.1"), ":",
                        replica_port, "\r\n");
  };
  ScriptedNode master([&](const Argv& argv) -> std::string {
    if (argv[0] == "READONLY") return "+OK\r\n";
    if (argv[0] == "CLUSTER") return slots();
    if (argv[1] == "missing") return "$-1\r\n";
    return ScriptedNode::Bulk("master has " + argv[1]);
  });
  ScriptedNode replica([&](const Argv& argv) -> std::string {
    if (argv[0] == "READONLY") return "+OK\r\n";
    if (argv[0] == "CLUSTER") return slots();
    if (argv[1] == "missing" || argv[1] == "lagging") return "$-1\r\n";
    return ScriptedNode::Bulk("replica has " + argv[1]);
  });
  master_port = master.port();
  replica_port = replica.port();
  std::vector<std::string> keys;
  keys.reserve(13);
  for (int i = 0; i < 10; ++i) keys.push_back(absl::StrCat("k", i));
  keys.push_back("lagging");
  keys.push_back("lagging");  // both copies are asked in turn
  keys.push_back("missing");

  RedisClusterOptions options;
  options.read_from_replicas = true;
  auto cluster = Connect(master.address(), options);
  const std::vector<std::string> got = GetManyStrings(*cluster, keys);
  ASSERT_EQ(got.size(), keys.size());
  size_t from_replica = 0;
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_TRUE(got[i] == "master has " + keys[i] || got[i] == "replica has " + keys[i]) << got[i];
    from_replica += got[i].rfind("replica", 0) == 0;
  }
  EXPECT_EQ(from_replica, 5u);  // every other read, in turn
  EXPECT_EQ(got[10], "master has lagging");
  EXPECT_EQ(got[11], "master has lagging");
  EXPECT_EQ(got[12], "<nil>");
  EXPECT_EQ(cluster->stats().replica_reads, 5u);
  for (const ScriptedNode* node : {&master, &replica}) {
    const std::vector<Argv> commands = node->commands();
    ASSERT_FALSE(commands.empty());
    EXPECT_EQ(commands[0], Argv{"READONLY"});  // first on its first connection
  }

  // Off: every GET goes to the master; the replica is never dialled.
  const int replica_connections = replica.connections();
  auto plain = Connect(master.address());
  const std::vector<std::string> plain_got = GetManyStrings(*plain, keys);
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(plain_got[i], "master has " + keys[i]);
  EXPECT_EQ(replica.connections(), replica_connections);
  EXPECT_EQ(plain->stats().replica_reads, 0u);
}

}  // namespace
}  // namespace kvtier::remote
