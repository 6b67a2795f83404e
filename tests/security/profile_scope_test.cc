// Profiles per tenant (issue 31, finding 9): a profile belongs to the
// tenant that registered it. Another tenant may register the same name
// (whatever shape the first one gave it), never reads or uses the first
// one's profile (its id answers NOT_FOUND exactly as an id that does not
// exist), never sees its head-weight versions move, and cannot walk the
// ids (they are random). Every tenant finds its own profiles and blocks
// again after a restart.
#include <set>
#include <tuple>

#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "tests/security/security_fixture.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::security {
namespace {

using ::testing::Each;
using ::testing::HasSubstr;
using testing::StatusIs;

// The name of the finding's report; the first registration is bogus.
v1::ModelProfile Llama(uint32_t layers) {
  v1::ModelProfile p;
  p.set_name("llama-3-8b");
  p.set_revision("main");
  p.set_num_layers(layers);
  p.set_num_kv_heads(kHeads);
  p.set_head_dim(kDim);
  p.set_block_size_tokens(kTokens);
  p.set_dtype(v1::DTYPE_FP16);
  return p;
}

// One call's outcome, with the profile id in its message replaced by "ID"
// so that the answers for two ids can be compared.
struct Answer {
  std::string call;
  grpc::StatusCode code = grpc::StatusCode::OK;
  std::string message;
};

class ProfileScopeTest : public SecurityTest {
 protected:
  void SetUp() override {
    StartDaemon({"index.head_weights_min_blocks=2"});
    a_ = As("a");
    b_ = As("b");
  }

  static Answer Of(const std::string& call, const grpc::Status& st, uint64_t id) {
    return Answer{call, st.error_code(),
                  absl::StrReplaceAll(st.error_message(), {{std::to_string(id), "ID"}})};
  }

  // Every call of `c` that takes a profile_id, made with `id`.
  static std::vector<Answer> CallsNaming(Client* c, uint64_t id) {
    std::vector<Answer> out;
    v1::KvTier::Stub* stub = c->kvtier_stub();
    {
      grpc::ClientContext ctx;
      v1::GetProfileRequest req;
      req.set_profile_id(id);
      v1::GetProfileResponse resp;
      out.push_back(Of("GetProfile", stub->GetProfile(&ctx, req, &resp), id));
    }
    {
      grpc::ClientContext ctx;
      v1::ReserveSlotsRequest req;
      req.set_profile_id(id);
      req.set_count(1);
      v1::ReserveSlotsResponse resp;
      out.push_back(Of("ReserveSlots", stub->ReserveSlots(&ctx, req, &resp), id));
    }
    {
      grpc::ClientContext ctx;
      v1::PutBlocksResponse resp;
      auto writer = stub->PutBlocks(&ctx, &resp);
      v1::PutBlocksRequest req;
      req.set_profile_id(id);
      v1::BlockPut* b = req.add_blocks();
      b->set_block_id(BlockIdOf("probe", 0));
      b->set_data(Payload(1));
      writer->Write(req);
      writer->WritesDone();
      out.push_back(Of("PutBlocks", writer->Finish(), id));
    }
    for (auto mode : {v1::RETURN_MODE_BYTES, v1::RETURN_MODE_HANDLES}) {
      grpc::ClientContext ctx;
      v1::GetBlocksRequest req;
      req.set_profile_id(id);
      req.set_mode(mode);
      req.add_block_ids(BlockIdOf("b", 0));
      auto reader = stub->GetBlocks(&ctx, req);
      v1::GetBlocksResponse resp;
      while (reader->Read(&resp)) {
      }
      out.push_back(Of(mode == v1::RETURN_MODE_BYTES ? "GetBlocks(bytes)" : "GetBlocks(handles)",
                       reader->Finish(), id));
    }
    {
      grpc::ClientContext ctx;
      v1::LookupRequest req;
      req.set_profile_id(id);
      req.add_block_ids(BlockIdOf("b", 0));
      v1::LookupResponse resp;
      out.push_back(Of("Lookup", stub->Lookup(&ctx, req, &resp), id));
    }
    {
      grpc::ClientContext ctx;
      v1::OpenContextRequest req;
      req.set_profile_id(id);
      req.add_segments()->add_block_ids(BlockIdOf("b", 0));
      v1::OpenContextResponse resp;
      out.push_back(Of("OpenContext", stub->OpenContext(&ctx, req, &resp), id));
    }
    {
      grpc::ClientContext ctx;
      v1::ListContextVersionsRequest req;
      req.set_profile_id(id);
      v1::ListContextVersionsResponse resp;
      out.push_back(Of("ListContextVersions", stub->ListContextVersions(&ctx, req, &resp), id));
    }
    {
      grpc::ClientContext ctx;
      v1::DeleteBlocksRequest req;
      req.set_profile_id(id);
      req.add_block_ids(BlockIdOf("b", 0));
      v1::DeleteBlocksResponse resp;
      grpc::Status st = stub->DeleteBlocks(&ctx, req, &resp);
      out.push_back(Of("DeleteBlocks", st, id));
      for (const auto& item : resp.statuses()) {
        out.push_back(Answer{"DeleteBlocks item", static_cast<grpc::StatusCode>(item.code()),
                             absl::StrReplaceAll(item.message(), {{std::to_string(id), "ID"}})});
      }
    }
    return out;
  }

