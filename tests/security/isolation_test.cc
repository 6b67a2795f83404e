// Isolation: a tenant cannot see, read, pin, delete or steer another
// tenant's blocks, contexts, leases or files; another tenant's object looks
// exactly like a missing one (NOT_FOUND, never a different error).
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <atomic>
#include <thread>

#include "client/shm/fd_fetch.h"
#include "client/shm/shm_mapping.h"
#include "gmock/gmock.h"
#include "tests/security/other_user.h"
#include "tests/security/security_fixture.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::security {
namespace {

using ::testing::Each;
using testing::StatusIs;

class IsolationTest : public TwoTenantTest {};

// The direct calls (PutBlockData / GetBlockData: generic calls on the same
// channel) carry the tenant's token like the typed ones: A's blocks are A's,
// B sees them as missing, and a client without a token is refused.
TEST_F(IsolationTest, DirectBlockCallsCarryTheTenant) {
  const auto ids = Ids("direct", 2);
  const std::string p0 = Payload(70), p1 = Payload(71);
  auto bytes = [](const std::string& s) {
    return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  };
  std::vector<BlockData> blocks = {{ids[0], bytes(p0)}, {ids[1], bytes(p1)}};
  auto put = a_->PutBlockData(pa_, blocks);
  ASSERT_OK(put);
  EXPECT_EQ(put->blocks_stored(), 2u);

  std::vector<uint8_t> out0(kBlockBytes), out1(kBlockBytes);
  std::vector<BlockDestination> dst = {{ids[0], absl::MakeSpan(out0)},
                                       {ids[1], absl::MakeSpan(out1)}};
  auto mine = a_->GetBlockData(pa_, dst);
  ASSERT_OK(mine);
  EXPECT_OK((*mine)[0].status);
  EXPECT_OK((*mine)[1].status);
  EXPECT_EQ(std::string(out0.begin(), out0.end()), p0);
  auto theirs = b_->GetBlockData(pb_, dst);
  ASSERT_OK(theirs);
  EXPECT_THAT((*theirs)[0].status, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT((*theirs)[1].status, StatusIs(absl::StatusCode::kNotFound));

  auto anonymous = Client::Connect(server_->socket_path());
  ASSERT_OK(anonymous);
  EXPECT_THAT((*anonymous)->PutBlockData(pa_, blocks),
              StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT((*anonymous)->GetBlockData(pa_, dst), StatusIs(absl::StatusCode::kUnauthenticated));
}

TEST_F(IsolationTest, AnotherTenantsBlocksLookMissing) {
  // Profiles are per tenant: the same definition is two profiles, two ids
  // (tests/security/profile_scope_test.cc).
  EXPECT_NE(pa_, pb_);
  auto ids = Ids("a", 4);
  EXPECT_THAT(Put(a_.get(), pa_, ids, 1, /*durable=*/true), Each(0));

  v1::LookupRequest lookup;
  lookup.set_profile_id(pb_);
  for (const auto& id : ids) lookup.add_block_ids(id);
  auto seen = b_->Lookup(lookup);
  ASSERT_OK(seen);
  for (const auto& e : seen->entries()) EXPECT_FALSE(e.present());
  v1::LookupRequest own_lookup = lookup;
  own_lookup.set_profile_id(pa_);
  auto own = a_->Lookup(own_lookup);
  ASSERT_OK(own);
  for (const auto& e : own->entries()) EXPECT_TRUE(e.present());

  for (auto mode : {v1::RETURN_MODE_BYTES, v1::RETURN_MODE_HANDLES}) {
    v1::GetBlocksRequest get;
    get.set_profile_id(pb_);
    get.set_mode(mode);
    for (const auto& id : ids) get.add_block_ids(id);
    auto got = b_->GetBlocks(get);
    ASSERT_OK(got);
    for (const auto& r : *got) {
      EXPECT_EQ(r.status().code(), grpc::StatusCode::NOT_FOUND);
      EXPECT_TRUE(r.data().empty());
    }
  }

  v1::DeleteBlocksRequest del;
  del.set_profile_id(pb_);
  for (const auto& id : ids) del.add_block_ids(id);
  auto deleted = b_->DeleteBlocks(del);
  ASSERT_OK(deleted);
  for (const auto& s : deleted->statuses()) EXPECT_EQ(s.code(), grpc::StatusCode::NOT_FOUND);
  own = a_->Lookup(own_lookup);
  ASSERT_OK(own);
  for (const auto& e : own->entries()) EXPECT_TRUE(e.present()) << "B's delete reached A's block";

  // B cannot open a context over A's blocks: they are not stored for B.
  v1::OpenContextRequest open;
  open.set_profile_id(pb_);
  for (const auto& id : ids) open.add_segments()->add_block_ids(id);
  grpc::ClientContext ctx;
  v1::OpenContextResponse opened;
  EXPECT_EQ(b_->kvtier_stub()->OpenContext(&ctx, open, &opened).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(IsolationTest, IdenticalBytesAreTwoBlocks) {
  auto ids = Ids("same", 2);
  EXPECT_THAT(Put(a_.get(), pa_, ids, 7), Each(0));
  // Same ids and bytes from B: a new block for B, not a hit on A's.
  v1::PutBlocksRequest req;
  req.set_profile_id(pb_);
  for (size_t i = 0; i < ids.size(); ++i) {
    auto* b = req.add_blocks();
    b->set_block_id(ids[i]);
    b->set_data(Payload(7 + i));
  }
  auto put = b_->PutBlocks({req});
  ASSERT_OK(put);
  for (const auto& r : put->results()) EXPECT_FALSE(r.existed()) << "a hit reveals A's prompt";
  // Different bytes under the same id from B are not a conflict with A's.
  v1::DeleteBlocksRequest del;
  del.set_profile_id(pb_);
  del.add_block_ids(ids[0]);
  ASSERT_OK(b_->DeleteBlocks(del));
  EXPECT_THAT(Put(b_.get(), pb_, {ids[0]}, 99), Each(0));
  v1::GetBlocksRequest get;
  get.set_profile_id(pa_);
  get.set_mode(v1::RETURN_MODE_BYTES);
  get.add_block_ids(ids[0]);
  auto got = a_->GetBlocks(get);
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ((*got)[0].data(), Payload(7)) << "A's bytes unchanged by B";
}

TEST_F(IsolationTest, ContextsAndLeasesAreTheOwnersOnly) {
  auto ids = Ids("ctx", 6);
  EXPECT_THAT(Put(a_.get(), pa_, ids, 1), Each(0));
  v1::OpenContextRequest open;
  open.set_profile_id(pa_);
  for (const auto& id : ids) open.add_segments()->add_block_ids(id);
  grpc::ClientContext octx;
  v1::OpenContextResponse opened;
  ASSERT_OK(a_->kvtier_stub()->OpenContext(&octx, open, &opened));
  const uint64_t cid = opened.context_id();

  // A's handle lease.
  v1::GetBlocksRequest get;
  get.set_profile_id(pa_);
  get.set_mode(v1::RETURN_MODE_HANDLES);
  get.add_block_ids(ids[0]);
  uint64_t lease = 0;
  auto got = a_->GetBlocks(get, &lease);
  ASSERT_OK(got);
  ASSERT_NE(lease, 0u);

  {  // Append
    grpc::ClientContext c;
    v1::AppendBlocksRequest r;
    r.set_context_id(cid);
    r.add_block_ids(BlockIdOf("new", 0));
    v1::AppendBlocksResponse out;
    EXPECT_EQ(b_->kvtier_stub()->AppendBlocks(&c, r, &out).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {  // Select
    grpc::ClientContext c;
    auto stream = b_->kvtier_stub()->Select(&c);
    v1::SelectRequest r;
    auto* e = r.add_contexts();
    e->set_context_id(cid);
    e->set_max_blocks(2);
    e->set_step(1);
    for (int d = 0; d < kDim; ++d) e->add_anchor(1.0f);
    ASSERT_TRUE(stream->Write(r));
    v1::SelectResponse out;
    ASSERT_TRUE(stream->Read(&out));
    ASSERT_EQ(out.contexts_size(), 1);
    EXPECT_EQ(out.contexts(0).status().code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(out.contexts(0).blocks_size(), 0);
    stream->WritesDone();
    stream->Finish().IgnoreError();
  }
  for (bool by_context : {true, false}) {  // Release
    v1::ReleaseRequest r;
    if (by_context)
      r.set_context_id(cid);
    else
      r.set_lease_id(lease);
    auto released = b_->Release(r);
    EXPECT_THAT(released, StatusIs(absl::StatusCode::kNotFound)) << released.status();
  }
  {  // Close
    grpc::ClientContext c;
    v1::CloseContextRequest r;
    r.set_context_id(cid);
    v1::CloseContextResponse out;
    EXPECT_EQ(b_->kvtier_stub()->CloseContext(&c, r, &out).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  // An id that never existed gives the same answer as A's (no oracle).
  {
    grpc::ClientContext c;
    v1::CloseContextRequest r;
    r.set_context_id(cid ^ 0x5a5a5a5a5a5aull);
    v1::CloseContextResponse out;
    EXPECT_EQ(b_->kvtier_stub()->CloseContext(&c, r, &out).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  // A's context and lease are still A's.
  v1::ReleaseRequest r;
  r.set_lease_id(lease);
  auto released = a_->Release(r);
  ASSERT_OK(released);
  EXPECT_EQ(released->blocks_unpinned(), 1u);
  grpc::ClientContext c;
  v1::CloseContextRequest close;
  close.set_context_id(cid);
  v1::CloseContextResponse out;
  EXPECT_OK(a_->kvtier_stub()->CloseContext(&c, close, &out));
}

TEST_F(IsolationTest, EveryTenantHasItsOwnPrivateFiles) {
  struct stat sa {
  }, sb{};
  auto arena_a = a_->OpenArena();
  auto arena_b = b_->OpenArena();
  ASSERT_OK(arena_a);
  ASSERT_OK(arena_b);
  EXPECT_NE(arena_a->arena_id(), arena_b->arena_id());
  auto fa = client::FetchSharedFd(arena_a->fd_socket_path(), client::SharedFileKind::kArena,
                                  tokens_["a"], 3000);
  auto fb = client::FetchSharedFd(arena_b->fd_socket_path(), client::SharedFileKind::kArena,
                                  tokens_["b"], 3000);
  ASSERT_OK(fa);
  ASSERT_OK(fb);
  ASSERT_EQ(::fstat(fa.fd(), &sa), 0);
  ASSERT_EQ(::fstat(fb.fd(), &sb), 0);
  EXPECT_FALSE(sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino) << "one arena for two tenants";
  EXPECT_EQ(sa.st_mode & 0777, 0600u);
  auto slots_a = a_->ReserveSlots(pa_, 1);
  auto slots_b = b_->ReserveSlots(pb_, 1);
  ASSERT_OK(slots_a);
  ASSERT_OK(slots_b);
  EXPECT_TRUE(slots_a->staging_path().empty());
  auto ga = client::FetchSharedFd(slots_a->fd_socket_path(), client::SharedFileKind::kStaging,
                                  tokens_["a"], 3000);
  auto gb = client::FetchSharedFd(slots_b->fd_socket_path(), client::SharedFileKind::kStaging,
                                  tokens_["b"], 3000);
  ASSERT_OK(ga);
  ASSERT_OK(gb);
  ASSERT_EQ(::fstat(ga.fd(), &sa), 0);
  ASSERT_EQ(::fstat(gb.fd(), &sb), 0);
  EXPECT_FALSE(sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino) << "one staging file for two";
  EXPECT_EQ(sa.st_nlink, 0u) << "a staging file must have no path anyone could open";

  // The files live in a directory only the daemon's user can enter.
  const std::string shm_dir = server_->runtime()->tenant_shm_dir();
  ASSERT_FALSE(shm_dir.empty());
  struct stat sd {};
  ASSERT_EQ(::stat(shm_dir.c_str(), &sd), 0) << shm_dir;
  EXPECT_EQ(sd.st_mode & 0777, 0700u) << shm_dir;

  // Another local user cannot open them even knowing the name.
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to test as another user (setuid)";
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(shm_dir)) files.push_back(e.path());
  ASSERT_FALSE(files.empty());
  for (const std::string& f : files) ExpectNobodyCannotOpen(f);
}

// A put through a staging slot must store bytes, checksum and summary from
// one read of the slot, however the client rewrites it meanwhile.
TEST_F(IsolationTest, RewritingAStagedSlotDuringThePutCannotCorruptIt) {
  auto slots = a_->ReserveSlots(pa_, 4);
  ASSERT_OK(slots);
  std::string err;
  auto staging =
      client::ShmStagingFile::Open(a_->StagingSource(*slots), slots->staging_size_bytes(), &err);
  ASSERT_NE(staging, nullptr) << err;
  std::vector<std::span<std::byte>> spans;
  for (const auto& s : slots->slots())
    spans.push_back(staging->Slot(s.offset_bytes(), s.size_bytes()));
  for (size_t i = 0; i < spans.size(); ++i) {
    std::string p = Payload(100 + i);
    std::memcpy(spans[i].data(), p.data(), p.size());
  }
  std::atomic<bool> stop{false};
  std::thread rewriter([&] {
    uint64_t seed = 1000;
    while (!stop.load(std::memory_order_relaxed)) {
      for (auto& span : spans) {
        std::string p = Payload(seed++);
        std::memcpy(span.data(), p.data(), p.size());
      }
    }
  });
  v1::PutBlocksRequest req;
  req.set_profile_id(pa_);
  req.set_durable(true);
  auto ids = Ids("staged", 4);
  for (int i = 0; i < 4; ++i) {
    auto* b = req.add_blocks();
    b->set_block_id(ids[i]);
    *b->mutable_slot() = slots->slots(i);
  }
  auto put = a_->PutBlocks({req});
  stop = true;
  rewriter.join();
  ASSERT_OK(put);
  for (const auto& r : put->results()) EXPECT_EQ(r.status().code(), 0) << r.status().message();

  // Verify re-reads every stored copy and checks it against its checksum.
  auto ops = As("ops");
  grpc::ClientContext vctx;
  v1::VerifyRequest vreq;
  auto reader = ops->admin_stub()->Verify(&vctx, vreq);
  v1::VerifyProgress progress, last;
  while (reader->Read(&progress)) last = progress;
  ASSERT_OK(reader->Finish());
  EXPECT_TRUE(last.done());
  EXPECT_GE(last.blocks_checked(), 4u);
  EXPECT_EQ(last.corrupt_blocks(), 0u);
  v1::GetBlocksRequest get;
  get.set_profile_id(pa_);
  get.set_mode(v1::RETURN_MODE_BYTES);
  for (const auto& id : ids) get.add_block_ids(id);
  auto got = a_->GetBlocks(get);
  ASSERT_OK(got);
  for (const auto& r : *got) {
    EXPECT_EQ(r.status().code(), 0);
    EXPECT_EQ(r.data().size(), kBlockBytes);
  }
}

}  // namespace
}  // namespace kvtier::security
