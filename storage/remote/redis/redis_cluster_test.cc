// RedisCluster against real redis-server processes (tests/testutil's
// RedisClusterFixture): slots, round trips, MOVED and ASK during slot
// migrations, failover, unreachable seeds, option validation, concurrency.
// Skipped when /usr/bin/redis-server or redis-cli is missing.
#include "storage/remote/redis/redis_cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/testutil/redis_cluster.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

using ::kvtier::testing::StatusIs;

namespace kvtier::remote {
namespace {

using kvtier::testing::RedisClusterFixture;
using kvtier::testing::RedisClusterFixtureOptions;
using kvtier::testing::ScopedTempDir;
using Clock = std::chrono::steady_clock;
using Bytes = std::vector<uint8_t>;

constexpr char kRedisServer[] = "/usr/bin/redis-server";
constexpr char kRedisCli[] = "/usr/bin/redis-cli";

bool HaveRedis() { return ::access(kRedisServer, X_OK) == 0 && ::access(kRedisCli, X_OK) == 0; }

bool Contains(const absl::Status& status, std::string_view text) {
  return status.message().find(absl::string_view(text.data(), text.size())) !=
         absl::string_view::npos;
}

// Deterministic bytes of `size` for `seed` (splitmix64).
Bytes Pattern(size_t size, uint64_t seed) {
  Bytes out(size);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < size; i += 8) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    for (size_t b = 0; b < 8 && i + b < size; ++b) out[i + b] = static_cast<uint8_t>(z >> (8 * b));
  }
  return out;
}

// Set with `value` cut into `cuts` + 1 pieces.
absl::Status SetPieces(RedisCluster& cluster, std::string_view key, const Bytes& value, int cuts,
                       uint64_t ttl_ms = 0) {
  std::vector<absl::Span<const uint8_t>> pieces;
  size_t begin = 0;
  for (int c = 1; c <= cuts + 1; ++c) {
    const size_t end = value.size() * c / (cuts + 1);
    pieces.emplace_back(value.data() + begin, end - begin);
    begin = end;
  }
  return cluster.Set(key, pieces, ttl_ms);
}

absl::StatusOr<Bytes> GetBytes(RedisCluster& cluster, std::string_view key) {
  Bytes value;
  absl::StatusOr<bool> found =
      cluster.Get(key, [&](std::string_view v) { value.assign(v.begin(), v.end()); });
  if (!found.ok()) return found.status();
  if (!*found) return absl::NotFoundError(absl::StrCat("no key ", std::string(key)));
  return value;
}

std::unique_ptr<RedisCluster> NewClient(const std::vector<std::string>& seeds,
                                        RedisClusterOptions options = {}) {
  options.seeds = seeds;
  auto cluster = RedisCluster::Create(options);
  EXPECT_OK(cluster) << cluster.status();
  return cluster.ok() ? std::move(*cluster) : nullptr;
}

// A free loopback port nobody listens on (bound, then closed).
int ClosedPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// ---- No cluster needed ----------------------------------------------------------

TEST(RedisClusterOptionsTest, CreateRefusesBadOptionsNamingTheField) {
  struct Case {
    RedisClusterOptions options;
    std::string field;
  };
  std::vector<Case> cases;
  cases.push_back({RedisClusterOptions{}, "seeds:"});
  RedisClusterOptions o;
  o.seeds = {"127.0.0.1:7000", "x"};
  cases.push_back({o, "seeds[1]: \"x\" is not host:port"});
  o.seeds = {"127.0.0.1:0"};
  cases.push_back({o, "seeds[0]:"});
  o.seeds = {"127.0.0.1:7000"};
  o.connect_timeout_ms = 0;
  cases.push_back({o, "connect_timeout_ms"});
  o.connect_timeout_ms = 100;
  o.command_timeout_ms = 0;
  cases.push_back({o, "command_timeout_ms"});
  o.command_timeout_ms = 250;
  o.max_redirects = 65;
  cases.push_back({o, "max_redirects"});
  o.max_redirects = 5;
  o.username = "user";
  cases.push_back({o, "username"});
  for (const Case& c : cases) {
    auto created = RedisCluster::Create(c.options);
    EXPECT_THAT(created.status(), StatusIs(absl::StatusCode::kInvalidArgument)) << c.field;
    EXPECT_TRUE(Contains(created.status(), c.field)) << created.status();
  }
  o.username.clear();
  EXPECT_OK(RedisCluster::Create(o));
}

