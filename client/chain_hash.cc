#include "client/chain_hash.h"

#include <openssl/sha.h>

// SHA256_* is deprecated in OpenSSL 3 but exact and allocation-free; EVP
// would add a heap context per id.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace kvtier {
namespace {

void PutU64(SHA256_CTX* ctx, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  SHA256_Update(ctx, b, 8);
}

void PutField(SHA256_CTX* ctx, char tag, const void* data, uint64_t len) {
  SHA256_Update(ctx, &tag, 1);
  PutU64(ctx, len);
  if (len > 0) SHA256_Update(ctx, data, len);
}

}  // namespace

BlockId ChainHash(const ChainHashInput& input) {
  SHA256_CTX ctx;
  SHA256_Init(&ctx);
  static constexpr char kDomain[] = "kvtier.chain.v1";
  SHA256_Update(&ctx, kDomain, sizeof(kDomain) - 1);
  uint8_t profile[8];
  for (int i = 0; i < 8; ++i) profile[i] = static_cast<uint8_t>(input.profile_id >> (8 * i));
  PutField(&ctx, 'P', profile, 8);
  PutField(&ctx, 'A', input.parent.data(), input.parent.size());
  std::vector<uint8_t> tokens(input.tokens.size() * 4);
  for (size_t i = 0; i < input.tokens.size(); ++i) {
    for (int b = 0; b < 4; ++b)
      tokens[4 * i + b] = static_cast<uint8_t>(input.tokens[i] >> (8 * b));
  }
  PutField(&ctx, 'T', tokens.data(), tokens.size());
  const char x = 'X';
  SHA256_Update(&ctx, &x, 1);
  PutU64(&ctx, input.extra_keys.size());
  for (const std::string& key : input.extra_keys) {
    PutU64(&ctx, key.size());
    SHA256_Update(&ctx, key.data(), key.size());
  }
  BlockId id;
  SHA256_Final(id.data(), &ctx);
  return id;
}

std::vector<BlockId> ChainHashSequence(uint64_t profile_id, absl::Span<const uint32_t> tokens,
                                       uint32_t block_size_tokens,
                                       const std::vector<std::string>& extra_keys) {
  std::vector<BlockId> ids;
  if (block_size_tokens == 0) return ids;
  std::string parent;
  for (size_t start = 0; start + block_size_tokens <= tokens.size(); start += block_size_tokens) {
    ChainHashInput in{profile_id, parent, tokens.subspan(start, block_size_tokens), extra_keys};
    ids.push_back(ChainHash(in));
    parent = ToBytes(ids.back());
  }
  return ids;
}

}  // namespace kvtier

#pragma GCC diagnostic pop
