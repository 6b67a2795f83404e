// Reference block ids: a chained content hash engines may use as block ids.
//
//   id_0 = ChainHash({profile_id, parent = "", tokens of block 0, extras})
//   id_i = ChainHash({profile_id, parent = id_{i-1}, tokens of block i, extras})
//
// SHA-256 over a domain tag and tagged, length-prefixed fields, so that
// changing any field (or moving bytes between fields) changes the id:
//
//   "kvtier.chain.v1"
//   'P' u64le(8)            u64le(profile_id)
//   'A' u64le(len(parent))  parent bytes
//   'T' u64le(4*n)          n token ids as u32le
//   'X' u64le(k)            k x (u64le(len) bytes)   extra keys, in order
//
// The daemon never computes or checks ids; any 1..32 byte string works.
// Thread-safe (pure function).
#ifndef KVTIER_CLIENT_CHAIN_HASH_H_
#define KVTIER_CLIENT_CHAIN_HASH_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace kvtier {

inline constexpr size_t kChainHashBytes = 32;
using BlockId = std::array<uint8_t, kChainHashBytes>;

struct ChainHashInput {
  uint64_t profile_id = 0;
  std::string parent;                   // previous block's id; "" for the first
  absl::Span<const uint32_t> tokens;    // token ids of this block
  std::vector<std::string> extra_keys;  // e.g. LoRA id, multimodal hashes, salt
};

BlockId ChainHash(const ChainHashInput& input);

// Ids of consecutive blocks of a token sequence, block_size_tokens each; a
// trailing partial block gets no id (it is not finished).
std::vector<BlockId> ChainHashSequence(uint64_t profile_id, absl::Span<const uint32_t> tokens,
                                       uint32_t block_size_tokens,
                                       const std::vector<std::string>& extra_keys = {});

inline std::string ToBytes(const BlockId& id) { return std::string(id.begin(), id.end()); }

}  // namespace kvtier

#endif  // KVTIER_CLIENT_CHAIN_HASH_H_
