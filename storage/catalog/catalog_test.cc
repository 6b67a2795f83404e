#include "storage/catalog/catalog.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "storage/catalog/record_format.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

using ::kvtier::testing::StatusIs;

namespace kvtier {
namespace {

using testing::StatusIs;

namespace fs = std::filesystem;

class CatalogTest : public ::testing::Test {
 protected:
  void SetUp() override { Reopen(); }
  void TearDown() override { catalog_.reset(); }

  void Reopen() {
    catalog_.reset();
    auto opened = Catalog::Open(dir_.string(), SmallOptions());
    ASSERT_OK(opened);
    catalog_ = std::move(*opened);
  }

  static CatalogOptions SmallOptions() {
    CatalogOptions options;
    options.block_cache_bytes = 4 << 20;
    options.memtable_bytes = 1 << 20;
    options.memtable_total_bytes = 8 << 20;
    return options;
  }

  // Writes raw bytes into a family with RocksDB itself, as damage would.
  void PutRaw(const std::string& family, const std::string& key, const std::string& value) {
    catalog_.reset();
    std::vector<rocksdb::ColumnFamilyDescriptor> families;
    for (const char* name : {"default", "blocks", "profiles", "versions"}) {
      families.emplace_back(name, rocksdb::ColumnFamilyOptions());
    }
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* db = nullptr;
    ASSERT_OK(rocksdb::DB::Open(rocksdb::DBOptions(), dir_.string(), families, &handles, &db));
    size_t index = 0;
    while (families[index].name != family) ++index;
    ASSERT_OK(db->Put(rocksdb::WriteOptions(), handles[index], key, value));
    for (auto* h : handles) ASSERT_OK(db->DestroyColumnFamilyHandle(h));
    ASSERT_OK(db->Close());
    delete db;
  }