TEST(RedisClusterOptionsTest, ArgumentsOverTheLimitsAreRefusedBeforeAnyIo) {
  auto cluster = NewClient({"127.0.0.1:1"});
  const std::string big_key(RedisCluster::kMaxKeyBytes + 1, 'k');
  EXPECT_TRUE(Contains(cluster->Del(big_key).status(), "key:"));
  // 513 MiB of value made of one 1 MiB buffer, never concatenated.
  const Bytes mib(1 << 20, 7);
  std::vector<absl::Span<const uint8_t>> pieces(513, absl::Span<const uint8_t>(mib));
  const absl::Status too_big = cluster->Set("k", pieces);
  EXPECT_THAT(too_big, StatusIs(absl::StatusCode::kInvalidArgument)) << too_big;
  EXPECT_TRUE(Contains(too_big, "value")) << too_big;
  const absl::Status ttl = cluster->Set("k", {}, RedisCluster::kMaxTtlMs + 1);
  EXPECT_THAT(ttl, StatusIs(absl::StatusCode::kInvalidArgument)) << ttl;
  EXPECT_TRUE(Contains(ttl, "ttl_ms")) << ttl;
  EXPECT_EQ(cluster->stats().connect_failures, 0u);  // nothing was dialled
}

TEST(RedisClusterUnreachableTest, ClosedSeedFailsFastWithUnavailable) {
  const std::string seed = absl::StrCat("127.0.0.1:", ClosedPort());
  auto cluster = NewClient({seed});  // Create needs no reachable node
  ASSERT_NE(cluster, nullptr);
  for (int i = 0; i < 3; ++i) {
    const auto start = Clock::now();
    const absl::Status status = GetBytes(*cluster, "k").status();
    EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(500));
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable)) << status;
    EXPECT_TRUE(Contains(status, seed)) << status;
  }
  EXPECT_THAT(cluster->Set("k", {}), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(cluster->Del("k").status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(cluster->stats().connect_failures, 1u);  // held down, rate-limited: dialled once
  EXPECT_TRUE(cluster->Masters().empty());
  EXPECT_THAT(cluster->RefreshSlotMap(), StatusIs(absl::StatusCode::kUnavailable));
}

// ---- One cluster shared by the tests below ------------------------------------

class RedisClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!HaveRedis()) return;
    dir_ = new ScopedTempDir("redis");
    RedisClusterFixtureOptions options;
    options.dir = dir_->path();
    options.masters = 3;
    options.replicas_per_master = 1;
    auto started = RedisClusterFixture::Start(options);
    if (started.ok()) {
      fixture_ = started->release();
    } else {
      start_error_ = new std::string(started.status().ToString());
    }
  }
  static void TearDownTestSuite() {
    delete fixture_;
    fixture_ = nullptr;
    delete dir_;
    dir_ = nullptr;
    delete start_error_;
    start_error_ = nullptr;
  }
  void SetUp() override {
    if (!HaveRedis()) GTEST_SKIP() << kRedisServer << " or " << kRedisCli << " missing";
    ASSERT_NE(fixture_, nullptr) << *start_error_;
  }

  // Two masters: the one serving `slot` and another one.
  std::pair<std::string, std::string> SourceAndTarget(uint16_t slot) {
    auto from = fixture_->MasterOf(slot);
    auto masters = fixture_->Masters();
    EXPECT_OK(from);
    EXPECT_OK(masters);
    for (const std::string& m : *masters) {
      if (m != *from) return {*from, m};
    }
    return {*from, *from};
  }

  static ScopedTempDir* dir_;
  static RedisClusterFixture* fixture_;
  static std::string* start_error_;
};

ScopedTempDir* RedisClusterTest::dir_ = nullptr;
RedisClusterFixture* RedisClusterTest::fixture_ = nullptr;
std::string* RedisClusterTest::start_error_ = nullptr;

