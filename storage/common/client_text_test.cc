#include "storage/common/client_text.h"

#include <string>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

TEST(ClientTextTest, ShortTextIsQuotedWhole) {
  EXPECT_EQ(ClientText("llama-3-8b"), "llama-3-8b");
  EXPECT_EQ(ClientHex("\x01\xab"), "01ab");
  EXPECT_EQ(ClientText(""), "");
}

TEST(ClientTextTest, LongTextIsCutAndCounted) {
  const std::string huge(1 << 20, 'n');
  const std::string quoted = ClientText(huge);
  EXPECT_EQ(quoted, std::string(kMaxQuotedBytes, 'n') + "...(1048576 bytes)");
  EXPECT_EQ(ClientText(huge, 4), "nnnn...(1048576 bytes)");
  EXPECT_EQ(ClientHex(huge, 2), "6e6e...(1048576 bytes)");
  EXPECT_LE(ClientHex(huge).size(), 2 * 32 + 32u);
}

TEST(ClientTextTest, ControlBytesAndQuotesAreEscaped) {
  EXPECT_EQ(ClientText(std::string("a\nb\"\0z", 6)), "a\\nb\\\"\\x00z");
  // The worst case: every byte escaped as \xNN.
  const std::string binary(1000, '\x01');
  EXPECT_LE(ClientText(binary).size(), 4 * kMaxQuotedBytes + 32);
}

}  // namespace
}  // namespace kvtier