  ::kvtier::testing::ScopedTempDir tmp_{"catalog"};
  const fs::path dir_ = fs::path(tmp_.path()) / "catalog";  // Open creates it
  std::unique_ptr<Catalog> catalog_;
};

BlockRecord Record(uint64_t checksum, bool durable = false) {
  BlockRecord r;
  r.size_bytes = 4096;
  r.checksum = checksum;
  if (durable) {
    r.nvme = NvmeExtent{1, 8192 * checksum, 4096};
    r.durable = true;
  }
  r.created_micros = 1000;
  r.last_access_micros = 2000;
  r.summary = "v_b:" + std::to_string(checksum);
  return r;
}

ModelProfile Profile(const std::string& name, uint32_t layers) {
  ModelProfile p;
  p.name = name;
  p.revision = "r1";
  p.layers = layers;
  p.kv_heads = 8;
  p.head_dim = 128;
  p.block_size_tokens = 16;
  p.dtype = KvDtype::kFp16;
  return p;
}

TEST_F(CatalogTest, BlockPutGetDelete) {
  const BlockKey key{"t", 1, "block-1"};
  EXPECT_THAT(catalog_->GetBlock(key), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK(catalog_->PutBlock(key, Record(11, /*durable=*/true)));
  auto got = catalog_->GetBlock(key);
  ASSERT_OK(got);
  EXPECT_EQ(*got, Record(11, true));

  BlockRecord touched = *got;
  touched.last_access_micros = 3000;
  ASSERT_OK(catalog_->PutBlock(key, touched));
  EXPECT_EQ(catalog_->GetBlock(key)->last_access_micros, 3000);

  ASSERT_OK(catalog_->DeleteBlock(key));
  EXPECT_THAT(catalog_->GetBlock(key), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_OK(catalog_->DeleteBlock(key)) << "deleting an absent block";
}

TEST_F(CatalogTest, InvalidInputIsRefusedBeforeWriting) {
  EXPECT_THAT(catalog_->PutBlock({"t", 1, std::string(33, 'x')}, Record(1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(catalog_->PutBlock({"t", 0, "b"}, Record(1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  BlockRecord durable_nowhere = Record(1);
  durable_nowhere.durable = true;
  EXPECT_THAT(catalog_->PutBlock({"t", 1, "b"}, durable_nowhere),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(catalog_->GetBlock({"t", 1, "b"}), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(CatalogTest, RecordsSurviveRestart) {
  ASSERT_OK(catalog_->PutBlock({"t", 1, "durable"}, Record(1, true)));
  ASSERT_OK(catalog_->PutBlock({"t", 1, "volatile"}, Record(2)));
  Reopen();
  EXPECT_EQ(*catalog_->GetBlock({"t", 1, "durable"}), Record(1, true));
  EXPECT_EQ(*catalog_->GetBlock({"t", 1, "volatile"}), Record(2));

  // Also after the memtables went to SST files.
  ASSERT_OK(catalog_->Flush());
  Reopen();
  EXPECT_EQ(*catalog_->GetBlock({"t", 1, "durable"}), Record(1, true));
}

TEST_F(CatalogTest, SameBlockIdUnderOtherTenantsAndProfilesIsDistinct) {
  ASSERT_OK(catalog_->PutBlock({"alice", 1, "same"}, Record(1)));
  ASSERT_OK(catalog_->PutBlock({"bob", 1, "same"}, Record(2)));
  ASSERT_OK(catalog_->PutBlock({"alice", 2, "same"}, Record(3)));
  ASSERT_OK(catalog_->PutBlock({"alice", 1, "other"}, Record(4)));
  ASSERT_OK(catalog_->PutBlock({"alicebob", 1, "same"}, Record(5)));
  EXPECT_EQ(catalog_->GetBlock({"alice", 1, "same"})->checksum, 1u);
  EXPECT_EQ(catalog_->GetBlock({"bob", 1, "same"})->checksum, 2u);
  EXPECT_EQ(catalog_->GetBlock({"alice", 2, "same"})->checksum, 3u);

  std::vector<uint64_t> seen;
  auto stats = catalog_->ForEachBlockOf("alice", 1, [&](const BlockKey& key, const auto& rec) {
    EXPECT_EQ(key.tenant, "alice");
    EXPECT_EQ(key.profile_id, 1u);
    seen.push_back(rec->checksum);
    return true;
  });
  ASSERT_OK(stats);
  EXPECT_EQ(stats->records, 2u);
  EXPECT_EQ(seen, (std::vector<uint64_t>{4, 1}));  // "other" < "same"

  ASSERT_OK(catalog_->DeleteBlock({"bob", 1, "same"}));
  EXPECT_OK(catalog_->GetBlock({"alice", 1, "same"}));

  uint64_t all = 0;
  ASSERT_OK(catalog_->ForEachBlock([&](const BlockKey&, const auto&) {
    ++all;
    return true;
  }));
  EXPECT_EQ(all, 4u);

  uint64_t first_only = 0;
  auto stopped = catalog_->ForEachBlock([&](const BlockKey&, const auto&) {
    ++first_only;
    return false;
  });
  EXPECT_EQ(first_only, 1u);
  EXPECT_EQ(stopped->records, 1u);
}

TEST_F(CatalogTest, ProfileIdsAreStableAndConflictsRefused) {
  auto a = catalog_->RegisterProfile(Profile("llama", 32));
  ASSERT_OK(a);
  EXPECT_TRUE(a->created);
  const uint64_t llama = a->profile.profile_id;
  EXPECT_NE(llama, 0u);

  ModelProfile with_id = Profile("llama", 32);
  with_id.profile_id = 77;  // ignored on input
  auto again = catalog_->RegisterProfile(with_id);
  ASSERT_OK(again);
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->profile.profile_id, llama);

  auto conflict = catalog_->RegisterProfile(Profile("llama", 40));
  EXPECT_THAT(conflict, StatusIs(absl::StatusCode::kAlreadyExists)) << conflict.status();

  ModelProfile next_rev = Profile("llama", 40);
  next_rev.revision = "r2";
  auto b = catalog_->RegisterProfile(next_rev);
  ASSERT_OK(b);
  const uint64_t r2 = b->profile.profile_id;
  EXPECT_NE(r2, llama);

  Reopen();
  auto after = catalog_->RegisterProfile(Profile("llama", 32));
  ASSERT_OK(after);
  EXPECT_FALSE(after->created);
  EXPECT_EQ(after->profile.profile_id, llama);
  auto c = catalog_->RegisterProfile(Profile("qwen", 28));
  ASSERT_OK(c);
  const uint64_t qwen = c->profile.profile_id;

  auto got = catalog_->GetProfile("", r2);
  ASSERT_OK(got);
  EXPECT_EQ(got->revision, "r2");
  EXPECT_EQ(got->layers, 40u);
  EXPECT_THAT(catalog_->GetProfile("", r2 ^ 1), StatusIs(absl::StatusCode::kNotFound));
  auto found = catalog_->FindProfile("", "qwen", "r1");
  ASSERT_OK(found);
  EXPECT_EQ(found->profile_id, qwen);
  EXPECT_THAT(catalog_->FindProfile("", "qwen", "r9"), StatusIs(absl::StatusCode::kNotFound));

  auto all = catalog_->ListProfiles();
  ASSERT_OK(all);
  ASSERT_EQ(all->size(), 3u);
  for (size_t i = 1; i < all->size(); ++i) {
    EXPECT_LT((*all)[i - 1].profile_id, (*all)[i].profile_id) << "listed by id";
  }

  ModelProfile bad = Profile("x", 0);
  EXPECT_THAT(catalog_->RegisterProfile(bad), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(CatalogTest, ProfilesBelongToOneTenant) {
  ModelProfile alices = Profile("llama", 1);  // registered first, another shape
  alices.owner = "alice";
  ModelProfile bobs = Profile("llama", 32);
  bobs.owner = "bob";
  auto a = catalog_->RegisterProfile(alices);
  auto b = catalog_->RegisterProfile(bobs);
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_TRUE(b->created);
  EXPECT_NE(a->profile.profile_id, b->profile.profile_id);
  EXPECT_EQ(b->profile.owner, "bob");
  // The same definition again is another tenant's profile, not Bob's.
  ModelProfile carols = bobs;
  carols.owner = "carol";
  auto c = catalog_->RegisterProfile(carols);
  ASSERT_OK(c);
  EXPECT_TRUE(c->created);
  EXPECT_NE(c->profile.profile_id, b->profile.profile_id);

  Reopen();
  EXPECT_EQ(catalog_->GetProfile("bob", b->profile.profile_id)->layers, 32u);
  EXPECT_THAT(catalog_->GetProfile("alice", b->profile.profile_id),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(catalog_->FindProfile("alice", "llama", "r1")->layers, 1u);
  EXPECT_THAT(catalog_->FindProfile("dave", "llama", "r1"), StatusIs(absl::StatusCode::kNotFound));
  auto all = catalog_->ListProfiles();
  ASSERT_OK(all);
  std::set<std::string> owners;
  for (const ModelProfile& p : *all) owners.insert(p.owner);
  EXPECT_EQ(owners, (std::set<std::string>{"alice", "bob", "carol"}));
}

TEST_F(CatalogTest, ConcurrentRegistrationsAgreeOnOneId) {
  constexpr int kThreads = 4;
  std::vector<uint64_t> ids(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      auto r = catalog_->RegisterProfile(Profile("shared", 12));
      ids[i] = r.ok() ? r->profile.profile_id : 0;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_NE(ids[0], 0u);
  for (uint64_t id : ids) EXPECT_EQ(id, ids[0]);
  EXPECT_EQ(catalog_->ListProfiles()->size(), 1u);
}

// A catalog written by format 1 (one namespace of profiles, sequential
// ids, any tenant's blocks under any id) opens as format 2 with every
// tenant that used a profile holding it under the same id.
TEST_F(CatalogTest, Format1CatalogIsMigrated) {
  catalog_.reset();
  fs::remove_all(dir_);
  auto legacy_id_key = [](uint64_t id) {
    std::string key(1, 'i');
    for (int i = 7; i >= 0; --i) key.push_back(static_cast<char>((id >> (8 * i)) & 0xff));
    return key;
  };
  auto legacy_name_key = [](const std::string& name, const std::string& revision) {
    return std::string(1, 'n') + static_cast<char>(name.size()) + name +
           static_cast<char>(revision.size()) + revision;
  };
  ModelProfile shared = Profile("llama", 32);  // Alice's, used by Bob too
  shared.profile_id = 1;
  shared.owner = "alice";
  ModelProfile unowned = Profile("qwen", 28);  // before tenants, unused
  unowned.profile_id = 2;
  ModelProfile bobs = Profile("mistral", 32);
  bobs.profile_id = 3;
  bobs.owner = "bob";
  {
    std::vector<rocksdb::ColumnFamilyDescriptor> families;
    for (const char* name : {"default", "blocks", "profiles", "contexts", "versions"}) {
      families.emplace_back(name, rocksdb::ColumnFamilyOptions());
    }
    rocksdb::DBOptions options;
    options.create_if_missing = true;
    options.create_missing_column_families = true;
    std::vector<rocksdb::ColumnFamilyHandle*> h;
    rocksdb::DB* db = nullptr;
    ASSERT_OK(rocksdb::DB::Open(options, dir_.string(), families, &h, &db));
    namespace fmt = catalog_format;
    rocksdb::WriteOptions w;
    ASSERT_OK(db->Put(w, h[0], fmt::kFormatVersionKey, fmt::EncodeU32(1)));
    ASSERT_OK(db->Put(w, h[0], fmt::kLegacyNextProfileIdKey, fmt::EncodeU64(4)));
    for (const ModelProfile* p : {&shared, &unowned, &bobs}) {
      ASSERT_OK(db->Put(w, h[2], legacy_id_key(p->profile_id), fmt::EncodeProfileRecord(*p)));
      ASSERT_OK(
          db->Put(w, h[2], legacy_name_key(p->name, p->revision), fmt::EncodeU64(p->profile_id)));
    }
    for (const BlockKey& key :
         {BlockKey{"alice", 1, "a0"}, BlockKey{"bob", 1, "b0"}, BlockKey{"bob", 3, "b1"}}) {
      ASSERT_OK(db->Put(w, h[1], fmt::EncodeBlockKey(key), fmt::EncodeBlockRecord(Record(7))));
    }
    // The retired contexts family (h[3]) holds a record: it goes at open.
    ASSERT_OK(db->Put(w, h[3], "carol-context", "c0"));
    for (auto* handle : h) ASSERT_OK(db->DestroyColumnFamilyHandle(handle));
    ASSERT_OK(db->Close());
    delete db;
  }
  for (int open = 0; open < 2; ++open) {  // the second open finds format 2
    SCOPED_TRACE(open);
    Reopen();
    ASSERT_NE(catalog_, nullptr);
    for (const char* tenant : {"alice", "bob"}) {
      auto p = catalog_->GetProfile(tenant, 1);
      ASSERT_OK(p) << tenant << ": " << p.status();
      EXPECT_EQ(p->owner, tenant);
      EXPECT_TRUE(SameDefinition(*p, shared));
      auto by_name = catalog_->FindProfile(tenant, "llama", "r1");
      ASSERT_OK(by_name);
      EXPECT_EQ(by_name->profile_id, 1u);
    }
    EXPECT_THAT(catalog_->GetProfile("dave", 1), StatusIs(absl::StatusCode::kNotFound));
    EXPECT_EQ(catalog_->GetProfile("bob", 3)->name, "mistral");
    EXPECT_THAT(catalog_->GetProfile("alice", 3), StatusIs(absl::StatusCode::kNotFound));
    EXPECT_EQ(catalog_->GetProfile("", 2)->name, "qwen");
    auto all = catalog_->ListProfiles();
    ASSERT_OK(all);
    EXPECT_EQ(all->size(), 4u);  // llama x2, qwen, mistral
    EXPECT_OK(catalog_->GetBlock({"bob", 1, "b0"}));
    EXPECT_THAT(catalog_->GetProfile("carol", 1), StatusIs(absl::StatusCode::kNotFound));
    std::vector<std::string> families;
    ASSERT_OK(rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), dir_.string(), &families));
    EXPECT_THAT(families, ::testing::Not(::testing::Contains("contexts")));
  }
  // New registrations get random ids beside the migrated ones.
  ModelProfile newer = Profile("llama", 32);
  newer.owner = "dave";
  auto d = catalog_->RegisterProfile(newer);
  ASSERT_OK(d);
  EXPECT_GT(d->profile.profile_id, 3u);
  EXPECT_EQ(catalog_->ListProfiles()->size(), 5u);
}

TEST_F(CatalogTest, BatchIsAtomicAndSyncsWhenDurable) {
  ASSERT_OK(catalog_->PutBlock({"t", 1, "old"}, Record(1)));
  CatalogBatch batch;
  ASSERT_OK(batch.PutBlock({"t", 1, "new"}, Record(2)));
  EXPECT_FALSE(batch.sync());
  ASSERT_OK(batch.PutBlock({"t", 1, "new2"}, Record(3, true)));
  EXPECT_TRUE(batch.sync());
  ASSERT_OK(batch.DeleteBlock({"t", 1, "old"}));
  EXPECT_THAT(batch.PutBlock({"t", 1, ""}, Record(4)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(batch.size(), 3u) << "a refused write entered the batch";

  EXPECT_OK(catalog_->GetBlock({"t", 1, "old"})) << "applied before Write";
  ASSERT_OK(catalog_->Write(batch));
  EXPECT_THAT(catalog_->GetBlock({"t", 1, "old"}), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(catalog_->GetBlock({"t", 1, "new"})->checksum, 2u);
  EXPECT_EQ(catalog_->GetBlock({"t", 1, "new2"})->checksum, 3u);
}

ContextVersionRecord Version(const std::string& context_key, uint32_t version) {
  ContextVersionRecord v;
  v.version = version;
  v.context_key = context_key;
  v.block_ids = {"b0", "b1"};
  v.tokens = 32;
  v.retention = 0.25f;
  v.importance = 2;
  v.merge = 1;
  v.bias = 3;
  v.created_unix_ms = 1700000000123;
  v.dropped = version == 2;
  return v;
}

TEST_F(CatalogTest, ContextVersionsRoundTripAndSurviveRestart) {
  CatalogBatch batch;
  ASSERT_OK(batch.PutContextVersion("t", 1, Version("ctx-b", 1)));
  ASSERT_OK(batch.PutContextVersion("t", 1, Version("ctx-a", 2)));
  ASSERT_OK(batch.PutContextVersion("t", 1, Version("ctx-a", 0)));
  ASSERT_OK(batch.PutContextVersion("u", 1, Version("ctx-a", 5)));
  const CompactedSlotsRecord slots{1, {0, 7, -1}, {0.5f, -2.0f, 0}, {1, 3, 1}};
  ASSERT_OK(batch.PutCompactedSlots({"t", 1, "c0"}, slots));
  EXPECT_TRUE(batch.sync());
  ASSERT_OK(catalog_->Write(batch));
  Reopen();

  auto one = catalog_->ContextVersions("t", 1, "ctx-a");
  ASSERT_OK(one) << one.status();
  ASSERT_EQ(one->size(), 2u);
  EXPECT_EQ((*one)[0], Version("ctx-a", 0));
  EXPECT_EQ((*one)[1], Version("ctx-a", 2));
  auto all = catalog_->ContextVersions("t", 1, "");
  ASSERT_OK(all) << all.status();
  EXPECT_EQ(all->size(), 3u);
  EXPECT_TRUE(catalog_->ContextVersions("t", 2, "")->empty());
  EXPECT_EQ(*catalog_->GetCompactedSlots({"t", 1, "c0"}), slots);
  std::vector<std::string> compacted;
  ASSERT_OK(catalog_->ForEachCompactedBlock(
      [&](const BlockKey& k) { compacted.push_back(k.tenant + "/" + k.block_id); }));
  EXPECT_EQ(compacted, std::vector<std::string>{"t/c0"});

  CatalogBatch drop;
  ASSERT_OK(drop.DeleteCompactedSlots({"t", 1, "c0"}));
  ASSERT_OK(catalog_->Write(drop));
  EXPECT_THAT(catalog_->GetCompactedSlots({"t", 1, "c0"}).status(),
              StatusIs(absl::StatusCode::kNotFound));
  CatalogBatch bad;
  EXPECT_THAT(bad.PutContextVersion("t", 1, Version("", 1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(bad.size(), 0u);
}

TEST_F(CatalogTest, CorruptVersionRecordIsDataLossNamingTheKey) {
  ASSERT_OK(catalog_->Write([] {
    CatalogBatch b;
    EXPECT_OK(b.PutContextVersion("t", 1, Version("good", 1)));
    return b;
  }()));
  std::string damaged = catalog_format::EncodeContextVersionRecord(Version("ctx", 3));
  damaged[6] ^= 0x01;
  PutRaw("versions", catalog_format::EncodeContextVersionKey({"t", 1, "ctx", 3}), damaged);
  PutRaw("versions", catalog_format::EncodeCompactedSlotsKey({"t", 1, "c9"}), "junk");
  Reopen();

  auto listed = catalog_->ContextVersions("t", 1, "ctx");
  ASSERT_THAT(listed.status(), StatusIs(absl::StatusCode::kDataLoss)) << listed.status();
  EXPECT_NE(listed.status().message().find("context_key 637478 version 3"), std::string::npos)
      << listed.status();
  EXPECT_OK(catalog_->ContextVersions("t", 1, "good"));
  auto slots = catalog_->GetCompactedSlots({"t", 1, "c9"});
  ASSERT_THAT(slots.status(), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_NE(slots.status().message().find("block 6339"), std::string::npos) << slots.status();
}

TEST_F(CatalogTest, CorruptRecordIsDataLossNotACrash) {
  ASSERT_OK(catalog_->PutBlock({"t", 1, "good"}, Record(1)));
  const std::string bad_key = catalog_format::EncodeBlockKey({"t", 1, "bad"});
  std::string damaged = catalog_format::EncodeBlockRecord(Record(2));
  damaged[5] ^= 0x10;
  PutRaw("blocks", bad_key, damaged);
  PutRaw("blocks", std::string("\x05t", 2), "not a key");  // scope cut short
  Reopen();

  EXPECT_THAT(catalog_->GetBlock({"t", 1, "bad"}), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_OK(catalog_->GetBlock({"t", 1, "good"}));
  std::vector<std::string> corrupt;
  auto stats = catalog_->ForEachBlock([&](const BlockKey& key, const auto& rec) {
    if (!rec.ok()) {
      EXPECT_THAT(rec, StatusIs(absl::StatusCode::kDataLoss));
      corrupt.push_back(key.block_id);
    }
    return true;
  });
  ASSERT_OK(stats);
  EXPECT_EQ(stats->records, 2u);
  EXPECT_EQ(stats->corrupt_records, 1u);
  EXPECT_EQ(stats->corrupt_keys, 1u);
  EXPECT_EQ(corrupt, std::vector<std::string>{"bad"});
  // The damaged entry can be removed by key.
  ASSERT_OK(catalog_->DeleteBlock({"t", 1, "bad"}));
  EXPECT_THAT(catalog_->GetBlock({"t", 1, "bad"}), StatusIs(absl::StatusCode::kNotFound));
}

// Flips one byte inside the first data block of family's SST file(s).
void DamageSst(const fs::path& dir, const std::string& family) {
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  for (const char* name : {"default", "blocks", "profiles", "versions"}) {
    families.emplace_back(name, rocksdb::ColumnFamilyOptions());
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  ASSERT_OK(
      rocksdb::DB::OpenForReadOnly(rocksdb::DBOptions(), dir.string(), families, &handles, &db));
  std::vector<rocksdb::LiveFileMetaData> files;
  db->GetLiveFilesMetaData(&files);
  for (auto* h : handles) ASSERT_OK(db->DestroyColumnFamilyHandle(h));
  delete db;
  int damaged = 0;
  for (const auto& file : files) {
    if (file.column_family_name != family) continue;
    std::fstream f(file.db_path + "/" + file.relative_filename,
                   std::ios::in | std::ios::out | std::ios::binary);
    char byte = 0;
    f.seekg(20);
    f.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x55);
    f.seekp(20);
    f.write(&byte, 1);
    ASSERT_TRUE(f.good());
    ++damaged;
  }
  ASSERT_GT(damaged, 0) << "no SST file of " << family;
}

TEST_F(CatalogTest, DamagedBlocksSstIsDataLossOnRead) {
  ASSERT_OK(catalog_->PutBlock({"t", 1, "block"}, Record(1, true)));
  ASSERT_OK(catalog_->Flush());
  catalog_.reset();
  DamageSst(dir_, "blocks");
  auto opened = Catalog::Open(dir_.string(), SmallOptions());
  ASSERT_OK(opened);
  catalog_ = std::move(*opened);
  EXPECT_THAT(catalog_->GetBlock({"t", 1, "block"}), StatusIs(absl::StatusCode::kDataLoss));
  auto scan = catalog_->ForEachBlock([](const BlockKey&, const auto&) { return true; });
  EXPECT_THAT(scan, StatusIs(absl::StatusCode::kDataLoss)) << scan.status();
}

TEST_F(CatalogTest, DamagedMetaSstFailsOpenWithDataLoss) {
  ASSERT_OK(catalog_->Flush());
  catalog_.reset();
  DamageSst(dir_, "default");
  auto opened = Catalog::Open(dir_.string(), SmallOptions());
  EXPECT_THAT(opened, StatusIs(absl::StatusCode::kDataLoss)) << opened.status();
}

TEST_F(CatalogTest, OtherFormatVersionIsRefused) {
  PutRaw("default", catalog_format::kFormatVersionKey,
         catalog_format::EncodeU32(catalog_format::kCatalogFormatVersion + 1));
  auto opened = Catalog::Open(dir_.string(), SmallOptions());
  EXPECT_THAT(opened, StatusIs(absl::StatusCode::kFailedPrecondition)) << opened.status();
}

TEST_F(CatalogTest, SecondOpenOfALiveCatalogFails) {
  auto second = Catalog::Open(dir_.string(), SmallOptions());
  EXPECT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("LOCK"), absl::string_view::npos) << second.status();
}

TEST_F(CatalogTest, BadOptionsNameTheOption) {
  CatalogOptions options = SmallOptions();
  options.max_memtables = 1;
  auto opened = Catalog::Open((dir_ / "other").string(), options);
  EXPECT_THAT(opened, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(opened.status().message().find("max_memtables"), absl::string_view::npos);

  options = SmallOptions();
  options.create_if_missing = false;
  EXPECT_FALSE(Catalog::Open((dir_ / "missing").string(), options).ok());
}

TEST_F(CatalogTest, MemoryUsageIsReported) {
  for (int i = 0; i < 1000; ++i) {
    ASSERT_OK(catalog_->PutBlock({"t", 1, "b" + std::to_string(i)}, Record(i)));
  }
  auto usage = catalog_->MemoryUsage();
  ASSERT_OK(usage);
  EXPECT_GT(usage->memtable_bytes, 0u);
  EXPECT_LE(usage->memtable_bytes, 8u << 20);
  EXPECT_GT(usage->estimated_blocks, 0u);
}

}  // namespace
}  // namespace kvtier
