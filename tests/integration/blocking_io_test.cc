// Block RPCs that wait on a disk run on the daemon's I/O threads
// (server.io_threads): while a durable put is stuck in an NVMe sync, the
// daemon keeps answering everything that does not need that disk, and a
// full queue (server.io_queue_limit) is refused with RESOURCE_EXHAUSTED.
// Real daemon in-process, real gRPC over a Unix socket; the disk is held
// through a FaultInjectionEnv (fault injection only).
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "daemon/config.h"
#include "daemon/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/env/fault_injection_env.h"
#include "tests/integration/test_daemon.h"
#include "tests/integration/tiny_profile.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

namespace kvtier {
namespace {

using ::testing::HasSubstr;
using testing::StatusIs;
using FileOp = FaultInjectionEnv::FileOp;

constexpr uint64_t kBlockBytes = testing::kTinyBlockBytes;

class BlockingIoTest : public ::testing::Test {
 protected:
  void Start(const std::string& io_threads, const std::string& queue_limit,
             const std::vector<std::string>& extra = {}) {
    env_ = std::make_unique<FaultInjectionEnv>(Env::Default(), 7);
    testing::TestDaemonOptions options;
    options.overrides = {"server.io_threads=" + io_threads, "server.io_queue_limit=" + queue_limit,
                         "tiers.device.capacity_bytes=256KiB", "tiers.host.capacity_bytes=512KiB",
                         "tiers.nvme.file_size_bytes=4MiB"};
    options.overrides.insert(options.overrides.end(), extra.begin(), extra.end());
    options.env = env_.get();
    auto daemon = testing::StartTestDaemon(dir_, options);
    ASSERT_OK(daemon);
    server_ = std::move(daemon->server);
    client_ = std::move(daemon->client);
    auto registered = client_->RegisterProfile(testing::TinyProfile());
    ASSERT_OK(registered);
    ASSERT_EQ(registered->block_size_bytes(), kBlockBytes);
    profile_id_ = registered->profile_id();
  }
  void TearDown() override {
    if (env_) env_->ReleaseHeldIo();
    client_.reset();
    server_.reset();
    env_.reset();
  }

  std::unique_ptr<Client> Connect() {
    auto client = Client::Connect(server_->socket_path());
    EXPECT_OK(client);
    return client.ok() ? std::move(*client) : nullptr;
  }
  static std::string Bytes(char c) { return std::string(kBlockBytes, c); }
  v1::PutBlocksRequest PutRequest(const std::string& id, bool durable) const {
    v1::PutBlocksRequest req;
    req.set_profile_id(profile_id_);
    req.set_durable(durable);
    v1::BlockPut* b = req.add_blocks();
    b->set_block_id(id);
    b->set_data(Bytes(id[0]));
    return req;
  }
  // A durable put on a connection of its own, stuck in the held sync.
  std::future<absl::StatusOr<v1::PutBlocksResponse>> HeldDurablePut(const std::string& id) {
    env_->HoldNextIo(FileOp::kSync);
    auto future = std::async(std::launch::async, [this, id, client = Connect()] {
      return client->PutBlocks({PutRequest(id, /*durable=*/true)});
    });
    env_->WaitForHeldIo();
    return future;
  }
  // Waits until `n` calls wait in the daemon's I/O queue (10 s at most).
  bool WaitForQueued(uint64_t n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (server_->runtime()->blocking_pool()->stats().queued < n) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::yield();
    }
    return true;
  }

