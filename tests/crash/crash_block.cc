#include "tests/crash/crash_block.h"

#include "absl/strings/escaping.h"
#include "tests/testutil/payload_hash.h"

namespace kvtier::crash {

using ::kvtier::testing::Fnv1a64;
using ::kvtier::testing::SplitMix64;

v1::ModelProfile CrashProfile() {
  v1::ModelProfile profile;
  profile.set_name("crash-loop");
  profile.set_revision("1");
  profile.set_num_layers(kLayers);
  profile.set_num_kv_heads(kKvHeads);
  profile.set_head_dim(kHeadDim);
  profile.set_block_size_tokens(kTokens);
  profile.set_dtype(v1::DTYPE_FP16);
  return profile;
}

std::string BlockId(uint8_t owner, uint64_t seq) {
  std::string id(1, static_cast<char>(owner));
  for (int shift = 56; shift >= 0; shift -= 8) id.push_back(static_cast<char>(seq >> shift));
  uint64_t state = Fnv1a64(id);
  const size_t filler = SplitMix64(&state) % 24;
  for (size_t i = 0; i < filler; ++i) id.push_back(static_cast<char>(SplitMix64(&state)));
  return id;
}

std::string Payload(std::string_view id) {
  std::string out(kBlockBytes, '\0');
  uint64_t state = Fnv1a64(id);
  for (size_t i = 0; i < kBlockBytes; i += 2) {
    const uint64_t r = SplitMix64(&state);
    // fp16: sign, a biased exponent in [9, 17] (2^-6 .. 2^2), any mantissa.
    const uint16_t sign = static_cast<uint16_t>((r >> 63) << 15);
    const uint16_t exponent = static_cast<uint16_t>((9 + (r >> 32) % 9) << 10);
    const uint16_t mantissa = static_cast<uint16_t>(r & 0x3ff);
    const uint16_t half = sign | exponent | mantissa;
    out[i] = static_cast<char>(half & 0xff);
    out[i + 1] = static_cast<char>(half >> 8);
  }
  return out;
}

std::string WrongPayload(std::string_view id) {
  std::string out = Payload(id);
  out[kBlockBytes / 2] ^= 0x01;  // a mantissa bit: still finite
  return out;
}

std::string Hex(std::string_view bytes) {
  return absl::BytesToHexString(absl::string_view(bytes.data(), bytes.size()));
}

}  // namespace kvtier::crash
