#include "storage/catalog/record_format.h"

#include <xxhash.h>

#include <random>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/testutil/status_matchers.h"

using ::kvtier::testing::StatusIs;

namespace kvtier::catalog_format {
namespace {

using testing::StatusIs;

BlockRecord FullRecord() {
  BlockRecord r;
  r.size_bytes = 2 * 1024 * 1024;
  r.checksum = 0x0123456789abcdefULL;
  r.nvme = NvmeExtent{7, 1ULL << 40, 2 * 1024 * 1024 + 4096};
  r.durable = true;
  r.quarantined = true;
  r.created_micros = -5;  // the catalog stores what it is given
  r.last_access_micros = 1700000000123456;
  r.summary = std::string(512, '\x7f');
  return r;
}

ModelProfile Qwen() {
  ModelProfile p;
  p.profile_id = 42;
  p.name = "Qwen2.5-7B";
  p.revision = "main";
  p.layers = 28;
  p.kv_heads = 4;
  p.head_dim = 128;
  p.block_size_tokens = 16;
  p.dtype = KvDtype::kBf16;
  return p;
}

// Replaces byte i and recomputes the trailing check, so only the field
// itself is wrong.
std::string Resealed(std::string bytes, size_t i, char value) {
  bytes[i] = value;
  const size_t body = bytes.size() - 4;
  const uint32_t check = static_cast<uint32_t>(XXH3_64bits(bytes.data(), body));
  for (int b = 0; b < 4; ++b) bytes[body + b] = static_cast<char>((check >> (8 * b)) & 0xff);
  return bytes;
}

TEST(RecordFormatTest, BlockRecordRoundTrips) {
  const BlockRecord full = FullRecord();
  const std::string bytes = EncodeBlockRecord(full);
  EXPECT_EQ(bytes.size(), 62 + full.summary.size());
  auto back = DecodeBlockRecord(bytes);
  ASSERT_OK(back);
  EXPECT_EQ(*back, full);

  BlockRecord minimal;
  minimal.size_bytes = 1;
  const std::string small = EncodeBlockRecord(minimal);
  EXPECT_EQ(small.size(), 42u);
  back = DecodeBlockRecord(small);
  ASSERT_OK(back);
  EXPECT_EQ(*back, minimal);
}

TEST(RecordFormatTest, EveryTruncationAndBitFlipIsDataLoss) {
  const std::string bytes = EncodeBlockRecord(FullRecord());
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_THAT(DecodeBlockRecord(bytes.substr(0, n)), StatusIs(absl::StatusCode::kDataLoss))
        << "length " << n;
  }
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string flipped = bytes;
      flipped[i] = static_cast<char>(flipped[i] ^ (1 << bit));
      ASSERT_THAT(DecodeBlockRecord(flipped), StatusIs(absl::StatusCode::kDataLoss))
          << "byte " << i << " bit " << bit;
    }
  }
}

