// VersionStore on a real catalog: round trip, and the move of an older
// daemon's separate store (<data_dir>/compaction) into the catalog.
#include "daemon/compaction/version_store.h"

#include <unistd.h>

#include <filesystem>

#include <rocksdb/db.h>

#include "daemon/convert.h"
#include "gtest/gtest.h"
#include "storage/catalog/catalog.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

using ::kvtier::testing::StatusIs;

namespace kvtier::daemon {
namespace {

namespace fs = std::filesystem;

// The older store's keys (see version_store.cc).
std::string LegacyPrefix(char kind, const std::string& tenant, uint64_t profile_id) {
  std::string k(1, kind);
  k.push_back(static_cast<char>(tenant.size() >> 8));
  k.push_back(static_cast<char>(tenant.size() & 0xff));
  k += tenant;
  for (int i = 7; i >= 0; --i) k.push_back(static_cast<char>((profile_id >> (8 * i)) & 0xff));
  return k;
}

v1::ContextVersion Version(uint32_t n, const std::string& block_id) {
  v1::ContextVersion v;
  v.set_version(n);
  v.set_context_key("0123456789abcdef");
  v.add_block_ids(block_id);
  v.set_tokens(n == 0 ? 64 : 16);
  v.set_retention(n == 0 ? 0 : 0.25f);
  v.set_importance(v1::COMPACT_IMPORTANCE_SNAPKV);
  v.set_merge(v1::COMPACT_MERGE_GATED);
  v.set_bias(v1::COMPACT_BIAS_ATTENTION_RATIO);
  v.set_created_unix_ms(1700000000000 + n);
  return v;
}

v1::CompactedSlots Slots() {
  v1::CompactedSlots s;
  s.set_version(1);
  for (int p : {0, 5, 9}) s.add_positions(p);
  for (float b : {0.0f, -1.5f, 2.0f}) s.add_logit_bias(b);
  for (uint32_t m : {1u, 4u, 2u}) s.add_merged(m);
  return s;
}

// The same records as the store keeps them.
ContextVersionRecord VersionRecord(uint32_t n, const std::string& block_id) {
  ContextVersionRecord r;
  r.version = n;
  r.context_key = "0123456789abcdef";
  r.block_ids = {block_id};
  r.tokens = n == 0 ? 64 : 16;
  r.retention = n == 0 ? 0 : 0.25f;
  r.importance = v1::COMPACT_IMPORTANCE_SNAPKV;
  r.merge = v1::COMPACT_MERGE_GATED;
  r.bias = v1::COMPACT_BIAS_ATTENTION_RATIO;
  r.created_unix_ms = 1700000000000 + n;
  return r;
}

CompactedSlotsRecord SlotsRecord() {
  return CompactedSlotsRecord{.version = 1,
                              .positions = {0, 5, 9},
                              .logit_bias = {0.0f, -1.5f, 2.0f},
                              .merged = {1u, 4u, 2u}};
}

std::string LegacyVersionKey(const v1::ContextVersion& v) {
  std::string k = LegacyPrefix('v', "tenant-a", 7) + v.context_key();
  for (int i = 3; i >= 0; --i) k.push_back(static_cast<char>((v.version() >> (8 * i)) & 0xff));
  return k;
}

class VersionStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { OpenCatalog(); }
  void TearDown() override { catalog_.reset(); }
  void OpenCatalog() {
    catalog_.reset();
    auto c = Catalog::Open((dir_ / "catalog").string(), CatalogOptions());
    ASSERT_OK(c) << c.status();
    catalog_ = std::move(*c);
  }
  std::string legacy() const { return (dir_ / "compaction").string(); }
  // Writes an older daemon's store with the given records.
  void WriteLegacy(const std::vector<std::pair<std::string, std::string>>& records) {
    rocksdb::Options options;
    options.create_if_missing = true;
    rocksdb::DB* db = nullptr;
    ASSERT_OK(rocksdb::DB::Open(options, legacy(), &db));
    for (const auto& [k, v] : records) ASSERT_OK(db->Put(rocksdb::WriteOptions(), k, v));
    delete db;
  }

