// Key slots, host:port parsing and CLUSTER SLOTS parsing; no server needed.
#include "storage/remote/redis/slot_map.h"

#include <hiredis/hiredis.h>

#include "gtest/gtest.h"
#include "storage/remote/redis/connection.h"
#include "storage/remote/redis/host_port.h"
#include "storage/remote/redis/key_slot.h"
#include "tests/testutil/status_matchers.h"

using ::kvtier::testing::StatusIs;

namespace kvtier::remote {
namespace {

// A reply parsed from RESP text, as the client would receive it.
ReplyPtr Parse(const std::string& resp) {
  redisReader* reader = redisReaderCreate();
  redisReaderFeed(reader, resp.data(), resp.size());
  void* raw = nullptr;
  const int rc = redisReaderGetReply(reader, &raw);
  redisReaderFree(reader);
  EXPECT_EQ(rc, REDIS_OK);
  EXPECT_NE(raw, nullptr) << "incomplete RESP in the test";
  return ReplyPtr(static_cast<redisReply*>(raw));
}

std::string Bulk(const std::string& s) {
  return "$" + std::to_string(s.size()) + "\r\n" + s + "\r\n";
}

TEST(KeySlotTest, MatchesRedisReferenceValues) {
  EXPECT_EQ(Crc16Xmodem("123456789"), 0x31C3);
  EXPECT_EQ(Crc16Xmodem(""), 0);
  // Values from the Redis Cluster specification and CLUSTER KEYSLOT.
  EXPECT_EQ(KeyHashSlot("foo"), 12182);
  EXPECT_EQ(KeyHashSlot("somekey"), 11058);
  EXPECT_EQ(KeyHashSlot("{user1000}.following"), KeyHashSlot("user1000"));
  EXPECT_EQ(KeyHashSlot("{user1000}.followers"), KeyHashSlot("{user1000}.following"));
  // Only the first {...} counts, and an empty one does not.
  EXPECT_EQ(KeyHashSlot("foo{bar}{zap}"), KeyHashSlot("bar"));
  EXPECT_EQ(KeyHashSlot("foo{}{bar}"), Crc16Xmodem("foo{}{bar}") % kClusterSlots);
  EXPECT_EQ(KeyHashSlot("foo{{bar}}zap"), KeyHashSlot("{bar"));
  EXPECT_EQ(KeyHashSlot("{}"), Crc16Xmodem("{}") % kClusterSlots);
  EXPECT_EQ(KeyHashSlot("no close {brace"), Crc16Xmodem("no close {brace") % kClusterSlots);
}

TEST(HostPortTest, ParsesAndRefuses) {
  auto v4 = ParseHostPort("10.0.0.5:7000");
  ASSERT_OK(v4) << v4.status();
  EXPECT_EQ(v4->host, "10.0.0.5");
  EXPECT_EQ(v4->port, 7000);
  auto name = ParseHostPort("redis-0.redis:6379");
  ASSERT_OK(name);
  EXPECT_EQ(name->host, "redis-0.redis");
  auto v6 = ParseHostPort("[::1]:7001");
  ASSERT_OK(v6);
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(FormatHostPort(v6->host, v6->port), "::1:7001");
  for (const char* bad : {"", "x", ":7000", "host:", "host:0", "host:65536", "host:7x", "ho st:1",
                          "host:+1", "host:-1", "host:123456"}) {
    auto parsed = ParseHostPort(bad);
    EXPECT_THAT(parsed.status(), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
    EXPECT_NE(parsed.status().message().find("is not host:port"), absl::string_view::npos);
  }
}

TEST(SlotMapTest, EmptyMapServesNothing) {
  SlotMap map;
  EXPECT_EQ(map.MasterOf(0), nullptr);
  EXPECT_EQ(map.ReadNodeOf(0, 1), nullptr);
  EXPECT_EQ(map.served_slots(), 0);
  EXPECT_TRUE(map.Masters().empty());
}

TEST(SlotMapTest, ParsesRangesMastersFirstAndFillsEmptyEndpoints) {
  // Redis 7 shape: [start, end, [ip, port, id, {metadata}], replica...].
  // The second master has an empty endpoint, its replica a nil one: both
  // mean the host that was asked.
  // clang-format off
  const std::string resp =
      "*2\r\n"
        "*4\r\n:0\r\n:8191\r\n"
          "*4\r\n" + Bulk("10.0.0.1") + ":7000\r\n" + Bulk("id1") + "*0\r\n"
          "*4\r\n" + Bulk("10.0.0.2") + ":7001\r\n" + Bulk("id2") + "*0\r\n"
        "*4\r\n:8192\r\n:16383\r\n"
          "*3\r\n" + Bulk("") + ":7002\r\n" + Bulk("id3") +
          "*3\r\n$-1\r\n:7003\r\n" + Bulk("id4");
  // clang-format on
  ReplyPtr reply = Parse(resp);
  auto map = SlotMap::FromClusterSlots(*reply, "10.9.9.9:7002");
  ASSERT_OK(map) << map.status();
  EXPECT_EQ(map->served_slots(), kClusterSlots);
  ASSERT_NE(map->MasterOf(0), nullptr);
  EXPECT_EQ(*map->MasterOf(0), "10.0.0.1:7000");
  EXPECT_EQ(*map->MasterOf(8191), "10.0.0.1:7000");
  EXPECT_EQ(*map->MasterOf(8192), "10.9.9.9:7002");
  EXPECT_EQ(*map->MasterOf(16383), "10.9.9.9:7002");
  EXPECT_EQ(map->Masters(), (std::vector<std::string>{"10.0.0.1:7000", "10.9.9.9:7002"}));
  EXPECT_EQ(map->nodes(), (std::vector<std::string>{"10.0.0.1:7000", "10.9.9.9:7002",
                                                    "10.0.0.2:7001", "10.9.9.9:7003"}));

  // Reads may cycle over each range's master and replicas.
  std::vector<std::string> reads;
  for (uint64_t spread = 0; spread < 4; ++spread) {
    reads.push_back(*map->ReadNodeOf(100, spread));
    reads.push_back(*map->ReadNodeOf(9000, spread));
  }
  EXPECT_EQ(reads, (std::vector<std::string>{"10.0.0.1:7000", "10.9.9.9:7002", "10.0.0.2:7001",
                                             "10.9.9.9:7003", "10.0.0.1:7000", "10.9.9.9:7002",
                                             "10.0.0.2:7001", "10.9.9.9:7003"}));

  map->SetMaster(8192, "10.0.0.1:7000");
  EXPECT_EQ(*map->MasterOf(8192), "10.0.0.1:7000");
  // A slot moved by MOVED: its replicas are unknown, reads go to the master.
  EXPECT_EQ(*map->ReadNodeOf(8192, 1), "10.0.0.1:7000");
  EXPECT_EQ(*map->ReadNodeOf(8193, 1), "10.9.9.9:7003");
  map->SetMaster(5, "10.0.0.7:7007");  // a node the map did not know
  EXPECT_EQ(*map->MasterOf(5), "10.0.0.7:7007");
  EXPECT_EQ(map->Masters().size(), 3u);
}

TEST(SlotMapTest, PartialCoverageLeavesSlotsWithoutMaster) {
  ReplyPtr reply = Parse("*1\r\n*3\r\n:100\r\n:199\r\n*2\r\n" + Bulk("127.0.0.1") + ":7000\r\n");
  auto map = SlotMap::FromClusterSlots(*reply, "127.0.0.1:7000");
  ASSERT_OK(map) << map.status();
  EXPECT_EQ(map->served_slots(), 100);
  EXPECT_EQ(map->MasterOf(99), nullptr);
  EXPECT_NE(map->MasterOf(100), nullptr);
  EXPECT_EQ(map->MasterOf(200), nullptr);
}

TEST(SlotMapTest, RefusesMalformedReplies) {
  const std::string node = "*2\r\n" + Bulk("127.0.0.1") + ":7000\r\n";
  for (const std::string& resp : std::vector<std::string>{
           "+OK\r\n",
           "*1\r\n*3\r\n:0\r\n:16384\r\n" + node,                     // slot out of range
           "*1\r\n*3\r\n:9\r\n:3\r\n" + node,                         // start > end
           "*1\r\n*2\r\n:0\r\n:10\r\n",                               // no master
           "*1\r\n*3\r\n:0\r\n:10\r\n*2\r\n" + Bulk("h") + ":0\r\n",  // port 0
           "*1\r\n*3\r\n:0\r\n:10\r\n*1\r\n" + Bulk("h"),             // no port
           "*1\r\n*3\r\n" + Bulk("0") + ":10\r\n" + node,             // start not integer
       }) {
    ReplyPtr reply = Parse(resp);
    auto map = SlotMap::FromClusterSlots(*reply, "127.0.0.1:7000");
    EXPECT_THAT(map.status(), StatusIs(absl::StatusCode::kInternal)) << resp;
    EXPECT_NE(map.status().message().find("malformed CLUSTER SLOTS"), absl::string_view::npos)
        << map.status();
  }
}

TEST(RespTest, FormatsCommands) {
  EXPECT_EQ(FormatCommand({"GET", "k"}), "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
  EXPECT_EQ(FormatCommand({"SET", "", std::string("a\0b", 3)}),
            std::string("*3\r\n$3\r\nSET\r\n$0\r\n\r\n$3\r\na\0b\r\n", 28));
}

}  // namespace
}  // namespace kvtier::remote