TEST_F(RedisClusterTest, KeySlotEqualsClusterKeyslot) {
  std::vector<std::string> keys = {"",
                                   "foo",
                                   "{user1000}.following",
                                   "{user1000}.followers",
                                   "{}",
                                   "{{a}}",
                                   "a{}b{c}",
                                   "{a}{b}",
                                   "}{",
                                   "{",
                                   "}",
                                   "x{y",
                                   std::string("\0{\0}\0", 5),
                                   std::string(1000, '{')};
  for (int i = 0; i < 300; ++i) {
    const Bytes bytes = Pattern(static_cast<size_t>(i % 41), static_cast<uint64_t>(i));
    std::string key(bytes.begin(), bytes.end());
    if (i % 3 == 0) key = absl::StrCat("{tag", i % 7, "}", key);
    if (i % 5 == 0) key = absl::StrCat("block:", i);
    keys.push_back(std::move(key));
  }
  const std::string node = fixture_->Seeds().front();
  for (const std::string& key : keys) {
    auto expected = fixture_->Command(node, {"CLUSTER", "KEYSLOT", key});
    ASSERT_OK(expected) << expected.status();
    EXPECT_EQ(absl::StrCat(RedisCluster::KeySlot(key)), *expected)
        << "key of " << key.size() << " bytes";
  }
}

TEST_F(RedisClusterTest, RoundTripOverAllMasters) {
  auto cluster = NewClient(fixture_->Seeds());
  constexpr int kKeys = 1000;
  std::set<std::string> used_masters;
  for (int i = 0; i < kKeys; ++i) {
    const size_t size = i % 100 == 0  ? (size_t{1} << 20)
                        : i % 10 == 0 ? (size_t{64} << 10) + i
                                      : static_cast<size_t>(i * 37 % 4096);
    const std::string key = absl::StrCat("rt:", i);
    ASSERT_OK(SetPieces(*cluster, key, Pattern(size, i), i % 4)) << key;
    used_masters.insert(cluster->MasterOfSlot(RedisCluster::KeySlot(key)));
  }
  const std::vector<std::string> masters = cluster->Masters();
  EXPECT_EQ(masters.size(), 3u);
  EXPECT_EQ(fixture_->Masters().value_or(std::vector<std::string>{}), masters);
  EXPECT_EQ(std::set<std::string>(masters.begin(), masters.end()), used_masters);

  for (int i = 0; i < kKeys; ++i) {
    const std::string key = absl::StrCat("rt:", i);
    auto value = GetBytes(*cluster, key);
    ASSERT_OK(value) << key << ": " << value.status();
    ASSERT_EQ(*value, Pattern(value->size(), i)) << key;
    const size_t size = i % 100 == 0  ? (size_t{1} << 20)
                        : i % 10 == 0 ? (size_t{64} << 10) + i
                                      : static_cast<size_t>(i * 37 % 4096);
    ASSERT_EQ(value->size(), size) << key;
  }
  // The server holds exactly the bytes (as another client sees them).
  const std::string big = "rt:100";
  EXPECT_EQ(fixture_->Command(cluster->MasterOfSlot(RedisCluster::KeySlot(big)), {"STRLEN", big})
                .value_or("?"),
            absl::StrCat(1 << 20));

  for (int i = 0; i < kKeys; ++i) {
    const std::string key = absl::StrCat("rt:", i);
    ASSERT_EQ(cluster->Exists(key).value_or(false), true) << key;
    ASSERT_EQ(cluster->Del(key).value_or(false), true) << key;
  }
  EXPECT_EQ(cluster->Del("rt:0").value_or(true), false);
  EXPECT_EQ(cluster->Exists("rt:0").value_or(true), false);
  bool called = false;
  EXPECT_EQ(cluster->Get("rt:0", [&](std::string_view) { called = true; }).value_or(true), false);
  EXPECT_FALSE(called);
  EXPECT_EQ(cluster->stats().errors, 0u);
  EXPECT_EQ(cluster->stats().moved, 0u);
}

