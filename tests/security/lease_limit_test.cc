// Leases per tenant and echoed input (issue 31, finding 10).
//
// (a) A tenant holds at most its `leases` quota of leases at once (else
//     auth.tenant_max_leases): the call that would take one more (GetBlocks
//     in HANDLES mode, a context's first Select) answers RESOURCE_EXHAUSTED
//     naming `leases`; other tenants are unaffected; released and expired
//     leases free the quota; a context's next Select, which replaces the
//     context's own lease, is not refused.
// (b) Client input echoed in an error message is cut: a 1 MiB name yields
//     a short message that still names the field.
#include <chrono>

#include "gmock/gmock.h"
#include "tests/security/security_fixture.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::security {
namespace {

using ::testing::Each;
using ::testing::HasSubstr;

constexpr uint64_t kQuotaLeases = 3;    // tenant "l"
constexpr uint64_t kDefaultLeases = 6;  // auth.tenant_max_leases

class LeaseLimitTest : public SecurityTest {
 protected:
  void SetUp() override {
    tokens_["l"] = auth::NewToken();
    // Four tenants' arenas in the fixture's 1 MiB device tier.
    StartDaemon({"auth.tenant_max_leases=" + std::to_string(kDefaultLeases),
                 "auth.tenant_arena_bytes=256KiB"},
                "[[tenants]]\nname = \"l\"\nrole = \"data\"\ntoken_sha256 = [\"" +
                    auth::HashToken(tokens_["l"]) +
                    "\"]\n[tenants.quotas]\nleases = " + std::to_string(kQuotaLeases) + "\n");
    l_ = As("l");
    pl_ = Register(l_.get());
    ASSERT_NE(pl_, 0u);
    ASSERT_THAT(Put(l_.get(), pl_, Ids("l", 2), 1), Each(0));
  }

  // GetBlocks in HANDLES mode of the tenant's first block: the call's
  // status and the lease it took.
  static std::pair<grpc::Status, uint64_t> Pin(Client* c, uint64_t profile_id,
                                               const std::string& tag, uint32_t ttl_ms = 0) {
    grpc::ClientContext ctx;
    v1::GetBlocksRequest req;
    req.set_profile_id(profile_id);
    req.set_mode(v1::RETURN_MODE_HANDLES);
    req.set_lease_ttl_ms(ttl_ms);
    req.add_block_ids(BlockIdOf(tag, 0));
    auto reader = c->kvtier_stub()->GetBlocks(&ctx, req);
    v1::GetBlocksResponse resp;
    uint64_t lease = 0;
    while (reader->Read(&resp)) {
      if (resp.lease_id() != 0) lease = resp.lease_id();
    }
    return {reader->Finish(), lease};
  }

  uint64_t LeasesOf(const std::string& tenant) {
    auto stats = As("ops")->Stats();
    EXPECT_OK(stats);
    for (const auto& t : stats->tenants()) {
      if (t.name() == tenant) return t.leases();
    }
    ADD_FAILURE() << "no tenant " << tenant << " in Stats";
    return 0;
  }

  uint64_t OpenContext(Client* c, uint64_t profile_id, const std::string& tag) {
    grpc::ClientContext ctx;
    v1::OpenContextRequest req;
    req.set_profile_id(profile_id);
    auto* seg = req.add_segments();
    for (const auto& id : Ids(tag, 2)) seg->add_block_ids(id);
    v1::OpenContextResponse resp;
    grpc::Status st = c->kvtier_stub()->OpenContext(&ctx, req, &resp);
    EXPECT_OK(st) << st.error_message();
    return resp.context_id();
  }

  // One Select of one context on its own stream: the context's status.
  static v1::ItemStatus SelectOnce(Client* c, uint64_t context_id, uint64_t step) {
    grpc::ClientContext ctx;
    auto stream = c->kvtier_stub()->Select(&ctx);
    v1::SelectRequest req;
    auto* e = req.add_contexts();
    e->set_context_id(context_id);
    e->set_max_blocks(2);
    e->set_step(step);
    for (int d = 0; d < kDim; ++d) e->add_anchor(0.5f);
    v1::SelectResponse resp;
    EXPECT_TRUE(stream->Write(req));
    EXPECT_TRUE(stream->Read(&resp));
    stream->WritesDone();
    EXPECT_OK(stream->Finish());
    if (resp.contexts_size() != 1) {
      ADD_FAILURE() << "no selection for context " << context_id;
      return {};
    }
    return resp.contexts(0).status();
  }

