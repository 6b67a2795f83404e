// BlockStore with real parts: RocksDB catalog, shared-memory host tier and
// arena, NVMe files through io_uring. Faults come from FaultInjectionEnv.
#include "storage/store/block_store.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <thread>

#include <xxhash.h>

#include "gmock/gmock.h"
#include "gpu/cpu/shm_device_ops.h"
#include "gtest/gtest.h"
#include "storage/catalog/fault_file_system.h"
#include "storage/env/fault_injection_env.h"
#include "storage/env/test_util.h"
#include "storage/store/store_test_util.h"
#include "tests/testutil/status_matchers.h"

using ::kvtier::testing::StatusIs;

namespace kvtier {
namespace {

using ::testing::HasSubstr;

// Flips the byte at every `stride`-th offset from `first` up to `end` of
// the file at path, in place.
void FlipBytes(const std::string& path, uint64_t first, uint64_t end, uint64_t stride) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(file.good()) << path;
  for (uint64_t off = first; off < end; off += stride) {
    file.seekg(off);
    char c;
    file.read(&c, 1);
    c ^= 0x5a;
    file.seekp(off);
    file.write(&c, 1);
  }
}

// Writes data into a staging slot through the staging file, as a client
// that mapped it would.
void WriteStaging(BlockStore& store, const StagingSlot& slot, const std::vector<uint8_t>& data) {
  absl::StatusOr<StagingFile> file = store.OpenStagingFile("default");
  ASSERT_OK(file) << file.status();
  ASSERT_EQ(
      ::pwrite(file->fd.get(), data.data(), data.size(), static_cast<off_t>(slot.offset_bytes)),
      static_cast<ssize_t>(data.size()));
}

TEST_F(BlockStoreTest, PutGetLookupRoundTrip) {
  auto outcome = store_->Put(Key(1), Payload(1));
  ASSERT_OK(outcome) << outcome.status();
  EXPECT_EQ(outcome->tier, TierId::kHost);
  EXPECT_FALSE(outcome->durable);
  EXPECT_FALSE(outcome->existed);
  ExpectReadable(1);
  BlockLocation loc = store_->Lookup(Key(1));
  EXPECT_TRUE(loc.present);
  EXPECT_EQ(loc.tier, TierId::kHost);
  EXPECT_FALSE(store_->Lookup(Key(2)).present);
  std::string out;
  TierId from;
  EXPECT_THAT(store_->Get(Key(2), &out, &from), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(BlockStoreTest, IdenticalPutIsIdempotentDifferentBytesRefused) {
  ASSERT_OK(store_->Put(Key(1), Payload(1)));
  auto again = store_->Put(Key(1), Payload(1));
  ASSERT_OK(again);
  EXPECT_TRUE(again->existed);
  auto other = store_->Put(Key(1), Payload(2));
  EXPECT_THAT(other.status(), StatusIs(absl::StatusCode::kAlreadyExists));
  ExpectReadable(1);  // the stored block stays
}

// A payload in pieces (a gRPC message's slices) is stored as their
// concatenation: same checksum, same bytes, same identity rules as Put.
TEST_F(BlockStoreTest, PutPiecesStoresTheConcatenation) {
  const std::vector<uint8_t> payload = Payload(3);
  const uint64_t xxh3 = XXH3_64bits(payload.data(), payload.size());
  auto pieces_of = [](const std::vector<uint8_t>& p) {
    const size_t third = p.size() / 3;
    return std::vector<absl::Span<const uint8_t>>{{p.data(), third},
                                                  {p.data() + third, 0},
                                                  {p.data() + third, p.size() - third - 1},
                                                  {p.data() + p.size() - 1, 1}};
  };
  const auto pieces = pieces_of(payload);
  auto wrong = store_->PutPieces(Key(3), pieces, {.expected_xxh3 = xxh3 ^ 1});
  EXPECT_THAT(wrong.status(), StatusIs(absl::StatusCode::kDataLoss)) << wrong.status();
  EXPECT_FALSE(store_->Lookup(Key(3)).present);
  auto short_pieces = pieces;
  short_pieces.pop_back();
  auto short_put = store_->PutPieces(Key(3), short_pieces);
  EXPECT_THAT(short_put.status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(short_put.status().message(), HasSubstr("data"));

  auto put = store_->PutPieces(Key(3), pieces, {.expected_xxh3 = xxh3});
  ASSERT_OK(put) << put.status();
  EXPECT_FALSE(put->existed);
  ExpectReadable(3);
  auto again = store_->PutPieces(Key(3), pieces, {.expected_xxh3 = xxh3});
  ASSERT_OK(again) << again.status();
  EXPECT_TRUE(again->existed);
  const std::vector<uint8_t> other = Payload(4);
  auto differs = store_->PutPieces(Key(3), pieces_of(other));
  EXPECT_THAT(differs.status(), StatusIs(absl::StatusCode::kAlreadyExists)) << differs.status();
  ExpectReadable(3);
}

TEST_F(BlockStoreTest, BadInputNamesTheField) {
  auto small = std::vector<uint8_t>(100);
  auto st = store_->Put(Key(1), small).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(st.message(), HasSubstr("data"));
  st = store_->Put(BlockKey{"default", profile_id_, ""}, Payload(1)).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(st.message(), HasSubstr("block_id"));
  st = store_->Put(BlockKey{"default", profile_id_, std::string(33, 'x')}, Payload(1)).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(st.message(), HasSubstr("block_id"));
  st = store_->Put(BlockKey{"default", profile_id_ + 100, "x"}, Payload(1)).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(st.message(), absl::StrCat("profile_id: ", profile_id_ + 100, " is not registered"));
}

// Profiles are per tenant: another tenant's profile id answers exactly as
// one that does not exist, on every path that takes one.
TEST_F(BlockStoreTest, AnotherTenantsProfileIsNotFoundLikeAMissingOne) {
  auto unknown = [](uint64_t id) { return absl::StrCat("profile_id: ", id, " is not registered"); };
  auto got = store_->GetProfile("other", profile_id_);
  EXPECT_THAT(got.status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(got.status().message(), unknown(profile_id_));
  auto put = store_->Put(BlockKey{"other", profile_id_, "x"}, Payload(1));
  EXPECT_THAT(put.status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(put.status().message(), unknown(profile_id_));
  auto slots = store_->ReserveStaging("other", profile_id_, 1, 0);
  EXPECT_THAT(slots.status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(slots.status().message(), unknown(profile_id_));

  // The other tenant registers the same name with another shape: its own
  // profile, under another id; each tenant counts its own.
  ModelProfile bogus = SmallProfile();  // same block size, another dtype
  bogus.dtype = KvDtype::kBf16;
  auto theirs = store_->RegisterProfile(bogus, "other");
  ASSERT_OK(theirs) << theirs.status();
  EXPECT_TRUE(theirs->created);
  EXPECT_NE(theirs->profile.profile_id, profile_id_);
  EXPECT_EQ(store_->GetProfile("default", profile_id_)->dtype, KvDtype::kFp16);
  EXPECT_EQ(store_->UsageOf("other").profiles, 1u);
  EXPECT_EQ(store_->UsageOf("default").profiles, 1u);
  EXPECT_EQ(store_->ListProfiles().size(), 2u);
  EXPECT_EQ(store_->Stats().profiles, 2u);

  // Both survive a restart, each its tenant's.
  const uint64_t other_id = theirs->profile.profile_id;
  ASSERT_OK(store_->Put(BlockKey{"other", other_id, "x"}, Payload(77), {.durable = true}));
  Reopen();
  EXPECT_EQ(store_->GetProfile("other", other_id)->dtype, KvDtype::kBf16);
  EXPECT_THAT(store_->GetProfile("default", other_id).status(),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_TRUE(store_->Lookup(BlockKey{"other", other_id, "x"}).present);
  EXPECT_EQ(store_->UsageOf("other").profiles, 1u);
}

TEST_F(BlockStoreTest, LeasesPerTenantStopAtTheLimit) {
  TenantLimits limits;
  limits.leases = 2;
  store_->SetTenantLimits("default", limits);
  ASSERT_OK(store_->Put(Key(0), Payload(0)));
  std::vector<absl::StatusOr<DeviceHandle>> handles;
  auto first = store_->AcquireHandles("default", {Key(0)}, 0, &handles);
  auto second = store_->AcquireHandles("default", {Key(0)}, 0, &handles);
  ASSERT_OK(first);
  ASSERT_OK(second);
  auto third = store_->AcquireHandles("default", {Key(0)}, 0, &handles);
  EXPECT_THAT(third.status(), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(third.status().message(), HasSubstr("quota leases"));
  EXPECT_EQ(store_->UsageOf("default").leases, 2u);
  // A lease that replaces one of the tenant's may pass the limit by one
  // until the old one goes; a lease that is not the tenant's does not count.
  auto replacing =
      store_->AcquireHandles("default", {Key(0)}, 0, &handles, {.replaces_lease = *first});
  ASSERT_OK(replacing) << replacing.status();
  ASSERT_OK(store_->Release("default", *first));
  EXPECT_THAT(
      store_->AcquireHandles("default", {Key(0)}, 0, &handles, {.replaces_lease = *first}).status(),
      StatusIs(absl::StatusCode::kResourceExhausted));
  // Released and expired leases free their places.
  ASSERT_OK(store_->Release("default", *second));
  auto short_lived = store_->AcquireHandles("default", {Key(0)}, 1, &handles);
  ASSERT_OK(short_lived);
  EXPECT_THAT(store_->AcquireHandles("default", {Key(0)}, 0, &handles).status(),
              StatusIs(absl::StatusCode::kResourceExhausted));
  env_->AdvanceMicros(2000);
  EXPECT_OK(store_->AcquireHandles("default", {Key(0)}, 0, &handles));
  EXPECT_EQ(store_->UsageOf("default").leases, 2u);
  // Other tenants are not held back.
  const uint64_t other = ProfileOf("other");
  ASSERT_OK(store_->Put(BlockKey{"other", other, Id(0)}, Payload(0)));
  EXPECT_OK(store_->AcquireHandles("other", {BlockKey{"other", other, Id(0)}}, 0, &handles));
}

TEST_F(BlockStoreTest, ThreeTimesHostCapacityStaysWithinLimitsAndReadable) {
  const int n = 24;  // host holds 8
  for (int i = 0; i < n; ++i) {
    auto outcome = store_->Put(Key(i), Payload(i));
    ASSERT_OK(outcome) << i << ": " << outcome.status();
    ExpectWithinCapacity();
  }
  BlockStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.blocks, static_cast<uint64_t>(n));
  EXPECT_GE(stats.tiers[2].blocks, static_cast<uint64_t>(n - 8));  // demoted to NVMe
  for (int i = 0; i < n; ++i) ExpectReadable(i);
  ExpectWithinCapacity();
}

TEST_F(BlockStoreTest, FullRetainedCacheFailsFastAndKeepsEveryBlock) {
  // host 8 blocks + NVMe 2 files x 32 blocks: 72 retained blocks fit in all.
  int stored = 0;
  absl::Status last;
  for (int i = 0; i < 100; ++i) {
    auto outcome = store_->Put(Key(i), Payload(i), {.retain = true});
    if (!outcome.ok()) {
      last = outcome.status();
      break;
    }
    ++stored;
  }
  EXPECT_THAT(last, StatusIs(absl::StatusCode::kResourceExhausted)) << last;
  EXPECT_THAT(last.message(), HasSubstr("retained"));
  EXPECT_GE(stored, 64);
  EXPECT_LE(stored, 72);
  ExpectWithinCapacity();
  for (int i = 0; i < stored; ++i) ExpectReadable(i);
  EXPECT_FALSE(store_->Lookup(Key(stored)).present);
  EXPECT_EQ(store_->Stats().evicted_blocks, 0u);
  // Deleting makes room again.
  ASSERT_OK(store_->Delete(Key(0)));
  EXPECT_OK(store_->Put(Key(stored), Payload(stored), {.retain = true}));
}

TEST_F(BlockStoreTest, HandlesPinAndReleaseAndExpire) {
  for (int i = 0; i < 4; ++i) ASSERT_OK(store_->Put(Key(i), Payload(i)));
  std::vector<absl::StatusOr<DeviceHandle>> handles;
  auto lease = store_->AcquireHandles("default", {Key(0), Key(1), Key(2), Key(3)}, 0, &handles);
  ASSERT_OK(lease) << lease.status();
  ASSERT_EQ(handles.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK(handles[i]) << handles[i].status();
    std::vector<std::byte> bytes;
    ASSERT_OK(device_ops_->ReadArena(handles[i]->offset_bytes, handles[i]->size_bytes, &bytes));
    EXPECT_EQ(std::memcmp(bytes.data(), Payload(i).data(), kBlockBytes), 0);
  }
  EXPECT_EQ(store_->Stats().tiers[0].pinned_bytes, 4 * kBlockBytes);
  // The device tier (4 blocks) is full of pinned blocks: a fifth fails fast.
  ASSERT_OK(store_->Put(Key(4), Payload(4)));
  std::vector<absl::StatusOr<DeviceHandle>> more;
  auto none = store_->AcquireHandles("default", {Key(4)}, 0, &more);
  ASSERT_OK(none);
  EXPECT_EQ(*none, 0u);
  EXPECT_THAT(more[0].status(), StatusIs(absl::StatusCode::kResourceExhausted));
  // Pinned blocks cannot be deleted.
  EXPECT_THAT(store_->Delete(Key(0)), StatusIs(absl::StatusCode::kFailedPrecondition));
  // Expiry on the injected clock unpins them; now the fifth block fits.
  env_->AdvanceMicros(999'000);
  EXPECT_EQ(store_->ReapExpired(), 0u);
  env_->AdvanceMicros(2'000);
  EXPECT_EQ(store_->ReapExpired(), 1u);
  EXPECT_EQ(store_->Stats().tiers[0].pinned_bytes, 0u);
  EXPECT_THAT(store_->Release("default", *lease).status(), StatusIs(absl::StatusCode::kNotFound));
  auto fifth = store_->AcquireHandles("default", {Key(4)}, 0, &more);
  ASSERT_OK(fifth);
  ASSERT_OK(more[0]) << more[0].status();
  ASSERT_OK(store_->Release("default", *fifth));
  EXPECT_OK(store_->Delete(Key(0)));
}

// A promotion budget: host -> arena copies stop at its limit; the blocks
// left are deferred (not pinned, still in host memory), and blocks already
// in the arena never count against it.
TEST_F(BlockStoreTest, PromotionBudgetDefersCopiesPastItsLimit) {
  for (int i = 0; i < 4; ++i) ASSERT_OK(store_->Put(Key(i), Payload(i)));
  std::vector<absl::StatusOr<DeviceHandle>> handles;
  auto warm = store_->AcquireHandles("default", {Key(0)}, 0, &handles);
  ASSERT_OK(warm);
  ASSERT_OK(handles[0]);
  ASSERT_OK(store_->Release("default", *warm));
  PromotionBudget budget;
  budget.limit_bytes = kBlockBytes + kBlockBytes / 2;  // room for one copy
  auto lease = store_->AcquireHandles("default", {Key(0), Key(1), Key(2), Key(3)}, 0, &handles,
                                      {.memory_only = true, .budget = &budget});
  ASSERT_OK(lease) << lease.status();
  ASSERT_EQ(handles.size(), 4u);
  ASSERT_OK(handles[0]) << handles[0].status();  // already in the arena
  ASSERT_OK(handles[1]) << handles[1].status();  // promoted
  for (int i : {0, 1}) {
    std::vector<std::byte> bytes;
    ASSERT_OK(device_ops_->ReadArena(handles[i]->offset_bytes, handles[i]->size_bytes, &bytes));
    EXPECT_EQ(std::memcmp(bytes.data(), Payload(i).data(), kBlockBytes), 0);
  }
  for (int i : {2, 3}) {
    EXPECT_TRUE(IsPromotionDeferred(handles[i].status())) << handles[i].status();
    EXPECT_THAT(std::string(handles[i].status().message()), HasSubstr("deferred"));
    EXPECT_EQ(store_->Lookup(Key(i)).tier, TierId::kHost);
    EXPECT_FALSE(store_->Lookup(Key(i)).pinned);
  }
  EXPECT_EQ(budget.promoted_bytes, kBlockBytes);
  EXPECT_EQ(budget.deferred, 2u);
  EXPECT_EQ(store_->Stats().tiers[0].pinned_bytes, 2 * kBlockBytes);
  // Other UNAVAILABLE answers (a block on NVMe only) are not deferrals.
  EXPECT_FALSE(IsPromotionDeferred(absl::UnavailableError("on NVMe only")));
  ASSERT_OK(store_->Release("default", *lease));
  // Without a budget the same call promotes everything.
  auto all =
      store_->AcquireHandles("default", {Key(2), Key(3)}, 0, &handles, {.memory_only = true});
  ASSERT_OK(all);
  EXPECT_OK(handles[0]);
  EXPECT_OK(handles[1]);
  ASSERT_OK(store_->Release("default", *all));
}

// View lends a block's host copy in place: verified, and kept there while
// the view lives (puts three times the host tier do not move it); a block
// on NVMe only comes back as a verified copy; a host copy damaged in place
// is never lent.
TEST_F(BlockStoreTest, ViewsLendHostCopiesInPlaceAndVerifyThem) {
  auto same = [](const BlockView& v, int i) {
    const std::vector<uint8_t> want = Payload(i);
    return v.bytes().size() == want.size() &&
           std::memcmp(v.bytes().data(), want.data(), want.size()) == 0;
  };
  ASSERT_OK(store_->Put(Key(0), Payload(0)));
  TierId from = TierId::kNvme;
  auto view = store_->View(Key(0), &from);
  ASSERT_OK(view) << view.status();
  EXPECT_EQ(from, TierId::kHost);
  EXPECT_TRUE(same(**view, 0));
  for (int i = 1; i < 25; ++i) ASSERT_OK(store_->Put(Key(i), Payload(i)));
  EXPECT_EQ(store_->Lookup(Key(0)).tier, TierId::kHost);
  EXPECT_TRUE(same(**view, 0));
  view->reset();
  int on_nvme = -1;
  for (int i = 1; i < 25 && on_nvme < 0; ++i) {
    const BlockLocation loc = store_->Lookup(Key(i));
    if (loc.present && loc.tier == TierId::kNvme) on_nvme = i;
  }
  ASSERT_GE(on_nvme, 0);
  auto copy = store_->View(Key(on_nvme), &from);
  ASSERT_OK(copy) << copy.status();
  EXPECT_TRUE(same(**copy, on_nvme));
  copy->reset();
  // Damage byte 100 of every slot of the host tier file, in place.
  FlipBytes(options_.host_shm_path, 100, options_.host_capacity_bytes, kBlockBytes);
  int in_host = -1;
  for (int i = 24; i > 0 && in_host < 0; --i) {
    if (store_->Lookup(Key(i)).tier == TierId::kHost) in_host = i;
  }
  ASSERT_GE(in_host, 0);
  auto damaged = store_->View(Key(in_host), &from);
  EXPECT_FALSE(damaged.ok());
  EXPECT_GE(store_->Stats().quarantined_blocks, 1u);
}

// Views lend at most max_view_bytes of the host tier (here the default, a
// quarter of 8 blocks); past it a view is a private copy with the same
// bytes, and lending resumes as views are released.
TEST_F(BlockStoreTest, ViewsLendAtMostTheirCapAndCopyPastIt) {
  for (int i = 0; i < 4; ++i) ASSERT_OK(store_->Put(Key(i), Payload(i)));
  TierId from;
  auto a = store_->View(Key(0), &from);
  auto b = store_->View(Key(1), &from);
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ(store_->Stats().view_bytes, 2 * kBlockBytes);
  auto c = store_->View(Key(2), &from);
  ASSERT_OK(c) << c.status();
  const std::vector<uint8_t> want = Payload(2);
  ASSERT_EQ((*c)->bytes().size(), want.size());
  EXPECT_EQ(std::memcmp((*c)->bytes().data(), want.data(), want.size()), 0);
  BlockStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.view_bytes, 2 * kBlockBytes) << "a view past the cap was lent";
  EXPECT_EQ(stats.views_copied_over_cap, 1u);
  a->reset();
  EXPECT_EQ(store_->Stats().view_bytes, kBlockBytes);
  auto d = store_->View(Key(3), &from);
  ASSERT_OK(d);
  EXPECT_EQ(store_->Stats().view_bytes, 2 * kBlockBytes);
  b->reset();
  c->reset();
  d->reset();
  stats = store_->Stats();
  EXPECT_EQ(stats.view_bytes, 0u);
  EXPECT_EQ(stats.views_copied_over_cap, 1u);
}

TEST_F(BlockStoreTest, PinnedBlocksSurvivePressure) {
  ASSERT_OK(store_->Put(Key(0), Payload(0)));
  std::vector<absl::StatusOr<DeviceHandle>> handles;
  auto lease = store_->AcquireHandles("default", {Key(0)}, 5000, &handles);
  ASSERT_OK(lease);
  ASSERT_OK(handles[0]);
  DeviceHandle pinned = *handles[0];
  for (int i = 1; i < 12; ++i) {
    ASSERT_OK(store_->Put(Key(i), Payload(i)));
    std::vector<absl::StatusOr<DeviceHandle>> h;
    auto l = store_->AcquireHandles("default", {Key(i)}, 0, &h);
    ASSERT_OK(l);
    if (*l != 0) ASSERT_OK(store_->Release("default", *l));
  }
  std::vector<std::byte> bytes;
  ASSERT_OK(device_ops_->ReadArena(pinned.offset_bytes, pinned.size_bytes, &bytes));
  EXPECT_EQ(std::memcmp(bytes.data(), Payload(0).data(), kBlockBytes), 0);
  EXPECT_EQ(store_->Lookup(Key(0)).tier, TierId::kDevice);
  EXPECT_TRUE(store_->Lookup(Key(0)).pinned);
  ExpectWithinCapacity();
}

TEST_F(BlockStoreTest, DurableBlocksSurviveRestart) {
  for (int i = 0; i < 6; ++i) {
    auto outcome = store_->Put(Key(i), Payload(i), {.durable = i % 2 == 0});
    ASSERT_OK(outcome);
    EXPECT_EQ(outcome->durable, i % 2 == 0);
  }
  Reopen();
  for (int i = 0; i < 6; ++i) {
    BlockLocation loc = store_->Lookup(Key(i));
    EXPECT_EQ(loc.present, i % 2 == 0) << i;
    if (i % 2 == 0) {
      EXPECT_EQ(loc.tier, TierId::kNvme);
      ExpectReadable(i);
    }
  }
}

// defer_summaries: non-durable puts are acknowledged first; whoever asks
// for a summary gets it, every block is summarised exactly once, and a
// block deleted right after its put waits for its summary first.
TEST_F(BlockStoreTest, DeferredSummariesAreReadyWhenAskedForAndComputedOnce) {
  auto calls = std::make_shared<std::atomic<int>>(0);
  options_.summarize = [calls](const ModelProfile&, absl::Span<const uint8_t> data) {
    ++*calls;
    return absl::StatusOr<std::string>(std::to_string(data[0]));
  };
  options_.defer_summaries = true;
  Reopen();
  std::vector<BlockKey> keys;
  for (int round = 0; round < 3; ++round) {  // 18 puts into a host tier of 8 blocks
    for (int i = 0; i < 6; ++i) {
      const int b = round * 6 + i;
      ASSERT_OK(store_->Put(Key(b), Payload(b), {.durable = b % 6 == 5}));
      keys.push_back(Key(b));
    }
  }
  std::vector<BlockKey> missing;
  auto summaries = store_->GetSummaries(keys, &missing);
  EXPECT_TRUE(missing.empty());
  for (size_t b = 0; b < keys.size(); ++b) {
    EXPECT_EQ(summaries[b], std::to_string(Payload(static_cast<int>(b))[0])) << b;
  }
  EXPECT_EQ(calls->load(), 18);
  EXPECT_GT(store_->Stats().summaries_deferred, 0u);
  EXPECT_EQ(store_->Stats().summaries_pending, 0u);
  ASSERT_OK(store_->Put(Key(20), Payload(20)));
  EXPECT_OK(store_->Delete(Key(20)));
  EXPECT_EQ(calls->load(), 19);
  ExpectWithinCapacity();
  // Made durable later: the record carries the summary.
  ASSERT_OK(store_->Put(Key(21), Payload(21)));
  ASSERT_OK(store_->Put(Key(21), Payload(21), {.durable = true}));
  Reopen();
  summaries = store_->GetSummaries({Key(21)}, &missing);
  EXPECT_EQ(summaries[0], std::to_string(Payload(21)[0]));
}

TEST_F(BlockStoreTest, SummariesAreComputedKeptAndPersisted) {
  options_.summarize = [](const ModelProfile& profile, absl::Span<const uint8_t> data) {
    return absl::StatusOr<std::string>(std::to_string(profile.head_dim) + ":" +
                                       std::to_string(data[0]));
  };
  Reopen();
  ASSERT_OK(store_->Put(Key(1), Payload(1), {.durable = true}));
  ASSERT_OK(store_->Put(Key(2), Payload(2)));
  std::vector<BlockKey> missing;
  auto summaries = store_->GetSummaries({Key(1), Key(2), Key(3)}, &missing);
  ASSERT_EQ(summaries.size(), 3u);
  EXPECT_EQ(summaries[0], "64:" + std::to_string(Payload(1)[0]));
  EXPECT_EQ(summaries[1], "64:" + std::to_string(Payload(2)[0]));
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_EQ(missing[0].block_id, Id(3));
  Reopen();  // the durable block's summary comes back from the catalog
  missing.clear();
  summaries = store_->GetSummaries({Key(1)}, &missing);
  EXPECT_TRUE(missing.empty());
  EXPECT_EQ(summaries[0], "64:" + std::to_string(Payload(1)[0]));
  EXPECT_EQ(store_->Prefetch({Key(1)}), 1u);
  EXPECT_EQ(store_->Lookup(Key(1)).tier, TierId::kHost);
  // A failing summary fails the put.
  options_.summarize = [](const ModelProfile&, absl::Span<const uint8_t>) {
    return absl::StatusOr<std::string>(absl::InvalidArgumentError("data: not keys"));
  };
  Reopen();
  EXPECT_THAT(store_->Put(Key(4), Payload(4)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_FALSE(store_->Lookup(Key(4)).present);
}

TEST_F(BlockStoreTest, RestartDropsRecordsWhoseFileIsGone) {
  for (int i = 0; i < 4; ++i) ASSERT_OK(store_->Put(Key(i), Payload(i), {.durable = true}));
  store_.reset();
  // Remove every tier file: no catalog entry may survive without its file.
  for (int f = 0; f < 2; ++f) {
    std::filesystem::remove(options_.nvme_dir + "/nvme-00" + std::to_string(f) + ".dat");
  }
  Reopen();
  EXPECT_EQ(store_->Stats().blocks, 0u);
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(store_->Lookup(Key(i)).present);
  Reopen();  // and the records are gone for good
  EXPECT_EQ(store_->Stats().blocks, 0u);
}

TEST_F(BlockStoreTest, FlippedByteIsDetectedAndQuarantined) {
  ASSERT_OK(store_->Put(Key(7), Payload(7), {.durable = true}));
  Reopen();  // NVMe copy only
  store_.reset();
  // Flip one byte in the middle of the data area of every tier file: the
  // block is somewhere in one of them.
  for (int f = 0; f < 2; ++f) {
    FlipBytes(options_.nvme_dir + "/nvme-00" + std::to_string(f) + ".dat", 100, 32 * kBlockBytes,
              kBlockBytes);
  }
  Reopen();
  std::string out;
  TierId from;
  absl::Status st = store_->Get(Key(7), &out, &from);
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(st.message(), HasSubstr("DATA_LOSS"));
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(store_->Stats().quarantined_blocks, 1u);
  Reopen();  // the verdict persists
  EXPECT_FALSE(store_->Lookup(Key(7)).present);
  EXPECT_EQ(store_->Stats().quarantined_blocks, 1u);
  // Putting the right bytes again restores it.
  ASSERT_OK(store_->Put(Key(7), Payload(7), {.durable = true}));
  ExpectReadable(7);
  EXPECT_EQ(store_->Stats().quarantined_blocks, 0u);
}

TEST_F(BlockStoreTest, VerifyFindsCorruption) {
  for (int i = 0; i < 3; ++i) ASSERT_OK(store_->Put(Key(i), Payload(i), {.durable = true}));
  uint64_t last_done = 0, total = 0, corrupt = 0;
  ASSERT_TRUE(store_
                  ->Verify(0,
                           [&](uint64_t done, uint64_t t, const BlockKey* bad) {
                             last_done = done;
                             total = t;
                             corrupt += bad != nullptr;
                           })
                  .ok());
  EXPECT_EQ(last_done, 3u);
  EXPECT_EQ(total, 3u);
  EXPECT_EQ(corrupt, 0u);
}

TEST_F(BlockStoreTest, DroppedUnsyncedDataNeverLosesAcknowledgedDurableBlocks) {
  // Durable puts are synced before they are acknowledged.
  for (int i = 0; i < 4; ++i) ASSERT_OK(store_->Put(Key(i), Payload(i), {.durable = true}));
  store_.reset();
  ASSERT_OK(env_->DropUnsyncedData());
  Reopen();
  for (int i = 0; i < 4; ++i) ExpectReadable(i);
}

TEST_F(BlockStoreTest, InjectedWriteErrorsFailDurablePutsClearly) {
  env_->SetWriteErrorOneIn(1);
  auto outcome = store_->Put(Key(1), Payload(1), {.durable = true});
  ASSERT_FALSE(outcome.ok());
  EXPECT_NE(outcome.status().code(), absl::StatusCode::kOk);
  EXPECT_FALSE(store_->Lookup(Key(1)).present);  // not acknowledged, not kept
  env_->SetWriteErrorOneIn(0);
  ASSERT_OK(store_->Put(Key(1), Payload(1), {.durable = true}));
  ExpectReadable(1);
}

TEST_F(BlockStoreTest, InjectedReadErrorsNeverServeWrongBytes) {
  for (int i = 0; i < 4; ++i) ASSERT_OK(store_->Put(Key(i), Payload(i), {.durable = true}));
  Reopen();  // NVMe copies only
  env_->SetReadErrorOneIn(2);
  int failures = 0;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 4; ++i) {
      std::string out;
      TierId from;
      absl::Status st = store_->Get(Key(i), &out, &from);
      if (st.ok()) {
        EXPECT_EQ(std::memcmp(out.data(), Payload(i).data(), kBlockBytes), 0);
      } else {
        ++failures;
        EXPECT_TRUE(out.empty() || out.size() == kBlockBytes);
      }
    }
  }
  env_->SetReadErrorOneIn(0);
  for (int i = 0; i < 4; ++i) ExpectReadable(i);
  (void)failures;
}

TEST_F(BlockStoreTest, NoSpaceIsResourceExhausted) {
  env_->SetNoSpace(true);
  auto outcome = store_->Put(Key(1), Payload(1), {.durable = true});
  ASSERT_FALSE(outcome.ok());
  EXPECT_THAT(outcome.status(), StatusIs(absl::StatusCode::kResourceExhausted));
  env_->SetNoSpace(false);
  ASSERT_OK(store_->Put(Key(1), Payload(1), {.durable = true}));
}

TEST_F(BlockStoreTest, StagingSlotsPutWithoutGrpcCopies) {
  auto slots = store_->ReserveStaging("default", profile_id_, 2, 0);
  ASSERT_OK(slots) << slots.status();
  ASSERT_EQ(slots->size(), 2u);
  // A client maps the staging file and writes into its slot.
  WriteStaging(*store_, (*slots)[0], Payload(9));
  auto outcome = store_->PutFromStaging(Key(9), (*slots)[0]);
  ASSERT_OK(outcome) << outcome.status();
  ExpectReadable(9);
  // A used slot cannot be used twice.
  EXPECT_THAT(store_->PutFromStaging(Key(10), (*slots)[0]).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Unused slots return after their TTL.
  EXPECT_EQ(store_->Stats().staging_slots, 1u);
  env_->AdvanceMicros(2'000'000);
  EXPECT_EQ(store_->ReapExpired(), 1u);
  EXPECT_EQ(store_->Stats().staging_slots, 0u);
  EXPECT_THAT(store_->PutFromStaging(Key(11), (*slots)[1]).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(BlockStoreTest, ClientChecksumMismatchIsRefused) {
  auto data = Payload(5);
  uint64_t good = XXH3_64bits(data.data(), data.size());
  auto bad = store_->Put(Key(5), data, {.expected_xxh3 = good ^ 1});
  EXPECT_THAT(bad.status(), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(bad.status().message(), HasSubstr("xxh3"));
  EXPECT_FALSE(store_->Lookup(Key(5)).present);
  EXPECT_OK(store_->Put(Key(5), data, {.expected_xxh3 = good}));
}

// A put of a new block writes straight into its host slot: every way it can
// fail (checksum the client sent, staged or not; a summary that cannot be
// computed) must give the slot back and leave nothing stored. More failed
// puts than the host tier has slots would otherwise leave no room.
TEST_F(BlockStoreTest, FailedPutsOfNewBlocksLeaveNoHostSpaceBehind) {
  const uint64_t host_slots = options_.host_capacity_bytes / kBlockBytes;
  auto host_used = [&] {
    return store_->Stats().tiers[static_cast<int>(TierId::kHost)].used_bytes;
  };
  const uint64_t used_before = host_used();
  for (uint64_t i = 0; i < 3 * host_slots; ++i) {
    const uint64_t n = 100 + i;
    const std::vector<uint8_t> data = Payload(n);
    const uint64_t wrong = XXH3_64bits(data.data(), data.size()) ^ 1;
    if (i % 2 == 0) {
      auto bad = store_->Put(Key(n), data, {.durable = i % 4 == 0, .expected_xxh3 = wrong});
      ASSERT_THAT(bad.status(), StatusIs(absl::StatusCode::kDataLoss)) << bad.status();
    } else {
      auto slots = store_->ReserveStaging("default", profile_id_, 1, 0);
      ASSERT_OK(slots) << slots.status();
      WriteStaging(*store_, (*slots)[0], data);
      auto bad = store_->PutFromStaging(Key(n), (*slots)[0], {.expected_xxh3 = wrong});
      ASSERT_THAT(bad.status(), StatusIs(absl::StatusCode::kDataLoss)) << bad.status();
      EXPECT_THAT(bad.status().message(), HasSubstr("xxh3"));
    }
    EXPECT_FALSE(store_->Lookup(Key(n)).present);
  }
  EXPECT_EQ(host_used(), used_before);
  EXPECT_EQ(store_->Stats().blocks, 0u);
  EXPECT_EQ(store_->Stats().staging_slots, 0u);

  // A summarize hook that fails: the put fails with its status, nothing kept.
  options_.summarize = [](const ModelProfile&,
                          absl::Span<const uint8_t>) -> absl::StatusOr<std::string> {
    return absl::InternalError("summary: injected failure");
  };
  Reopen();
  for (uint64_t i = 0; i < 2 * host_slots; ++i) {
    auto bad = store_->Put(Key(500 + i), Payload(500 + i));
    ASSERT_THAT(bad.status(), StatusIs(absl::StatusCode::kInternal)) << bad.status();
    EXPECT_THAT(bad.status().message(), HasSubstr("injected"));
  }
  EXPECT_EQ(host_used(), 0u);
  options_.summarize = nullptr;
  Reopen();
  // Every slot is free: the host tier takes a full load again.
  for (uint64_t n = 0; n < host_slots; ++n) ASSERT_OK(store_->Put(Key(n), Payload(n)));
  EXPECT_EQ(host_used(), host_slots * kBlockBytes);
  for (uint64_t n = 0; n < host_slots; ++n) ExpectReadable(n);
}

// A staged put of a block already stored compares against it: the same
// bytes are accepted as a repeat, different bytes are refused.
TEST_F(BlockStoreTest, StagedPutOfAStoredBlockIsComparedNotStoredTwice) {
  ASSERT_OK(store_->Put(Key(7), Payload(7)));
  auto stage = [&](const std::vector<uint8_t>& data) {
    auto slots = store_->ReserveStaging("default", profile_id_, 1, 0);
    EXPECT_OK(slots) << slots.status();
    WriteStaging(*store_, (*slots)[0], data);
    return (*slots)[0];
  };
  auto again = store_->PutFromStaging(Key(7), stage(Payload(7)));
  ASSERT_OK(again) << again.status();
  EXPECT_TRUE(again->existed);
  auto other = store_->PutFromStaging(Key(7), stage(Payload(8)));
  EXPECT_THAT(other.status(), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_EQ(store_->Stats().blocks, 1u);
  EXPECT_EQ(store_->Stats().staging_slots, 0u);
  ExpectReadable(7);
}

TEST_F(BlockStoreTest, ConcurrentPutsAndGets) {
  std::vector<std::thread> threads;
  std::atomic<int> errors{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        int n = t * 100 + i;
        if (!store_->Put(Key(n), Payload(n), {.durable = i % 3 == 0}).ok()) ++errors;
        std::string out;
        TierId from;
        if (!store_->Get(Key(n), &out, &from).ok() ||
            std::memcmp(out.data(), Payload(n).data(), kBlockBytes) != 0) {
          ++errors;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  ExpectWithinCapacity();
  EXPECT_EQ(store_->Stats().blocks, 40u);
}

TEST_F(BlockStoreTest, DrainMakesEverythingDurable) {
  for (int i = 0; i < 5; ++i) ASSERT_OK(store_->Put(Key(i), Payload(i)));
  uint64_t done = 0;
  ASSERT_OK(store_->Drain([&](uint64_t d, uint64_t) { done = d; }));
  EXPECT_EQ(done, 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(store_->Lookup(Key(i)).durable);
    EXPECT_EQ(store_->Lookup(Key(i)).tier, TierId::kNvme);
  }
  Reopen();
  for (int i = 0; i < 5; ++i) ExpectReadable(i);
}

// A delete's synced catalog write runs without the store's lock: while it
// waits on the disk, every other block is read, written and looked up, and
// Stats answers; the deleted block is hidden as soon as the delete starts
// and gone when it returns.
TEST_F(BlockStoreTest, DeleteSyncsItsRecordWithoutTheStoreLock) {
  FaultInjectionEnv catalog_faults(Env::Default(), /*seed=*/9);
  std::unique_ptr<rocksdb::Env> catalog_env = NewFaultCatalogEnv(&catalog_faults);
  store_.reset();
  options_.catalog_env = catalog_env.get();
  Reopen();
  for (uint64_t n = 1; n <= 2; ++n) {
    ASSERT_OK(store_->Put(Key(n), Payload(n), {.durable = true})) << n;
  }
  catalog_faults.HoldNextIo(FaultInjectionEnv::FileOp::kSync);
  std::thread deleter([&] { EXPECT_OK(store_->Delete(Key(1))); });
  catalog_faults.WaitForHeldIo();
  EXPECT_FALSE(store_->Lookup(Key(1)).present) << "a block being deleted is hidden";
  ExpectReadable(2);
  EXPECT_OK(store_->Put(Key(3), Payload(3)));
  EXPECT_TRUE(store_->Lookup(Key(3)).present);
  EXPECT_EQ(store_->Stats().blocks, 3u) << "the deleted block is still counted until it is gone";
  catalog_faults.ReleaseHeldIo();
  deleter.join();
  EXPECT_FALSE(store_->Lookup(Key(1)).present);
  EXPECT_TRUE(absl::IsNotFound(store_->Delete(Key(1))));
  Reopen();
  EXPECT_FALSE(store_->Lookup(Key(1)).present) << "the removal was synced";
  ExpectReadable(2);
  store_.reset();  // before catalog_env goes
}

}  // namespace
}  // namespace kvtier