TEST_F(RedisClusterTest, TtlBecomesPx) {
  auto cluster = NewClient(fixture_->Seeds());
  ASSERT_OK(SetPieces(*cluster, "ttl:key", Pattern(10, 1), 1, 60000));
  auto pttl = fixture_->Command(cluster->MasterOfSlot(RedisCluster::KeySlot("ttl:key")),
                                {"PTTL", "ttl:key"});
  ASSERT_OK(pttl) << pttl.status();
  int64_t ms = 0;
  ASSERT_TRUE(absl::SimpleAtoi(*pttl, &ms)) << *pttl;
  EXPECT_GT(ms, 50000);
  EXPECT_LE(ms, 60000);
}

TEST_F(RedisClusterTest, MovedAfterSlotMigrationIsFollowed) {
  const std::string key = "moved:key";
  const uint16_t slot = RedisCluster::KeySlot(key);
  auto cluster = NewClient(fixture_->Seeds());
  ASSERT_OK(SetPieces(*cluster, key, Pattern(5000, 42), 2));
  const auto [from, to] = SourceAndTarget(slot);
  ASSERT_NE(from, to);
  ASSERT_EQ(cluster->MasterOfSlot(slot), from);

  ASSERT_OK(fixture_->MoveSlot(slot, to, std::chrono::seconds(10)));
  EXPECT_EQ(cluster->MasterOfSlot(slot), from);  // the client has not noticed yet

  auto value = GetBytes(*cluster, key);
  ASSERT_OK(value) << value.status();
  EXPECT_EQ(*value, Pattern(5000, 42));
  EXPECT_GE(cluster->stats().moved, 1u);
  EXPECT_EQ(cluster->MasterOfSlot(slot), to);  // MOVED updated the slot
  // Writes and deletes follow the new owner too.
  ASSERT_OK(SetPieces(*cluster, key, Pattern(7, 43), 0));
  EXPECT_EQ(fixture_->Command(to, {"STRLEN", key}).value_or("?"), "7");
  EXPECT_EQ(cluster->Del(key).value_or(false), true);
}

TEST_F(RedisClusterTest, GetManyMatchesGetAcrossMastersSizesAndMigrations) {
  auto cluster = NewClient(fixture_->Seeds());
  std::vector<std::string> keys;
  std::vector<Bytes> values;  // empty with a missing key
  for (int i = 0; i < 90; ++i) {
    keys.push_back(absl::StrCat("many:", i));
    // Sizes around the reader's 64 KiB chunk and beyond; every 9th missing.
    const size_t size =
        i % 9 == 4 ? 0 : std::vector<size_t>{0, 1, 65534, 65536, 300000, 3 << 20}[i % 6];
    values.push_back(i % 9 == 4 ? Bytes() : Pattern(size, 1000 + i));
    if (i % 9 != 4) ASSERT_OK(SetPieces(*cluster, keys.back(), values.back(), 1));
  }
  // One key's slot moves to another master behind the client's back.
  const uint16_t slot = RedisCluster::KeySlot(keys[7]);
  const auto [from, to] = SourceAndTarget(slot);
  ASSERT_NE(from, to);
  ASSERT_OK(fixture_->MoveSlot(slot, to, std::chrono::seconds(10)));
  const uint64_t moved_before = cluster->stats().moved;

  std::vector<Bytes> got(keys.size());
  std::vector<int> calls(keys.size(), 0);
  std::vector<absl::StatusOr<bool>> found =
      cluster->GetMany(keys, [&](size_t i, std::string_view v) {
        got[i].assign(v.begin(), v.end());
        ++calls[i];
      });
  ASSERT_EQ(found.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_OK(found[i]) << keys[i] << ": " << found[i].status();
    const bool present = i % 9 != 4;
    EXPECT_EQ(*found[i], present) << keys[i];
    EXPECT_EQ(calls[i], present ? 1 : 0) << keys[i];
    if (present) EXPECT_TRUE(got[i] == values[i]) << keys[i] << ": " << got[i].size() << " bytes";
  }
  EXPECT_GT(cluster->stats().moved, moved_before);  // the moved key went through Get
  EXPECT_EQ(cluster->MasterOfSlot(slot), to);
  ASSERT_OK(fixture_->MoveSlot(slot, from, std::chrono::seconds(10)));
  for (const std::string& key : keys) cluster->Del(key).IgnoreError();
}