  ::kvtier::testing::ScopedTempDir tmp_{"versions"};
  const fs::path dir_ = tmp_.path();
  std::unique_ptr<Catalog> catalog_;
};

TEST_F(VersionStoreTest, RecordsRoundTripThroughTheCatalog) {
  auto store = VersionStore::Open(catalog_.get(), legacy());
  ASSERT_OK(store) << store.status();
  ASSERT_OK((*store)->Put("t", 3, {VersionRecord(0, "b0"), VersionRecord(1, "c0")},
                          {{"c0", SlotsRecord()}}));
  store->reset();
  OpenCatalog();
  store = VersionStore::Open(catalog_.get(), legacy());
  ASSERT_OK(store) << store.status();
  auto versions = (*store)->Versions("t", 3, "0123456789abcdef");
  ASSERT_OK(versions) << versions.status();
  ASSERT_EQ(versions->size(), 2u);
  EXPECT_EQ((*versions)[1], VersionRecord(1, "c0"));
  EXPECT_TRUE((*store)->IsCompacted("t", 3, "c0"));
  EXPECT_FALSE((*store)->IsCompacted("t", 3, "b0"));
  EXPECT_EQ(*(*store)->Slots("t", 3, "c0"), SlotsRecord());

  ContextVersionRecord dropped = VersionRecord(1, "c0");
  dropped.block_ids.clear();
  dropped.dropped = true;
  ASSERT_OK((*store)->MarkDropped("t", 3, dropped, {"c0"}));
  EXPECT_FALSE((*store)->IsCompacted("t", 3, "c0"));
  EXPECT_THAT((*store)->Slots("t", 3, "c0").status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_TRUE((*(*store)->AllVersions("t", 3))[1].dropped);
}

TEST_F(VersionStoreTest, OlderSeparateStoreIsMovedIntoTheCatalogAndRemoved) {
  const v1::ContextVersion v0 = Version(0, "b0"), v1 = Version(1, "c0");
  WriteLegacy({{LegacyVersionKey(v0), v0.SerializeAsString()},
               {LegacyVersionKey(v1), v1.SerializeAsString()},
               {LegacyPrefix('s', "tenant-a", 7) + "c0", Slots().SerializeAsString()}});
  auto store = VersionStore::Open(catalog_.get(), legacy());
  ASSERT_OK(store) << store.status();
  EXPECT_FALSE(fs::exists(legacy()));
  EXPECT_FALSE(fs::exists(legacy() + ".removing"));

  auto all = (*store)->AllVersions("tenant-a", 7);
  ASSERT_OK(all) << all.status();
  ASSERT_EQ(all->size(), 2u);
  // The old messages and the records they became say the same.
  EXPECT_EQ(ToProto((*all)[0]).SerializeAsString(), v0.SerializeAsString());
  EXPECT_EQ(ToProto((*all)[1]).SerializeAsString(), v1.SerializeAsString());
  EXPECT_TRUE((*store)->IsCompacted("tenant-a", 7, "c0"));
  EXPECT_EQ(ToProto(*(*store)->Slots("tenant-a", 7, "c0")).SerializeAsString(),
            Slots().SerializeAsString());
  // The records are the catalog's now: they survive without the old store.
  store->reset();
  OpenCatalog();
  store = VersionStore::Open(catalog_.get(), legacy());
  ASSERT_OK(store) << store.status();
  EXPECT_EQ((*store)->AllVersions("tenant-a", 7)->size(), 2u);
}

TEST_F(VersionStoreTest, UnparsableOlderRecordFailsOpenNamingItAndKeepsTheStore) {
  const v1::ContextVersion v0 = Version(0, "b0");
  WriteLegacy({{LegacyVersionKey(v0), std::string("\xff\xff\xff", 3)}});
  auto store = VersionStore::Open(catalog_.get(), legacy());
  ASSERT_THAT(store.status(), StatusIs(absl::StatusCode::kDataLoss)) << store.status();
  EXPECT_NE(store.status().message().find(legacy()), std::string::npos) << store.status();
  EXPECT_NE(store.status().message().find("does not parse"), std::string::npos);
  EXPECT_TRUE(fs::exists(legacy()));
}

}  // namespace
}  // namespace kvtier::daemon