  std::unique_ptr<Client> a_, b_;
};

// The report: A registered B's model name first with a bogus shape, and
// B's real registration failed with ALREADY_EXISTS.
TEST_F(ProfileScopeTest, ANameAnotherTenantRegisteredFirstIsStillFree) {
  auto bogus = a_->RegisterProfile(Llama(1));
  ASSERT_OK(bogus);
  auto real = b_->RegisterProfile(Llama(kLayers));
  ASSERT_OK(real);
  EXPECT_TRUE(real->created());
  EXPECT_NE(real->profile_id(), bogus->profile_id());
  EXPECT_EQ(real->block_size_bytes(), kBlockBytes);

  auto mine = b_->GetProfile(real->profile_id());
  ASSERT_OK(mine);
  EXPECT_EQ(mine->profile().num_layers(), static_cast<uint32_t>(kLayers));
  auto theirs = a_->GetProfile(bogus->profile_id());
  ASSERT_OK(theirs);
  EXPECT_EQ(theirs->profile().num_layers(), 1u);

  // Within one tenant a name still has one shape, and an identical
  // registration is the same profile.
  auto again = b_->RegisterProfile(Llama(kLayers));
  ASSERT_OK(again);
  EXPECT_FALSE(again->created());
  EXPECT_EQ(again->profile_id(), real->profile_id());
  EXPECT_THAT(b_->RegisterProfile(Llama(3)), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(a_->RegisterProfile(Llama(kLayers)), StatusIs(absl::StatusCode::kAlreadyExists));

  // B's blocks go under its own profile.
  EXPECT_THAT(Put(b_.get(), real->profile_id(), Ids("b", 2), 1), Each(0));
}

TEST_F(ProfileScopeTest, AnotherTenantsProfileIdAnswersAsAnIdThatDoesNotExist) {
  const uint64_t pb = Register(b_.get());
  ASSERT_NE(pb, 0u);
  EXPECT_THAT(Put(b_.get(), pb, Ids("b", 2), 1), Each(0));
  const uint64_t pa = Register(a_.get());
  ASSERT_NE(pa, 0u);
  EXPECT_NE(pa, pb) << "an identical definition of two tenants is two profiles";
  uint64_t unknown = pb ^ 0x5a5a5a5a5a5a5a5aull;
  if (unknown == pa) unknown ^= 1;

  const std::vector<Answer> foreign = CallsNaming(a_.get(), pb);
  const std::vector<Answer> missing = CallsNaming(a_.get(), unknown);
  ASSERT_EQ(foreign.size(), missing.size());
  for (size_t i = 0; i < foreign.size(); ++i) {
    SCOPED_TRACE(foreign[i].call);
    EXPECT_EQ(foreign[i].code, missing[i].code);
    EXPECT_EQ(foreign[i].message, missing[i].message);
    if (foreign[i].call != "DeleteBlocks" && foreign[i].call != "DeleteBlocks item") {
      EXPECT_EQ(foreign[i].code, grpc::StatusCode::NOT_FOUND) << foreign[i].message;
      EXPECT_THAT(foreign[i].message, HasSubstr("profile_id"));
    }
  }
  // B's blocks are still there for B.
  v1::LookupRequest lookup;
  lookup.set_profile_id(pb);
  for (const auto& id : Ids("b", 2)) lookup.add_block_ids(id);
  auto seen = b_->Lookup(lookup);
  ASSERT_OK(seen);
  EXPECT_EQ(seen->prefix_blocks(), 2u);
}

TEST_F(ProfileScopeTest, HeadWeightsOfAnIdenticalDefinitionAreEachTenantsOwn) {
  const uint64_t pa = Register(a_.get());
  const uint64_t pb = Register(b_.get());
  ASSERT_NE(pa, 0u);
  ASSERT_NE(pb, 0u);
  // index.head_weights_min_blocks = 2: B's weights are estimated from its
  // second block on and re-estimated at 4, 8, ... (durable puts summarise
  // before they are acknowledged).
  EXPECT_THAT(Put(b_.get(), pb, Ids("b", 4), 1, /*durable=*/true), Each(0));
  auto bs = b_->GetProfile(pb);
  ASSERT_OK(bs);
  EXPECT_GE(bs->head_weights_version(), 1u);
  auto as = a_->GetProfile(pa);
  ASSERT_OK(as);
  EXPECT_EQ(as->head_weights_version(), 0u) << "A sees B's puts move its head weights";
  EXPECT_EQ(as->head_weights_size(), 0);
}

TEST_F(ProfileScopeTest, IdsAreRandomAndQuotasCountEachTenantsOwn) {
  std::set<uint64_t> ids;
  for (int i = 0; i < 4; ++i) {
    v1::ModelProfile p = Profile();
    p.set_name("model-" + std::to_string(i));
    auto r = a_->RegisterProfile(p);
    ASSERT_OK(r);
    ids.insert(r->profile_id());
  }
  ASSERT_EQ(ids.size(), 4u);
  // 64-bit random ids: neither small nor next to one another.
  for (uint64_t id : ids) EXPECT_GT(id, uint64_t{1} << 32) << id;
  EXPECT_GT(*ids.rbegin() - *ids.begin(), uint64_t{1} << 32);

  // q (profiles = 1) registers the name A uses: its first profile. Its
  // second is past its quota, whatever others registered.
  auto q = As("q");
  auto first = q->RegisterProfile(Profile());
  ASSERT_OK(first);
  EXPECT_TRUE(first->created());
  v1::ModelProfile other = Profile();
  other.set_name("model-0");
  auto second = q->RegisterProfile(other);
  EXPECT_THAT(second, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(second.status().message(), HasSubstr("quota profiles"));

  // The admin listing shows every tenant's profiles with their owner.
  grpc::ClientContext ctx;
  v1::ListProfilesResponse listed;
  ASSERT_OK(As("ops")->admin_stub()->ListProfiles(&ctx, v1::ListProfilesRequest(), &listed));
  std::multiset<std::string> owners;
  for (const auto& p : listed.profiles()) owners.insert(p.owner());
  EXPECT_EQ(owners.count("a"), 4u);
  EXPECT_EQ(owners.count("q"), 1u);
  auto stats = As("ops")->Stats();
  ASSERT_OK(stats);
  for (const auto& t : stats->tenants()) {
    if (t.name() == "a") {
      EXPECT_EQ(t.profiles(), 4u);
    }
    if (t.name() == "q") {
      EXPECT_EQ(t.profiles(), 1u);
    }
  }
}

TEST_F(ProfileScopeTest, EveryTenantFindsItsProfilesAndBlocksAfterARestart) {
  auto pa = a_->RegisterProfile(Llama(1));
  auto pb = b_->RegisterProfile(Llama(kLayers));
  ASSERT_OK(pa);
  ASSERT_OK(pb);
  EXPECT_THAT(Put(b_.get(), pb->profile_id(), Ids("b", 3), 10, /*durable=*/true), Each(0));
  const uint64_t pa2 = Register(a_.get());
  EXPECT_THAT(Put(a_.get(), pa2, Ids("a", 2), 20, /*durable=*/true), Each(0));

  a_.reset();
  b_.reset();
  server_.reset();
  RestartDaemon();
  ASSERT_NE(server_, nullptr);
  a_ = As("a");
  b_ = As("b");

  auto b_again = b_->RegisterProfile(Llama(kLayers));
  ASSERT_OK(b_again);
  EXPECT_FALSE(b_again->created());
  EXPECT_EQ(b_again->profile_id(), pb->profile_id());
  auto a_again = a_->RegisterProfile(Llama(1));
  ASSERT_OK(a_again);
  EXPECT_EQ(a_again->profile_id(), pa->profile_id());
  auto b_profile = b_->GetProfile(pb->profile_id());
  ASSERT_OK(b_profile);
  EXPECT_EQ(b_profile->profile().num_layers(), static_cast<uint32_t>(kLayers));

  for (auto [c, profile_id, tag, seed, n] :
       {std::make_tuple(b_.get(), pb->profile_id(), "b", 10, 3),
        std::make_tuple(a_.get(), pa2, "a", 20, 2)}) {
    v1::GetBlocksRequest get;
    get.set_profile_id(profile_id);
    get.set_mode(v1::RETURN_MODE_BYTES);
    for (const auto& id : Ids(tag, n)) get.add_block_ids(id);
    auto got = c->GetBlocks(get);
    ASSERT_OK(got);
    ASSERT_EQ(got->size(), static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ((*got)[i].status().code(), 0) << (*got)[i].status().message();
      EXPECT_EQ((*got)[i].data(), Payload(seed + i));
    }
  }
  EXPECT_THAT(a_->GetProfile(pb->profile_id()), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(b_->GetProfile(pa2), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace kvtier::security
