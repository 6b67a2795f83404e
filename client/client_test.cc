#include "client/client.h"

#include "gtest/gtest.h"

namespace kvtier {
namespace {

TEST(NormalizeTargetTest, PathsBecomeUnixTargets) {
  EXPECT_EQ(NormalizeTarget("./var/kvtier/kvtierd.sock"), "unix:./var/kvtier/kvtierd.sock");
  EXPECT_EQ(NormalizeTarget("/run/kvtier/kvtierd.sock"), "unix:/run/kvtier/kvtierd.sock");
  EXPECT_EQ(NormalizeTarget("kvtierd.sock"), "unix:kvtierd.sock");
  EXPECT_EQ(NormalizeTarget("unix:/x"), "unix:/x");
  EXPECT_EQ(NormalizeTarget("127.0.0.1:50551"), "127.0.0.1:50551");
  EXPECT_EQ(NormalizeTarget("dns:///h:1"), "dns:///h:1");
}

TEST(ClientTest, EmptyTargetIsInvalid) {
  auto client = Client::Connect("");
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ClientTest, NoDaemonIsUnavailable) {
  ClientOptions options;
  options.call_timeout = std::chrono::milliseconds(500);
  auto client = Client::Connect("/nonexistent/kvtier.sock", options);
  ASSERT_TRUE(client.ok());
  auto health = (*client)->Health();
  ASSERT_FALSE(health.ok());
  EXPECT_TRUE(health.status().code() == absl::StatusCode::kUnavailable ||
              health.status().code() == absl::StatusCode::kDeadlineExceeded)
      << health.status();
}

}  // namespace
}  // namespace kvtier
