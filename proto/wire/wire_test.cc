// The wire-format readers and writers against libprotobuf: messages
// libprotobuf serialises parse to the same values when split into pieces
// at every byte, heads written here parse with libprotobuf, and malformed
// bytes are refused with the field and offset named.
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/v1/kvtier.pb.h"
#include "proto/wire/block_messages.h"
#include "tests/testutil/status_matchers.h"

using ::kvtier::testing::StatusIs;

namespace kvtier::wire {
namespace {

Bytes AsBytes(std::string_view s) {
  return Bytes(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

std::string Join(const std::vector<Bytes>& ranges) {
  std::string out;
  for (const Bytes& b : ranges) out.append(reinterpret_cast<const char*>(b.data()), b.size());
  return out;
}

// `s` cut at the given offsets (sorted, within s).
std::vector<Bytes> Cut(const std::string& s, std::vector<size_t> cuts) {
  std::vector<Bytes> pieces;
  size_t from = 0;
  for (size_t c : cuts) {
    pieces.push_back(AsBytes(std::string_view(s).substr(from, c - from)));
    from = c;
  }
  pieces.push_back(AsBytes(std::string_view(s).substr(from)));
  return pieces;
}

std::string Payload(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

v1::PutBlocksRequest SampleRequest() {
  v1::PutBlocksRequest req;
  req.set_profile_id(0x123456789ULL);
  req.set_durable(true);
  req.set_retain(true);
  v1::BlockPut* a = req.add_blocks();
  a->set_block_id("block-a");
  a->set_data(Payload(300, 1));
  a->set_xxh3(~0ULL);
  v1::BlockPut* b = req.add_blocks();
  b->set_block_id(std::string(32, '\xff'));
  b->mutable_slot()->set_slot_id(7);
  b->mutable_slot()->set_offset_bytes(1ULL << 40);
  b->mutable_slot()->set_size_bytes(4096);
  b->mutable_slot()->set_generation(3);
  req.add_blocks()->set_block_id("no-source");
  v1::BlockPut* d = req.add_blocks();
  d->set_block_id("empty");
  d->set_data("");
  return req;
}

void ExpectSame(const v1::PutBlocksRequest& want, const PutBlocksView& got) {
  EXPECT_EQ(got.profile_id, want.profile_id());
  EXPECT_EQ(got.durable, want.durable());
  EXPECT_EQ(got.retain, want.retain());
  ASSERT_EQ(got.blocks.size(), static_cast<size_t>(want.blocks_size()));
  for (int i = 0; i < want.blocks_size(); ++i) {
    const v1::BlockPut& w = want.blocks(i);
    const BlockPutView& g = got.blocks[i];
    EXPECT_EQ(g.block_id, w.block_id()) << i;
    EXPECT_EQ(g.xxh3, w.xxh3()) << i;
    switch (w.source_case()) {
      case v1::BlockPut::kData:
        ASSERT_EQ(g.source, BlockPutView::Source::kData) << i;
        EXPECT_EQ(g.data_size, w.data().size()) << i;
        EXPECT_EQ(Join(g.data), w.data()) << i;
        break;
      case v1::BlockPut::kSlot:
        ASSERT_EQ(g.source, BlockPutView::Source::kSlot) << i;
        EXPECT_EQ(g.slot.slot_id, w.slot().slot_id());
        EXPECT_EQ(g.slot.offset_bytes, w.slot().offset_bytes());
        EXPECT_EQ(g.slot.size_bytes, w.slot().size_bytes());
        EXPECT_EQ(g.slot.generation, w.slot().generation());
        break;
      default:
        EXPECT_EQ(g.source, BlockPutView::Source::kNone) << i;
    }
  }
}

TEST(WireTest, PutBlocksParsesAsLibprotobufAtEveryCut) {
  const v1::PutBlocksRequest req = SampleRequest();
  const std::string bytes = req.SerializeAsString();
  for (size_t a = 0; a <= bytes.size(); ++a) {
    for (size_t b : {a, (a + 1 <= bytes.size() ? a + 1 : a), bytes.size()}) {
      PutBlocksView got;
      ASSERT_OK(ParsePutBlocks(Cut(bytes, {a, b}), 100, "max", &got)) << a << "," << b;
      ExpectSame(req, got);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(WireTest, PutBlocksFollowsLastValueOneofAndMergeRules) {
  // Built by concatenating serialised messages: libprotobuf merges them.
  v1::PutBlocksRequest first, second;
  first.set_profile_id(5);
  v1::BlockPut* b1 = first.add_blocks();
  b1->set_block_id("x");
  b1->mutable_slot()->set_slot_id(1);
  b1->mutable_slot()->set_generation(9);
  second.set_profile_id(6);
  second.set_durable(true);
  const std::string bytes = first.SerializeAsString() + second.SerializeAsString();
  v1::PutBlocksRequest merged;
  ASSERT_TRUE(merged.ParseFromString(bytes));
  PutBlocksView got;
  ASSERT_OK(ParsePutBlocks(Cut(bytes, {}), 100, "max", &got));
  ExpectSame(merged, got);

  // Inside one BlockPut: data then slot keeps the slot; slot then slot
  // merges; slot then data keeps the data.
  v1::BlockPut data_then_slot, slot_a, slot_b, data_last;
  data_then_slot.set_data("abc");
  slot_a.mutable_slot()->set_slot_id(4);
  slot_b.mutable_slot()->set_offset_bytes(8);
  data_last.set_data("zz");
  for (const std::vector<const v1::BlockPut*>& parts :
       std::vector<std::vector<const v1::BlockPut*>>{
           {&data_then_slot, &slot_a, &slot_b}, {&slot_a, &data_last}, {&slot_a, &slot_b}}) {
    std::string inner;
    for (const v1::BlockPut* p : parts) inner += p->SerializeAsString();
    std::string msg;
    AppendLengthKey(2, inner.size(), &msg);
    msg += inner;
    v1::PutBlocksRequest want;
    ASSERT_TRUE(want.ParseFromString(msg));
    ASSERT_OK(ParsePutBlocks(Cut(msg, {msg.size() / 2}), 100, "max", &got));
    ExpectSame(want, got);
  }
}

TEST(WireTest, UnknownFieldsAreSkipped) {
  std::string msg;
  AppendVarintField(1, 42, &msg);
  AppendVarintField(99, 7, &msg);  // varint
  AppendKey(100, kFixed64, &msg);
  msg.append(8, 'x');
  AppendKey(101, kFixed32, &msg);
  msg.append(4, 'y');
  AppendBytesField(102, "skipped", &msg);
  std::string block;
  AppendBytesField(1, "id", &block);
  AppendBytesField(77, "unknown inside", &block);
  AppendBytesField(2, "payload", &block);
  AppendBytesField(2, block, &msg);
  v1::PutBlocksRequest want;
  ASSERT_TRUE(want.ParseFromString(msg));
  PutBlocksView got;
  ASSERT_OK(ParsePutBlocks(Cut(msg, {3, 9}), 100, "max", &got));
  ExpectSame(want, got);
}

TEST(WireTest, HeadsWrittenHereParseWithLibprotobuf) {
  const std::string p1 = Payload(1000, 2), p2 = Payload(0, 3);
  std::string msg = PutBlocksHead(77, false, true);
  msg += BlockPutHead("first", 0xdeadbeef, p1.size()) + p1;
  msg += BlockPutHead("second", 0, p2.size()) + p2;
  v1::PutBlocksRequest got;
  ASSERT_TRUE(got.ParseFromString(msg));
  EXPECT_EQ(got.profile_id(), 77u);
  EXPECT_FALSE(got.durable());
  EXPECT_TRUE(got.retain());
  ASSERT_EQ(got.blocks_size(), 2);
  EXPECT_EQ(got.blocks(0).block_id(), "first");
  EXPECT_EQ(got.blocks(0).xxh3(), 0xdeadbeefu);
  EXPECT_EQ(got.blocks(0).data(), p1);
  EXPECT_EQ(got.blocks(1).block_id(), "second");
  EXPECT_EQ(got.blocks(1).source_case(), v1::BlockPut::kData);
  EXPECT_EQ(got.blocks(1).data(), "");
}

TEST(WireTest, MalformedPutBlocksNamesWhatAndWhere) {
  struct Case {
    std::string bytes;
    std::string expect;
  };
  std::string wrong_type;
  AppendKey(1, kLengthDelimited, &wrong_type);
  AppendVarint(0, &wrong_type);
  std::string long_length;
  AppendLengthKey(2, 1000, &long_length);
  long_length += "short";
  std::string bad_inner;
  std::string inner;
  AppendKey(2, kVarint, &inner);  // data as a varint
  AppendVarint(1, &inner);
  AppendBytesField(2, inner, &bad_inner);
  std::string group;
  AppendKey(5, kStartGroup, &group);
  std::string long_id;
  std::string id_block;
  AppendBytesField(1, std::string(kMaxCopiedFieldBytes + 1, 'i'), &id_block);
  AppendBytesField(2, id_block, &long_id);
  const std::vector<Case> cases = {
      {std::string("\x08\xff\xff\xff", 4), "at byte 4: truncated varint"},
      {wrong_type, "profile_id: wire type 2, expected 0"},
      {long_length, "length 1000 runs past the end"},
      {bad_inner, "blocks[0].data: wire type 0, expected 2"},
      {group, "groups are not supported"},
      {std::string("\x00", 1), "field number 0"},
      {long_id, "block_id: 4097 bytes, at most 4096"},
      {std::string(11, '\xff'), "varint"},
  };
  for (const Case& c : cases) {
    PutBlocksView got;
    absl::Status st = ParsePutBlocks(Cut(c.bytes, {}), 100, "max", &got);
    EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument)) << c.expect;
    EXPECT_NE(st.message().find(c.expect), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("not a PutBlocksRequest"), std::string::npos) << st.message();
  }
}

TEST(WireTest, PutBlocksRefusesMoreBlocksThanAllowed) {
  v1::PutBlocksRequest req;
  for (int i = 0; i < 4; ++i) req.add_blocks()->set_block_id("b");
  const std::string bytes = req.SerializeAsString();
  PutBlocksView got;
  EXPECT_OK(ParsePutBlocks(Cut(bytes, {}), 4, "max", &got));
  absl::Status st = ParsePutBlocks(Cut(bytes, {}), 3, "max", &got);
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(st.message().find("blocks: more than max = 3"), std::string::npos) << st.message();
}

TEST(WireTest, GetBlocksResponseParsesAsLibprotobufAtEveryCut) {
  v1::GetBlocksResponse resp;
  resp.set_lease_id(99);
  v1::BlockResult* a = resp.add_results();
  a->set_block_id("a");
  a->set_tier(v1::TIER_HOST);
  a->set_data(Payload(200, 4));
  v1::BlockResult* b = resp.add_results();
  b->set_block_id("b");
  b->mutable_status()->set_code(5);
  b->mutable_status()->set_message("not found: b");
  v1::BlockResult* c = resp.add_results();
  c->set_block_id("c");
  c->mutable_status()->set_code(-1);  // a negative int32 takes ten bytes
  c->mutable_handle()->set_offset_bytes(4096);
  c->mutable_compacted();
  c->mutable_compacted()->set_version(2);
  const std::string bytes = resp.SerializeAsString();
  for (size_t cut = 0; cut <= bytes.size(); ++cut) {
    GetBlocksView got;
    ASSERT_OK(ParseGetBlocksResponse(Cut(bytes, {cut}), &got)) << cut;
    EXPECT_EQ(got.lease_id, 99u);
    ASSERT_EQ(got.results.size(), 3u);
    EXPECT_EQ(got.results[0].block_id, "a");
    EXPECT_EQ(got.results[0].tier, v1::TIER_HOST);
    EXPECT_EQ(got.results[0].data_size, 200u);
    EXPECT_EQ(Join(got.results[0].data), a->data());
    EXPECT_EQ(got.results[1].status_code, 5);
    EXPECT_EQ(got.results[1].status_message, "not found: b");
    EXPECT_EQ(got.results[1].data_size, 0u);
    EXPECT_EQ(got.results[2].status_code, -1);
    EXPECT_TRUE(got.results[2].has_handle);
    EXPECT_TRUE(got.results[2].has_compacted);
    EXPECT_FALSE(got.results[0].has_handle);
  }
  // Responses accumulate, and truncation is refused.
  GetBlocksView two;
  ASSERT_OK(ParseGetBlocksResponse(Cut(bytes, {}), &two));
  ASSERT_OK(ParseGetBlocksResponse(Cut(bytes, {}), &two));
  EXPECT_EQ(two.results.size(), 6u);
  GetBlocksView cut_short;
  absl::Status st = ParseGetBlocksResponse(Cut(bytes.substr(0, bytes.size() - 1), {}), &cut_short);
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(st.message().find("not a GetBlocksResponse"), std::string::npos) << st.message();
}

TEST(WireTest, VarintSizesMatchWhatIsWritten) {
  for (uint64_t v : {0ULL, 1ULL, 127ULL, 128ULL, 16383ULL, 16384ULL, ~0ULL}) {
    std::string s;
    AppendVarint(v, &s);
    EXPECT_EQ(VarintSize(v), static_cast<int>(s.size())) << v;
    const std::vector<Bytes> pieces = Cut(s, {s.size() / 2});
    PieceReader r(pieces);
    uint64_t back = 0;
    ASSERT_TRUE(r.ReadVarint(&back));
    EXPECT_EQ(back, v);
    EXPECT_TRUE(r.AtLimit());
  }
}

}  // namespace
}  // namespace kvtier::wire
