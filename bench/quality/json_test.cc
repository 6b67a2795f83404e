#include "bench/quality/json.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::quality {
namespace {

using ::testing::HasSubstr;

TEST(JsonTest, ParsesObjectsArraysAndScalars) {
  absl::StatusOr<JsonValue> v = ParseJson(
      R"( {"a": [1, -2, 3.5e1], "b": {"c": "x\"y\\z\u00e9\ud83d\ude00"},
           "t": true, "f": false, "n": null, "big": 9007199254740993} )");
  ASSERT_OK(v) << v.status();
  const JsonValue* a = v->Find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->array.size(), 3u);
  EXPECT_TRUE(a->array[0].is_integer);
  EXPECT_EQ(a->array[1].integer, -2);
  EXPECT_FALSE(a->array[2].is_integer);
  EXPECT_DOUBLE_EQ(a->array[2].number, 35.0);
  EXPECT_EQ(v->Find("b")->Find("c")->string, "x\"y\\z\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_TRUE(v->Find("t")->boolean);
  EXPECT_FALSE(v->Find("f")->boolean);
  EXPECT_EQ(v->Find("n")->type, JsonValue::Type::kNull);
  // Integers beyond 2^53 stay exact.
  EXPECT_EQ(v->Find("big")->integer, 9007199254740993LL);
  EXPECT_EQ(v->Find("missing"), nullptr);
}

TEST(JsonTest, RejectsMalformedInputWithPosition) {
  for (const char* bad : {"", "{", "{\"a\":}", "{\"a\" 1}", "[1,]", "{\"a\":1}x", "\"abc", "01",
                          "{\"a\":tru}", "\"\\q\"", "\"\\ud800\"", "{1:2}"}) {
    absl::StatusOr<JsonValue> v = ParseJson(bad);
    ASSERT_FALSE(v.ok()) << bad;
    EXPECT_THAT(v.status().message(), HasSubstr("JSON header parse error"));
    EXPECT_THAT(v.status().message(), HasSubstr("at byte")) << bad;
  }
}

TEST(JsonTest, RejectsDuplicateKeys) {
  absl::StatusOr<JsonValue> v = ParseJson(R"({"q": 1, "q": 2})");
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(v.status().message(), HasSubstr("duplicate key \"q\""));
}

TEST(JsonTest, LimitsNesting) {
  std::string deep(kMaxJsonDepth + 2, '[');
  deep += std::string(kMaxJsonDepth + 2, ']');
  absl::StatusOr<JsonValue> v = ParseJson(deep);
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(v.status().message(), HasSubstr("nesting"));
  std::string ok(kMaxJsonDepth, '[');
  ok += std::string(kMaxJsonDepth, ']');
  EXPECT_OK(ParseJson(ok));
}

}  // namespace
}  // namespace kvtier::quality