  std::unique_ptr<Client> l_;
  uint64_t pl_ = 0;
};

TEST_F(LeaseLimitTest, ATenantPastItsLeasesIsRefusedAndOthersAreNot) {
  std::vector<uint64_t> held;
  for (uint64_t i = 0; i < kQuotaLeases; ++i) {
    auto [st, lease] = Pin(l_.get(), pl_, "l");
    ASSERT_OK(st) << st.error_message();
    ASSERT_NE(lease, 0u);
    held.push_back(lease);
  }
  auto [refused, none] = Pin(l_.get(), pl_, "l");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("quota leases"));
  EXPECT_EQ(none, 0u);
  EXPECT_EQ(LeasesOf("l"), kQuotaLeases);

  // a has no leases quota: the daemon's default per tenant holds it.
  auto a = As("a");
  const uint64_t pa = Register(a.get());
  ASSERT_THAT(Put(a.get(), pa, Ids("a", 1), 5), Each(0));
  for (uint64_t i = 0; i < kDefaultLeases; ++i) {
    ASSERT_OK(Pin(a.get(), pa, "a").first) << i;
  }
  grpc::Status over = Pin(a.get(), pa, "a").first;
  EXPECT_EQ(over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(over.error_message(), HasSubstr("quota leases"));

  // b, with both of them at their limit, pins as it likes.
  auto b = As("b");
  const uint64_t pb = Register(b.get());
  ASSERT_THAT(Put(b.get(), pb, Ids("b", 1), 9), Each(0));
  auto [mine, lease_b] = Pin(b.get(), pb, "b");
  EXPECT_OK(mine) << mine.error_message();
  EXPECT_NE(lease_b, 0u);

  auto stats = As("ops")->Stats();
  ASSERT_OK(stats);
  for (const auto& t : stats->tenants()) {
    if (t.name() == "l") {
      EXPECT_EQ(t.quotas().at("leases"), kQuotaLeases);
    }
    if (t.name() == "a") {
      EXPECT_EQ(t.quotas().at("leases"), kDefaultLeases);
    }
  }

  // A released lease frees its place.
  v1::ReleaseRequest release;
  release.set_lease_id(held[0]);
  ASSERT_OK(l_->Release(release));
  EXPECT_OK(Pin(l_.get(), pl_, "l").first);
  EXPECT_EQ(LeasesOf("l"), kQuotaLeases);
}

TEST_F(LeaseLimitTest, ExpiredLeasesFreeTheQuota) {
  for (uint64_t i = 0; i < kQuotaLeases; ++i) {
    ASSERT_OK(Pin(l_.get(), pl_, "l", /*ttl_ms=*/1).first);
  }
  // Each lease ends 1 ms after it was taken. Long leases then take every
  // place the short ones held: each try is a real call, refused
  // (RESOURCE_EXHAUSTED) only while a short lease has not expired.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  uint64_t long_leases = 0;
  while (long_leases < kQuotaLeases && std::chrono::steady_clock::now() < give_up) {
    grpc::Status st = Pin(l_.get(), pl_, "l").first;
    if (st.ok()) {
      ++long_leases;
    } else {
      ASSERT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
    }
    ASSERT_LE(LeasesOf("l"), kQuotaLeases);
  }
  EXPECT_EQ(long_leases, kQuotaLeases);
  EXPECT_EQ(LeasesOf("l"), kQuotaLeases);
  EXPECT_EQ(Pin(l_.get(), pl_, "l").first.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST_F(LeaseLimitTest, AContextsNextSelectReplacesItsLeaseAtTheLimit) {
  const uint64_t first = OpenContext(l_.get(), pl_, "l");
  const uint64_t second = OpenContext(l_.get(), pl_, "l");
  EXPECT_EQ(SelectOnce(l_.get(), first, 1).code(), 0);
  ASSERT_EQ(LeasesOf("l"), 1u) << "the Select pinned nothing";
  for (uint64_t i = 1; i < kQuotaLeases; ++i) ASSERT_OK(Pin(l_.get(), pl_, "l").first);
  EXPECT_EQ(Pin(l_.get(), pl_, "l").first.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  // The first context's next Select trades its lease for a new one.
  v1::ItemStatus again = SelectOnce(l_.get(), first, 2);
  EXPECT_EQ(again.code(), 0) << again.message();
  EXPECT_EQ(LeasesOf("l"), kQuotaLeases);
  // The second context's first Select would be one lease more.
  v1::ItemStatus more = SelectOnce(l_.get(), second, 1);
  EXPECT_EQ(more.code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(more.message(), HasSubstr("quota leases"));
  EXPECT_EQ(LeasesOf("l"), kQuotaLeases);
}

// Finding 10 (b): what a client sent comes back cut to a few dozen bytes.
TEST_F(LeaseLimitTest, ErrorsEchoAtMostAFewBytesOfA1MiBName) {
  const std::string huge(1 << 20, 'n');
  constexpr size_t kMaxMessageBytes = 1024;
  auto check = [&](const std::string& call, int code, const std::string& message,
                   const std::string& field) {
    SCOPED_TRACE(call);
    EXPECT_NE(code, 0);
    EXPECT_LT(message.size(), kMaxMessageBytes) << message.substr(0, 200);
    EXPECT_THAT(message, HasSubstr(field));
  };
  v1::KvTier::Stub* stub = l_->kvtier_stub();
  {
    grpc::ClientContext ctx;
    v1::ListContextVersionsRequest req;
    req.set_profile_id(pl_);
    req.set_context_key(huge);
    v1::ListContextVersionsResponse resp;
    grpc::Status st = stub->ListContextVersions(&ctx, req, &resp);
    check("ListContextVersions", st.error_code(), st.error_message(), "context_key");
  }
  {
    grpc::ClientContext ctx;
    v1::DropContextVersionRequest req;
    req.set_profile_id(pl_);
    req.set_context_key(huge);
    v1::DropContextVersionResponse resp;
    grpc::Status st = stub->DropContextVersion(&ctx, req, &resp);
    check("DropContextVersion", st.error_code(), st.error_message(), "context_key");
  }
  {
    v1::ModelProfile p = Profile();
    p.set_name(huge);
    grpc::ClientContext ctx;
    v1::RegisterProfileRequest req;
    *req.mutable_profile() = p;
    v1::RegisterProfileResponse resp;
    grpc::Status st = stub->RegisterProfile(&ctx, req, &resp);
    check("RegisterProfile", st.error_code(), st.error_message(), "profile.name");
  }
  {
    grpc::ClientContext ctx;
    v1::LookupRequest req;
    req.set_profile_id(pl_);
    req.add_block_ids(huge);
    v1::LookupResponse resp;
    grpc::Status st = stub->Lookup(&ctx, req, &resp);
    check("Lookup", st.error_code(), st.error_message(), "block_id");
  }
  {
    grpc::ClientContext ctx;
    v1::DeleteBlocksRequest req;
    req.set_profile_id(pl_);
    req.add_block_ids(huge);
    v1::DeleteBlocksResponse resp;
    ASSERT_OK(stub->DeleteBlocks(&ctx, req, &resp));
    ASSERT_EQ(resp.statuses_size(), 1);
    check("DeleteBlocks", resp.statuses(0).code(), resp.statuses(0).message(), "block_id");
  }
  {
    grpc::ClientContext ctx;
    v1::OpenContextRequest req;
    req.set_profile_id(pl_);
    req.add_segments()->add_block_ids(huge);
    v1::OpenContextResponse resp;
    grpc::Status st = stub->OpenContext(&ctx, req, &resp);
    check("OpenContext", st.error_code(), st.error_message(), "block_ids[0]");
  }
  // The admin's Evict names a tenant and block ids of its choosing.
  auto ops = As("ops");
  for (bool huge_tenant : {false, true}) {
    grpc::ClientContext ctx;
    v1::EvictRequest req;
    req.set_tenant(huge_tenant ? huge : "l");
    req.set_profile_id(pl_);
    req.add_block_ids(huge_tenant ? BlockIdOf("l", 0) : huge);
    req.set_tier(v1::TIER_HOST);
    v1::EvictResponse resp;
    grpc::Status st = ops->admin_stub()->Evict(&ctx, req, &resp);
    if (!st.ok()) {
      check("Evict", st.error_code(), st.error_message(), huge_tenant ? "tenant" : "block_id");
      continue;
    }
    ASSERT_EQ(resp.statuses_size(), 1);
    check("Evict item", resp.statuses(0).code(), resp.statuses(0).message(),
          huge_tenant ? "tenant" : "block_id");
  }
  EXPECT_OK(l_->Health());
}

}  // namespace
}  // namespace kvtier::security