// read_from_replicas on a real cluster (a replica per master): every
// value comes back intact, replicas serve part of them, and a slot moved
// behind the client's back (its old replica now redirects) still reads.
TEST_F(RedisClusterTest, GetManyFromReplicasReadsEveryValueIntact) {
  RedisClusterOptions options;
  options.read_from_replicas = true;
  auto cluster = NewClient(fixture_->Seeds(), options);
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  for (int i = 0; i < 60; ++i) {
    keys.push_back(absl::StrCat("replica-read:", i));
    values.push_back(Pattern(i % 3 == 0 ? 300000 : 1000 + i, 5000 + i));
    ASSERT_OK(SetPieces(*cluster, keys.back(), values.back(), 1));
  }
  ASSERT_OK(fixture_->WaitForReplication(std::chrono::seconds(10)));
  const uint16_t slot = RedisCluster::KeySlot(keys[5]);
  const auto [from, to] = SourceAndTarget(slot);
  ASSERT_NE(from, to);
  // The client learns the map (with replicas) before the slot moves.
  ASSERT_OK(cluster->RefreshSlotMap());
  ASSERT_OK(fixture_->MoveSlot(slot, to, std::chrono::seconds(10)));

  for (int round = 0; round < 2; ++round) {  // the rotation reaches every copy
    std::vector<Bytes> got(keys.size());
    std::vector<absl::StatusOr<bool>> found = cluster->GetMany(
        keys, [&](size_t i, std::string_view v) { got[i].assign(v.begin(), v.end()); });
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_OK(found[i]) << keys[i] << ": " << found[i].status();
      EXPECT_TRUE(*found[i]) << keys[i];
      EXPECT_TRUE(got[i] == values[i]) << keys[i] << ": " << got[i].size() << " bytes";
    }
  }
  EXPECT_GT(cluster->stats().replica_reads, 0u);
  EXPECT_LT(cluster->stats().replica_reads, 2 * keys.size());
  ASSERT_OK(fixture_->MoveSlot(slot, from, std::chrono::seconds(10)));
  for (const std::string& key : keys) cluster->Del(key).IgnoreError();
}

TEST_F(RedisClusterTest, AskDuringMigrationLeavesTheMapAlone) {
  const std::string key = "ask:key";
  const uint16_t slot = RedisCluster::KeySlot(key);
  ASSERT_NE(slot, RedisCluster::KeySlot("moved:key"));
  auto cluster = NewClient(fixture_->Seeds());
  ASSERT_OK(SetPieces(*cluster, key, Pattern(3000, 7), 1));
  const auto [from, to] = SourceAndTarget(slot);
  ASSERT_NE(from, to);
  const std::string from_id = fixture_->NodeId(from).value_or("");
  const std::string to_id = fixture_->NodeId(to).value_or("");
  const std::string slot_text = absl::StrCat(slot);
  ASSERT_OK(fixture_->Command(to, {"CLUSTER", "SETSLOT", slot_text, "IMPORTING", from_id}));
  ASSERT_OK(fixture_->Command(from, {"CLUSTER", "SETSLOT", slot_text, "MIGRATING", to_id}));
  const size_t colon = to.rfind(':');
  ASSERT_OK(fixture_->Command(
      from, {"MIGRATE", to.substr(0, colon), to.substr(colon + 1), key, "0", "5000"}));

  auto value = GetBytes(*cluster, key);
  ASSERT_OK(value) << value.status();
  EXPECT_EQ(*value, Pattern(3000, 7));
  EXPECT_EQ(cluster->stats().ask, 1u);
  EXPECT_EQ(cluster->stats().moved, 0u);
  EXPECT_EQ(cluster->MasterOfSlot(slot), from);  // ASK does not change the map
  value = GetBytes(*cluster, key);
  ASSERT_OK(value) << value.status();
  EXPECT_EQ(cluster->stats().ask, 2u);

  // A new key of the migrating slot is written on the target, via ASK.
  const std::string fresh = "{ask:key}.fresh";
  ASSERT_EQ(RedisCluster::KeySlot(fresh), slot);
  ASSERT_OK(SetPieces(*cluster, fresh, Pattern(11, 8), 0));
  EXPECT_EQ(cluster->stats().ask, 3u);
  EXPECT_EQ(GetBytes(*cluster, fresh).value_or(Bytes{}), Pattern(11, 8));

  // Finish the migration; the client then follows MOVED to the target.
  ASSERT_OK(fixture_->MoveSlot(slot, to, std::chrono::seconds(10)));
  EXPECT_EQ(GetBytes(*cluster, key).value_or(Bytes{}), Pattern(3000, 7));
  EXPECT_GE(cluster->stats().moved, 1u);
  EXPECT_EQ(cluster->MasterOfSlot(slot), to);
}

