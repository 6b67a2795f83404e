#include "storage/remote/remote_format.h"

#include <string>

#include "gtest/gtest.h"
#include "storage/common/checksum.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::remote {
namespace {

ModelProfile Shape() {
  ModelProfile p;
  p.name = "llama";
  p.revision = "r1";
  p.layers = 2;
  p.kv_heads = 2;
  p.head_dim = 8;
  p.block_size_tokens = 4;
  return p;
}

std::string Value(const std::string& key, uint64_t fp, const std::string& payload) {
  const auto span =
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(payload.data()), payload.size());
  const auto h = EncodeRemoteHeader(key, fp, payload.size(), BlockChecksum(span));
  return std::string(reinterpret_cast<const char*>(h.data()), h.size()) + payload;
}

TEST(RemoteFormat, FingerprintIgnoresLocalIdCalibrationAndOwner) {
  ModelProfile a = Shape(), b = Shape();
  b.profile_id = 9;
  b.calibration = "x";
  b.owner = "t";
  EXPECT_EQ(ProfileFingerprint(a), ProfileFingerprint(b));
  b = Shape();
  b.head_dim = 16;
  EXPECT_NE(ProfileFingerprint(a), ProfileFingerprint(b));
  b = Shape();
  b.revision = "r2";
  EXPECT_NE(ProfileFingerprint(a), ProfileFingerprint(b));
  // Length prefixes: moving a character between name and revision differs.
  b = Shape();
  b.name = "llam";
  b.revision = "ar1";
  EXPECT_NE(ProfileFingerprint(a), ProfileFingerprint(b));
}

TEST(RemoteFormat, KeysSeparateTenantsProfilesAndIds) {
  BlockKey k{"acme", 1, std::string("\x01\xff", 2)};
  EXPECT_EQ(RemoteKey(k, 0xabc), "kvt1:4:acme:0000000000000abc:01ff");
  BlockKey other = k;
  other.tenant = "acme:0";
  EXPECT_NE(RemoteKey(other, 0xabc), RemoteKey(k, 0xabc));
  EXPECT_NE(RemoteKey(k, 0xabd), RemoteKey(k, 0xabc));
  other = k;
  other.profile_id = 2;  // the local id is not part of the key
  EXPECT_EQ(RemoteKey(other, 0xabc), RemoteKey(k, 0xabc));
}

TEST(RemoteFormat, RoundTripAndEveryCheck) {
  const std::string key = "kvt1:1:t:0000000000000001:aa";
  const std::string payload(64, 'p');
  const std::string good = Value(key, 1, payload);
  auto v = DecodeRemoteValue(good, key, 1, 64);
  ASSERT_OK(v) << v.status();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(v->payload.data()), v->payload.size()),
            payload);
  EXPECT_EQ(v->payload_checksum,
            BlockChecksum(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(payload.data()),
                                              payload.size())));

  auto code = [&](const std::string& value, const std::string& k, uint64_t fp, uint64_t n) {
    return DecodeRemoteValue(value, k, fp, n).status().code();
  };
  EXPECT_EQ(code(good.substr(0, 20), key, 1, 64), absl::StatusCode::kDataLoss);  // short
  EXPECT_EQ(code(good, "kvt1:1:t:0000000000000001:ab", 1, 64), absl::StatusCode::kDataLoss);
  EXPECT_EQ(code(good, key, 2, 64), absl::StatusCode::kDataLoss);        // other profile
  EXPECT_EQ(code(good, key, 1, 32), absl::StatusCode::kDataLoss);        // other size
  EXPECT_EQ(code(good + "x", key, 1, 64), absl::StatusCode::kDataLoss);  // trailing bytes
  for (size_t i = 0; i < kRemoteHeaderBytes; ++i) {                      // any header byte flipped
    std::string bad = good;
    bad[i] ^= 0x10;
    EXPECT_EQ(code(bad, key, 1, 64), absl::StatusCode::kDataLoss) << "byte " << i;
  }
  // A flipped payload byte passes the header checks; its checksum (the
  // store's job) no longer matches.
  std::string bad = good;
  bad[kRemoteHeaderBytes + 3] ^= 1;
  auto flipped = DecodeRemoteValue(bad, key, 1, 64);
  ASSERT_OK(flipped);
  EXPECT_NE(BlockChecksum(flipped->payload), flipped->payload_checksum);
}

}  // namespace
}  // namespace kvtier::remote
