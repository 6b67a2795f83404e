#include "client/chain_hash.h"

#include <set>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

ChainHashInput Base(const std::vector<uint32_t>& tokens) {
  return ChainHashInput{7, std::string(32, '\x11'), tokens, {"lora:a", "salt"}};
}

TEST(ChainHashTest, Deterministic) {
  std::vector<uint32_t> t = {1, 2, 3, 4};
  EXPECT_EQ(ChainHash(Base(t)), ChainHash(Base(t)));
}

TEST(ChainHashTest, EverySingleFieldChangesTheId) {
  std::vector<uint32_t> t = {1, 2, 3, 4};
  const BlockId base = ChainHash(Base(t));
  std::set<BlockId> seen = {base};

  ChainHashInput in = Base(t);
  in.profile_id = 8;
  EXPECT_TRUE(seen.insert(ChainHash(in)).second) << "profile";

  in = Base(t);
  in.parent[31] ^= 1;
  EXPECT_TRUE(seen.insert(ChainHash(in)).second) << "parent";

  in = Base(t);
  in.parent.clear();
  EXPECT_TRUE(seen.insert(ChainHash(in)).second) << "no parent";

  std::vector<uint32_t> t2 = {1, 2, 3, 5};
  EXPECT_TRUE(seen.insert(ChainHash(Base(t2))).second) << "token value";
  std::vector<uint32_t> t3 = {2, 1, 3, 4};
  EXPECT_TRUE(seen.insert(ChainHash(Base(t3))).second) << "token order";
  std::vector<uint32_t> t4 = {1, 2, 3};
  EXPECT_TRUE(seen.insert(ChainHash(Base(t4))).second) << "token count";

  in = Base(t);
  in.extra_keys = {"lora:b", "salt"};
  EXPECT_TRUE(seen.insert(ChainHash(in)).second) << "extra key value";
  in.extra_keys = {"salt", "lora:a"};
  EXPECT_TRUE(seen.insert(ChainHash(in)).second) << "extra key order";
  in.extra_keys = {"lora:a"};
  EXPECT_TRUE(seen.insert(ChainHash(in)).second) << "extra key count";
}

TEST(ChainHashTest, FieldBoundariesMatter) {
  std::vector<uint32_t> t = {9};
  ChainHashInput a{1, "", t, {"ab", "c"}};
  ChainHashInput b{1, "", t, {"a", "bc"}};
  EXPECT_NE(ChainHash(a), ChainHash(b));
  // Parent bytes cannot be confused with token bytes.
  std::vector<uint32_t> none;
  ChainHashInput c{1, std::string("\x09\x00\x00\x00", 4), none, {}};
  ChainHashInput d{1, "", t, {}};
  EXPECT_NE(ChainHash(c), ChainHash(d));
}

TEST(ChainHashTest, SequenceChainsAndDropsPartialBlock) {
  std::vector<uint32_t> tokens(50);
  for (uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = i;
  auto ids = ChainHashSequence(3, tokens, 16);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[0], ChainHash({3, "", absl::MakeConstSpan(tokens).subspan(0, 16), {}}));
  EXPECT_EQ(ids[1],
            ChainHash({3, ToBytes(ids[0]), absl::MakeConstSpan(tokens).subspan(16, 16), {}}));
  // Same tokens after a different prefix give a different id.
  std::vector<uint32_t> other = tokens;
  other[0] = 999;
  auto other_ids = ChainHashSequence(3, other, 16);
  EXPECT_NE(ids[1], other_ids[1]);
  EXPECT_TRUE(ChainHashSequence(3, tokens, 0).empty());
}

}  // namespace
}  // namespace kvtier
