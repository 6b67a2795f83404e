#include "tests/load/load_block.h"

#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "tests/testutil/payload_hash.h"

namespace kvtier::load {

using ::kvtier::testing::Fnv1a64;
using ::kvtier::testing::SplitMix64;

v1::ModelProfile LoadProfile(uint64_t block_bytes) {
  v1::ModelProfile profile;
  profile.set_name("load-test");
  profile.set_revision(absl::StrCat(block_bytes));
  profile.set_num_layers(static_cast<uint32_t>(block_bytes / kBytesPerLayer));
  profile.set_num_kv_heads(kKvHeads);
  profile.set_head_dim(kHeadDim);
  profile.set_block_size_tokens(kTokens);
  profile.set_dtype(v1::DTYPE_FP16);
  return profile;
}

std::string BlockId(uint32_t stream, uint64_t seq) {
  std::string id = "ld";
  for (int shift = 24; shift >= 0; shift -= 8) id.push_back(static_cast<char>(stream >> shift));
  for (int shift = 56; shift >= 0; shift -= 8) id.push_back(static_cast<char>(seq >> shift));
  return id;
}

uint32_t StreamOf(std::string_view id) {
  if (id.size() != 14 || id.substr(0, 2) != "ld") return 0;
  uint32_t stream = 0;
  for (int i = 2; i < 6; ++i) stream = (stream << 8) | static_cast<unsigned char>(id[i]);
  return stream;
}

std::string Payload(std::string_view id, size_t size_bytes) {
  std::string out(size_bytes, '\0');
  uint64_t state = Fnv1a64(id);
  // Four fp16 lanes per 64-bit word: keep each lane's sign and mantissa,
  // force its exponent into [9, 16] (biased), so every value is finite.
  constexpr uint64_t kKeep = 0x83ff83ff83ff83ffull;
  constexpr uint64_t kExpBase = 0x2400240024002400ull;  // exponent 9 in each lane
  constexpr uint64_t kExpLow3 = 0x1c001c001c001c00ull;  // exponent bits 0..2
  for (size_t i = 0; i + 8 <= size_bytes; i += 8) {
    const uint64_t r = SplitMix64(&state);
    // 9 + (0..7): adding the low three exponent bits to 9 never carries
    // out of the lane (9 + 7 = 16 < 31).
    const uint64_t word = (r & kKeep) + kExpBase + ((r >> 3) & kExpLow3);
    std::memcpy(out.data() + i, &word, 8);  // little-endian lanes, as fp16 arrays are
  }
  return out;
}

std::string ComparePayload(std::string_view id, size_t want_size, const void* data, size_t size) {
  if (size != want_size) return absl::StrCat(size, " bytes instead of ", want_size);
  const std::string want = Payload(id, want_size);
  if (std::memcmp(want.data(), data, size) == 0) return "";
  const auto* got = static_cast<const char*>(data);
  size_t at = 0;
  while (at < size && want[at] == got[at]) ++at;
  return absl::StrCat("differs from Payload(id) at offset ", at);
}

std::string Hex(std::string_view bytes) {
  return absl::BytesToHexString(absl::string_view(bytes.data(), bytes.size()));
}

}  // namespace kvtier::load