TEST(RecordFormatTest, WellSealedButInvalidFieldsAreDataLoss) {
  const std::string bytes = EncodeBlockRecord(FullRecord());
  // Unknown version.
  EXPECT_THAT(DecodeBlockRecord(Resealed(bytes, 0, 2)), StatusIs(absl::StatusCode::kDataLoss));
  // Unknown flag bit.
  EXPECT_THAT(DecodeBlockRecord(Resealed(bytes, 1, 0x1f)), StatusIs(absl::StatusCode::kDataLoss));
  // Durable without an nvme location.
  BlockRecord r;
  r.size_bytes = 10;
  r.nvme = NvmeExtent{0, 0, 10};
  r.durable = true;
  std::string no_nvme = EncodeBlockRecord(r);
  no_nvme.erase(34, 20);
  EXPECT_THAT(DecodeBlockRecord(Resealed(no_nvme, 1, 0x01)), StatusIs(absl::StatusCode::kDataLoss));
  // size_bytes 0.
  std::string zero = EncodeBlockRecord(r);
  for (int i = 2; i < 10; ++i) zero = Resealed(zero, i, 0);
  auto decoded = DecodeBlockRecord(zero);
  EXPECT_THAT(decoded, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_NE(decoded.status().message().find("size_bytes"), absl::string_view::npos);
}

TEST(RecordFormatTest, RandomBytesNeverDecode) {
  std::mt19937_64 rng(1234);
  for (int round = 0; round < 2000; ++round) {
    std::string junk(rng() % 128, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    EXPECT_FALSE(DecodeBlockRecord(junk).ok());
    EXPECT_FALSE(DecodeProfileRecord(junk).ok());
    EXPECT_FALSE(DecodeContextVersionRecord(junk).ok());
  }
}

TEST(RecordFormatTest, BlockKeysAreScopedAndRoundTrip) {
  const BlockKey key{"tenant-a", 3, std::string("\x00\xff id", 5)};
  const std::string bytes = EncodeBlockKey(key);
  auto back = DecodeBlockKey(bytes);
  ASSERT_OK(back);
  EXPECT_EQ(*back, key);
  EXPECT_EQ(bytes.rfind(BlockKeyPrefix("tenant-a", 3), 0), 0u);

  // Length prefixes keep tenant "a" from matching tenant "ab"'s keys.
  const std::string ab = EncodeBlockKey({"ab", 1, "x"});
  EXPECT_NE(ab.rfind(BlockKeyPrefix("a", 1), 0), 0u);
  // Keys of one (tenant, profile) sort together; profiles sort by id.
  EXPECT_LT(EncodeBlockKey({"t", 1, "\xff\xff"}), EncodeBlockKey({"t", 2, "\x00"}));
  EXPECT_LT(EncodeBlockKey({"t", 255, "z"}), EncodeBlockKey({"t", 256, "a"}));

  EXPECT_THAT(DecodeBlockKey(BlockKeyPrefix("t", 1)), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(DecodeBlockKey(BlockKeyPrefix("t", 0) + "id"), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(DecodeBlockKey(BlockKeyPrefix("t", 1) + std::string(33, 'x')),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(DecodeBlockKey(""), StatusIs(absl::StatusCode::kDataLoss));
}

TEST(RecordFormatTest, ProfileRecordRoundTripsAndRejectsDamage) {
  const std::string bytes = EncodeProfileRecord(Qwen());
  auto back = DecodeProfileRecord(bytes);
  ASSERT_OK(back);
  EXPECT_EQ(*back, Qwen());
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(DecodeProfileRecord(bytes.substr(0, n)).ok()) << n;
  }
  // dtype byte (offset 25) set to an unknown value.
  EXPECT_THAT(DecodeProfileRecord(Resealed(bytes, 25, 9)), StatusIs(absl::StatusCode::kDataLoss));
}

TEST(RecordFormatTest, CompactionVersionRecordsRoundTripAndRejectDamage) {
  ContextVersionRecord v;
  v.version = 3;
  v.context_key = std::string(16, '\x7f');
  v.block_ids = {"c0", std::string(32, 'x')};
  v.tokens = 48;
  v.retention = 0.375f;
  v.importance = 2;
  v.merge = 1;
  v.bias = 1;
  v.created_unix_ms = 1700000000000;
  v.dropped = true;
  const std::string bytes = EncodeContextVersionRecord(v);
  auto back = DecodeContextVersionRecord(bytes);
  ASSERT_OK(back) << back.status();
  EXPECT_EQ(*back, v);
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_THAT(DecodeContextVersionRecord(bytes.substr(0, n)).status(),
                StatusIs(absl::StatusCode::kDataLoss))
        << "length " << n;
  }
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string flipped = bytes;
    flipped[i] = static_cast<char>(flipped[i] ^ 0x04);
    EXPECT_THAT(DecodeContextVersionRecord(flipped).status(), StatusIs(absl::StatusCode::kDataLoss))
        << "byte " << i;
  }

  const CompactedSlotsRecord s{1, {0, -3, 70000}, {1.5f, -0.25f, 0}, {1, 2, 3}};
  const std::string slot_bytes = EncodeCompactedSlotsRecord(s);
  auto slots = DecodeCompactedSlotsRecord(slot_bytes);
  ASSERT_OK(slots) << slots.status();
  EXPECT_EQ(*slots, s);
  for (size_t n = 0; n < slot_bytes.size(); ++n) {
    EXPECT_THAT(DecodeCompactedSlotsRecord(slot_bytes.substr(0, n)).status(),
                StatusIs(absl::StatusCode::kDataLoss));
  }
  // A huge array length must not allocate before failing.
  EXPECT_THAT(DecodeCompactedSlotsRecord(Resealed(slot_bytes, 8, 0x7f)).status(),
              StatusIs(absl::StatusCode::kDataLoss));

  const ContextVersionKey key{"t", 9, "ctx", 7};
  auto key_back = DecodeContextVersionKey(EncodeContextVersionKey(key));
  ASSERT_OK(key_back) << key_back.status();
  EXPECT_EQ(key_back->tenant, "t");
  EXPECT_EQ(key_back->profile_id, 9u);
  EXPECT_EQ(key_back->context_key, "ctx");
  EXPECT_EQ(key_back->version, 7u);
  // A context's prefix does not match a longer key that starts the same.
  EXPECT_FALSE(absl::StartsWith(EncodeContextVersionKey({"t", 9, "ctx-2", 1}),
                                ContextVersionPrefix("t", 9, "ctx")));
  auto slot_key = DecodeCompactedSlotsKey(EncodeCompactedSlotsKey({"t", 9, "c0"}));
  ASSERT_OK(slot_key);
  EXPECT_EQ(slot_key->block_id, "c0");
}

TEST(RecordFormatTest, PrefixSuccessor) {
  EXPECT_EQ(PrefixSuccessor("ab"), "ac");
  EXPECT_EQ(PrefixSuccessor(std::string("a\xff", 2)), "b");
  EXPECT_EQ(PrefixSuccessor(std::string("\xff\xff", 2)), "");
  EXPECT_EQ(PrefixSuccessor(""), "");
}

TEST(RecordsTest, ValidationNamesTheField) {
  BlockKey key{"t", 1, std::string(33, 'x')};
  absl::Status s = ValidateBlockKey(key);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(s.message().find("block_id"), absl::string_view::npos);
  key.block_id = "ok";
  key.profile_id = 0;
  EXPECT_NE(ValidateBlockKey(key).message().find("profile_id"), absl::string_view::npos);
  key.profile_id = 1;
  key.tenant = std::string(kMaxTenantBytes + 1, 't');
  EXPECT_NE(ValidateBlockKey(key).message().find("tenant"), absl::string_view::npos);

  BlockRecord r;
  r.size_bytes = 100;
  r.durable = true;
  EXPECT_NE(ValidateBlockRecord(r).message().find("nvme"), absl::string_view::npos);
  r.nvme = NvmeExtent{0, 0, 99};
  EXPECT_NE(ValidateBlockRecord(r).message().find("length"), absl::string_view::npos);
  r.nvme->length = 100;
  EXPECT_OK(ValidateBlockRecord(r));
  r.summary.assign(kMaxSummaryBytes + 1, 's');
  EXPECT_NE(ValidateBlockRecord(r).message().find("summary"), absl::string_view::npos);

  ModelProfile p = Qwen();
  EXPECT_OK(ValidateProfile(p));
  EXPECT_EQ(BlockSizeBytes(p), 28u * 2 * 4 * 16 * 128 * 2);
  p.head_dim = 0;
  EXPECT_NE(ValidateProfile(p).message().find("head_dim"), absl::string_view::npos);
  p = Qwen();
  p.layers = kMaxLayers;
  p.kv_heads = kMaxKvHeads;
  EXPECT_NE(ValidateProfile(p).message().find("block size"), absl::string_view::npos);
  p = Qwen();
  p.dtype = static_cast<KvDtype>(7);
  EXPECT_NE(ValidateProfile(p).message().find("dtype"), absl::string_view::npos);
}

}  // namespace
}  // namespace kvtier::catalog_format