  ::kvtier::testing::ScopedTempDir tmp_{"bio"};
  const std::string dir_ = tmp_.path();
  std::unique_ptr<FaultInjectionEnv> env_;
  std::unique_ptr<daemon::Server> server_;
  std::unique_ptr<Client> client_;
  uint64_t profile_id_ = 0;
};

TEST_F(BlockingIoTest, DaemonAnswersWhileADurablePutWaitsOnTheDisk) {
  Start("2", "64");
  ASSERT_OK(client_->PutBlocks({PutRequest("a-resident", false)}));
  auto held = HeldDurablePut("d-durable");

  // The disk is stuck: everything that does not need it is still answered.
  v1::LookupRequest lookup;
  lookup.set_profile_id(profile_id_);
  lookup.add_block_ids("a-resident");
  auto found = client_->Lookup(lookup);
  ASSERT_OK(found);
  EXPECT_TRUE(found->entries(0).present());
  auto put = client_->PutBlocks({PutRequest("b-memory", false)});
  ASSERT_OK(put);
  EXPECT_EQ(put->results(0).status().code(), 0) << put->results(0).status().message();
  v1::GetBlocksRequest get;
  get.set_profile_id(profile_id_);
  get.add_block_ids("a-resident");
  auto got = client_->GetBlocks(get);
  ASSERT_OK(got);
  EXPECT_EQ((*got)[0].data(), Bytes('a'));
  ASSERT_OK(client_->Stats());
  EXPECT_EQ(held.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "the durable put returned before its sync did";

  env_->ReleaseHeldIo();
  auto durable = held.get();
  ASSERT_OK(durable);
  EXPECT_EQ(durable->results(0).status().code(), 0) << durable->results(0).status().message();
  EXPECT_TRUE(durable->results(0).durable());
}

TEST_F(BlockingIoTest, FullQueueIsRefusedAndQueuedCallsComplete) {
  Start("1", "1");
  auto held = HeldDurablePut("d-durable");  // holds the only I/O thread
  // Queued behind it: the one place in the queue.
  auto queued = std::async(std::launch::async, [this, client = Connect()] {
    return client->PutBlocks({PutRequest("q-queued", false)});
  });
  ASSERT_TRUE(WaitForQueued(1));

  v1::DeleteBlocksRequest del;
  del.set_profile_id(profile_id_);
  del.add_block_ids("q-queued");
  auto refused = client_->DeleteBlocks(del);
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted)) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("server.io_queue_limit"));
  auto refused_put = client_->PutBlocks({PutRequest("r-refused", false)});
  EXPECT_THAT(refused_put, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(server_->runtime()->blocking_pool()->stats().rejected, 2u);

  env_->ReleaseHeldIo();
  auto durable = held.get();
  ASSERT_OK(durable);
  EXPECT_TRUE(durable->results(0).durable());
  auto put = queued.get();
  ASSERT_OK(put);
  EXPECT_EQ(put->results(0).status().code(), 0);
  // Nothing of the refused put was stored; the queue is free again.
  v1::LookupRequest lookup;
  lookup.set_profile_id(profile_id_);
  lookup.add_block_ids("r-refused");
  lookup.add_block_ids("q-queued");
  auto found = client_->Lookup(lookup);
  ASSERT_OK(found);
  EXPECT_FALSE(found->entries(0).present());
  EXPECT_TRUE(found->entries(1).present());
  EXPECT_OK(client_->DeleteBlocks(del));
}

TEST_F(BlockingIoTest, InlineModeStillServes) {
  Start("0", "1");  // io_threads = 0: the work runs on gRPC's threads
  auto put = client_->PutBlocks({PutRequest("i-inline", true)});
  ASSERT_OK(put);
  EXPECT_TRUE(put->results(0).durable());
  v1::GetBlocksRequest get;
  get.set_profile_id(profile_id_);
  get.add_block_ids("i-inline");
  auto got = client_->GetBlocks(get);
  ASSERT_OK(got);
  EXPECT_EQ((*got)[0].data(), Bytes('i'));
  EXPECT_EQ(server_->runtime()->blocking_pool()->stats().threads, 0u);
}

