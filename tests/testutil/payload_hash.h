// Small deterministic hashes for test payloads: SplitMix64 (a seeded
// generator step) and FNV-1a 64 (a hash of an id's bytes). Not for
// production checksums (the store uses XXH3).
//
// Thread safety: pure functions.
#ifndef KVTIER_TESTS_TESTUTIL_PAYLOAD_HASH_H_
#define KVTIER_TESTS_TESTUTIL_PAYLOAD_HASH_H_

#include <cstdint>
#include <string_view>

namespace kvtier::testing {

// Advances *state and returns the next 64 random bits.
inline uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline uint64_t Fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTUTIL_PAYLOAD_HASH_H_