TEST_F(RedisClusterTest, RefusedPasswordIsReported) {
  RedisClusterOptions options;
  options.password = "no-password-is-configured";
  auto cluster = NewClient(fixture_->Seeds(), options);
  const absl::Status status = cluster->RefreshSlotMap();
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable)) << status;
  EXPECT_TRUE(Contains(status, "AUTH refused")) << status;
  EXPECT_FALSE(Contains(status, options.password)) << status;
}

// Values say which key and version they are, so concurrent readers can
// check any value they see: "<key>|<writer>|<seq>|" then Pattern bytes
// seeded by that header.
Bytes VersionedValue(const std::string& key, int writer, int seq) {
  const std::string header = absl::StrCat(key, "|", writer, "|", seq, "|");
  const uint64_t seed = std::hash<std::string>()(header);
  Bytes value(header.begin(), header.end());
  const Bytes body = Pattern(static_cast<size_t>(100 + (seq * 131 + writer * 17) % 20000), seed);
  value.insert(value.end(), body.begin(), body.end());
  return value;
}

bool ValidValueFor(const std::string& key, const Bytes& value) {
  const std::string text(value.begin(), value.end());
  const size_t a = text.find('|');
  const size_t b = a == std::string::npos ? a : text.find('|', a + 1);
  const size_t c = b == std::string::npos ? b : text.find('|', b + 1);
  if (c == std::string::npos || text.substr(0, a) != key) return false;
  int writer = 0, seq = 0;
  if (!absl::SimpleAtoi(text.substr(a + 1, b - a - 1), &writer) ||
      !absl::SimpleAtoi(text.substr(b + 1, c - b - 1), &seq)) {
    return false;
  }
  return value == VersionedValue(key, writer, seq);
}