// A Select waiting (wait_ms) for a block the prefetcher reads from NVMe
// holds no lock of its context: an append to the same context is answered
// while the read is stuck, and the Select then answers the block RESIDENT.
TEST_F(BlockingIoTest, SelectWaitingForNvmeDoesNotHoldItsContext) {
  Start("2", "64");
  ASSERT_OK(client_->PutBlocks({PutRequest("n-nvme", /*durable=*/true)}));
  // Memory puts push the durable block's host copy out (LRU victim); its
  // NVMe copy stays.
  v1::LookupRequest lookup;
  lookup.set_profile_id(profile_id_);
  lookup.add_block_ids("n-nvme");
  for (int i = 0; i < 256; ++i) {
    auto where = client_->Lookup(lookup);
    ASSERT_OK(where);
    ASSERT_TRUE(where->entries(0).present());
    if (where->entries(0).tier() == v1::TIER_NVME) break;
    ASSERT_OK(client_->PutBlocks({PutRequest("m" + std::to_string(i), false)}));
  }
  auto where = client_->Lookup(lookup);
  ASSERT_OK(where);
  ASSERT_EQ(where->entries(0).tier(), v1::TIER_NVME) << "the host copy was never evicted";
  std::vector<std::string> ids = {"n-nvme"};
  for (int i = 0; i < 4; ++i) {
    ids.push_back("r" + std::to_string(i));
    ASSERT_OK(client_->PutBlocks({PutRequest(ids.back(), false)}));
  }
  ASSERT_OK(client_->PutBlocks({PutRequest("s-appended", false)}));
  v1::OpenContextRequest open;
  open.set_profile_id(profile_id_);
  for (const auto& id : ids) open.add_segments()->add_block_ids(id);
  v1::OpenContextResponse opened;
  {
    grpc::ClientContext call;
    grpc::Status st = client_->kvtier_stub()->OpenContext(&call, open, &opened);
    ASSERT_OK(st) << st.error_message();
  }

  env_->HoldNextIo(FileOp::kRead);  // the prefetcher's read of n-nvme
  auto selected = std::async(std::launch::async, [&, client = Connect()] {
    v1::SelectRequest req;
    v1::ContextSelect* e = req.add_contexts();
    e->set_context_id(opened.context_id());
    e->set_max_blocks(static_cast<uint32_t>(ids.size()));
    e->set_wait_ms(10000);
    for (int d = 0; d < 32; ++d) e->add_anchor(1.0f);
    grpc::ClientContext call;
    auto stream = client->kvtier_stub()->Select(&call);
    v1::SelectResponse resp;
    const bool ok = stream->Write(req) && stream->Read(&resp);
    stream->WritesDone();
    const grpc::Status st = stream->Finish();
    EXPECT_TRUE(ok);
    EXPECT_OK(st);
    return resp;
  });
  env_->WaitForHeldIo();

  auto appended = std::async(std::launch::async, [&] {
    v1::AppendBlocksRequest req;
    req.set_context_id(opened.context_id());
    req.add_block_ids("s-appended");
    v1::AppendBlocksResponse resp;
    grpc::ClientContext call;
    const grpc::Status st = client_->kvtier_stub()->AppendBlocks(&call, req, &resp);
    EXPECT_OK(st) << st.error_message();
    return resp.num_blocks();
  });
  const bool answered = appended.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  EXPECT_EQ(selected.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "the Select returned before the NVMe read did";
  env_->ReleaseHeldIo();
  EXPECT_TRUE(answered) << "the append waited for the Select's NVMe read";
  EXPECT_EQ(appended.get(), ids.size() + 1);
  v1::SelectResponse resp = selected.get();
  ASSERT_EQ(resp.contexts_size(), 1);
  ASSERT_EQ(resp.contexts(0).status().code(), 0) << resp.contexts(0).status().message();
  bool found = false;
  for (const auto& b : resp.contexts(0).blocks()) {
    if (b.block_id() != "n-nvme") continue;
    found = true;
    EXPECT_EQ(b.residency(), v1::RESIDENCY_RESIDENT) << "wait_ms did not wait for the prefetch";
  }
  EXPECT_TRUE(found) << "the NVMe block was not selected";
}

// Drain and Verify run on a thread each, so at most
// limits.max_admin_operations run at once: past it a new one is refused
// naming the key, and the slot comes back when the running one ends.
TEST_F(BlockingIoTest, AdminOperationsPastTheLimitAreRefusedNamingTheKey) {
  Start("4", "64", {"limits.max_admin_operations=1"});
  ASSERT_OK(client_->PutBlocks({PutRequest("v", /*durable=*/true)}));
  env_->HoldNextIo(FileOp::kRead);  // Verify's read of the block on NVMe
  auto first = std::async(std::launch::async,
                          [client = Connect()] { return client->Verify(v1::VerifyRequest()); });
  env_->WaitForHeldIo();
  EXPECT_THAT(client_->Verify(v1::VerifyRequest()),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       ::testing::HasSubstr("limits.max_admin_operations")));
  EXPECT_THAT(client_->Drain(v1::DrainRequest()),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       ::testing::HasSubstr("limits.max_admin_operations")));
  env_->ReleaseHeldIo();
  absl::StatusOr<v1::VerifyProgress> done = first.get();
  ASSERT_OK(done);
  EXPECT_EQ(done->corrupt_blocks(), 0u);
  EXPECT_GE(done->blocks_checked(), 1u);
  EXPECT_OK(client_->Verify(v1::VerifyRequest()));
}

}  // namespace
}  // namespace kvtier
