// Runs the example engine loop (client/examples/engine_loop.cc) as a child
// process against a real daemon (in process, shared-memory arena, real
// RocksDB, gRPC over its Unix socket): it must exit 0, which it does only
// when every block it read through a Select handle matched what it put.
#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/subprocess.h"
#include "tests/integration/test_daemon.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

namespace kvtier {
namespace {

using ::testing::HasSubstr;

TEST(EngineLoopExampleTest, ReadsTheBytesItPutThroughSelectHandles) {
  const testing::ScopedTempDir tmp("engine-loop");
  auto daemon = testing::StartTestDaemon(tmp.path(), {"tiers.device.backend=shm"});
  ASSERT_OK(daemon) << daemon.status();
  testing::CommandResult run =
      testing::RunCommand({KVTIER_ENGINE_LOOP_PATH, daemon->server->socket_path()});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("24 steps, 12 blocks in the context"));
  EXPECT_THAT(run.out, HasSubstr("block reads verified"));
  EXPECT_THAT(run.out, ::testing::Not(HasSubstr(" 0 block reads")));
  // The example released its pins and closed its context.
  auto contexts = daemon->client->ListContexts();
  ASSERT_OK(contexts) << contexts.status();
  EXPECT_EQ(contexts->contexts_size(), 0);
  daemon->client.reset();
  daemon->server.reset();
}

}  // namespace
}  // namespace kvtier
