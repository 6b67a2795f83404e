// Prints the C++ client's chain hash for inputs given on the command line, so
// the Python client's chain_hash can be compared with it byte for byte.
//
//   kvtier_chain_hash_tool PROFILE_ID BLOCK_SIZE TOKENS [EXTRA_KEY...]
//     TOKENS: comma-separated u32 token ids ("" for none)
//   prints one line per finished block: the hex id of ChainHashSequence;
//   with BLOCK_SIZE 0, one line: ChainHash of all TOKENS with an empty parent.
//
// Exit codes: 0 ok, 2 usage error.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "client/chain_hash.h"

namespace {

bool ParseU64(const char* text, uint64_t* out) {
  char* end = nullptr;
  *out = std::strtoull(text, &end, 10);
  return end != text && *end == '\0';
}

bool ParseTokens(const std::string& text, std::vector<uint32_t>* out) {
  size_t start = 0;
  while (start < text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    uint64_t value = 0;
    if (!ParseU64(text.substr(start, comma - start).c_str(), &value) || value > 0xffffffffu) {
      return false;
    }
    out->push_back(static_cast<uint32_t>(value));
    start = comma + 1;
  }
  return true;
}

void PrintHex(const kvtier::BlockId& id) {
  for (uint8_t b : id) std::printf("%02x", b);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t profile_id = 0, block_size = 0;
  std::vector<uint32_t> tokens;
  if (argc < 4 || !ParseU64(argv[1], &profile_id) || !ParseU64(argv[2], &block_size) ||
      !ParseTokens(argv[3], &tokens)) {
    std::fprintf(stderr, "usage: %s PROFILE_ID BLOCK_SIZE TOKENS [EXTRA_KEY...]\n", argv[0]);
    return 2;
  }
  std::vector<std::string> extras(argv + 4, argv + argc);
  if (block_size == 0) {
    kvtier::ChainHashInput in{profile_id, "", tokens, extras};
    PrintHex(kvtier::ChainHash(in));
    return 0;
  }
  for (const auto& id :
       kvtier::ChainHashSequence(profile_id, tokens, static_cast<uint32_t>(block_size), extras)) {
    PrintHex(id);
  }
  return 0;
}