TEST_F(RedisClusterTest, ConcurrentSetGetOnOverlappingKeys) {
  RedisClusterOptions options;
  options.max_idle_connections_per_node = 4;  // fewer than threads: dial and drop too
  auto cluster = NewClient(fixture_->Seeds(), options);
  constexpr int kThreads = 8;
  constexpr int kOps = 300;
  constexpr int kKeys = 24;
  std::atomic<int> failures{0};
  std::atomic<int> reads_found{0};
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 random(static_cast<uint32_t>(t));
      for (int op = 0; op < kOps; ++op) {
        const std::string key = absl::StrCat("cc:", random() % kKeys);
        if (random() % 2 == 0) {
          const absl::Status s = SetPieces(*cluster, key, VersionedValue(key, t, op), op % 3);
          if (!s.ok()) {
            failures.fetch_add(1);
            errors[t] = s.ToString();
          }
          continue;
        }
        auto value = GetBytes(*cluster, key);
        if (value.ok()) {
          reads_found.fetch_add(1);
          if (!ValidValueFor(key, *value)) {
            failures.fetch_add(1);
            errors[t] = "corrupt value for " + key;
          }
        } else if (!absl::IsNotFound(value.status())) {
          failures.fetch_add(1);
          errors[t] = value.status().ToString();
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0) << absl::StrJoin(errors, "; ");
  EXPECT_GT(reads_found.load(), kThreads * kOps / 4);
  for (int k = 0; k < kKeys; ++k) {
    const std::string key = absl::StrCat("cc:", k);
    auto value = GetBytes(*cluster, key);
    ASSERT_OK(value) << key << ": " << value.status();
    EXPECT_TRUE(ValidValueFor(key, *value)) << key;
  }
  EXPECT_EQ(cluster->stats().errors, 0u);
  EXPECT_EQ(cluster->stats().timeouts, 0u);
}

// ---- Failover: a cluster of its own ------------------------------------------

TEST(RedisClusterFailoverTest, KilledMasterFailsFastThenItsReplicaServes) {
  if (!HaveRedis()) GTEST_SKIP() << kRedisServer << " or " << kRedisCli << " missing";
  const ScopedTempDir dir("redis");
  RedisClusterFixtureOptions fixture_options;
  fixture_options.dir = dir.path();
  fixture_options.masters = 3;
  fixture_options.replicas_per_master = 1;
  fixture_options.node_timeout_ms = 1000;
  // The other masters keep serving while the dead one's slots are orphaned.
  fixture_options.require_full_coverage = false;
  auto fixture = RedisClusterFixture::Start(fixture_options);
  ASSERT_OK(fixture) << fixture.status();

  auto cluster = NewClient((*fixture)->Seeds());
  constexpr int kKeys = 300;
  auto key_of = [](int i) { return absl::StrCat("fo:", i); };
  for (int i = 0; i < kKeys; ++i) {
    ASSERT_OK(SetPieces(*cluster, key_of(i), Pattern(1000 + i, i), 1));
  }
  ASSERT_OK((*fixture)->WaitForReplication(std::chrono::seconds(10)));

  const uint16_t slot = RedisCluster::KeySlot(key_of(0));
  const std::string victim = cluster->MasterOfSlot(slot);
  ASSERT_EQ((*fixture)->MasterOf(slot).value_or(""), victim);
  std::vector<int> victim_keys, other_keys;
  for (int i = 0; i < kKeys; ++i) {
    (cluster->MasterOfSlot(RedisCluster::KeySlot(key_of(i))) == victim ? victim_keys : other_keys)
        .push_back(i);
  }
  ASSERT_FALSE(victim_keys.empty());
  ASSERT_FALSE(other_keys.empty());

  ASSERT_OK((*fixture)->Kill(victim));
  // Right after the kill no replica has taken over (that takes at least
  // node_timeout_ms): the victim's keys fail UNAVAILABLE naming it, fast;
  // everyone else's keys are still served.
  auto timed_get = [&](int i) {
    const auto start = Clock::now();
    absl::StatusOr<Bytes> value = GetBytes(*cluster, key_of(i));
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(2)) << key_of(i);
    return value;
  };
  const absl::Status first = timed_get(victim_keys[0]).status();
  EXPECT_THAT(first, StatusIs(absl::StatusCode::kUnavailable)) << first;
  EXPECT_TRUE(Contains(first, victim)) << first;
  for (int i : victim_keys) {
    absl::StatusOr<Bytes> value = timed_get(i);
    if (value.ok()) {
      EXPECT_EQ(*value, Pattern(1000 + i, i));  // failover already done: right bytes
    } else {
      EXPECT_THAT(value.status(), StatusIs(absl::StatusCode::kUnavailable)) << value.status();
    }
  }
  for (int i : other_keys) {
    absl::StatusOr<Bytes> value = timed_get(i);
    ASSERT_OK(value) << key_of(i) << ": " << value.status();
    EXPECT_EQ(*value, Pattern(1000 + i, i));
  }
  EXPECT_GE(cluster->stats().connect_failures, 1u);

  ASSERT_OK((*fixture)->WaitForFailover(slot, victim, std::chrono::seconds(20)));
  const std::string promoted = (*fixture)->MasterOf(slot).value_or("");
  ASSERT_NE(promoted, victim);

  // The client finds the promoted replica by itself (a rate-limited
  // refresh when a call meets the dead node); poll until it has.
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  absl::StatusOr<Bytes> value = timed_get(victim_keys[0]);
  while (!value.ok() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    value = timed_get(victim_keys[0]);
  }
  ASSERT_OK(value) << value.status();
  EXPECT_EQ(cluster->MasterOfSlot(slot), promoted);
  for (int i = 0; i < kKeys; ++i) {
    absl::StatusOr<Bytes> v = timed_get(i);
    ASSERT_OK(v) << key_of(i) << ": " << v.status();
    EXPECT_EQ(*v, Pattern(1000 + i, i)) << key_of(i);
  }
  const std::vector<std::string> masters = cluster->Masters();
  EXPECT_EQ(masters.size(), 3u);
  EXPECT_EQ(std::count(masters.begin(), masters.end(), victim), 0);
}

}  // namespace
}  // namespace kvtier::remote
