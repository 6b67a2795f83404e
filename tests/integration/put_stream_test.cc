// PutBlocks as raw bytes on the wire: the daemon reports how many messages
// of the stream it took (PutBlocksResponse.messages_received), and a
// message it cannot parse fails the call with INVALID_ARGUMENT naming it.
// Real daemon in-process, real gRPC over a Unix socket, a generic stub to
// send bytes the generated stubs never would.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "client/client.h"
#include "daemon/config.h"
#include "daemon/server.h"
#include "gtest/gtest.h"
#include "proto/wire/wire.h"
#include "tests/integration/test_daemon.h"
#include "tests/integration/tiny_profile.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

namespace kvtier {
namespace {

constexpr uint64_t kBlockBytes = testing::kTinyBlockBytes;

struct RawReply {
  grpc::Status status;
  std::vector<std::string> messages;
};

// Streams `messages` as they are, half-closes and collects the replies.
RawReply RawStream(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                   const std::vector<std::string>& messages) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto call = stub.PrepareCall(&ctx, method, &cq);
  void* tag = nullptr;
  bool ok = false;
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  for (size_t i = 0; ok && i < messages.size(); ++i) {
    grpc::Slice slice(messages[i]);
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
  }
  if (ok) {
    call->WritesDone(reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
  }
  RawReply reply;
  while (ok) {
    grpc::ByteBuffer buffer;
    call->Read(&buffer, reinterpret_cast<void*>(4));
    cq.Next(&tag, &ok);
    if (!ok) break;
    std::vector<grpc::Slice> slices;
    (void)buffer.Dump(&slices);
    std::string bytes;
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    reply.messages.push_back(std::move(bytes));
  }
  call->Finish(&reply.status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return reply;
}

class PutStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = testing::StartTestDaemon(
        dir_, {"tiers.device.capacity_bytes=256KiB", "tiers.host.capacity_bytes=512KiB",
               "tiers.nvme.file_size_bytes=4MiB"});
    ASSERT_OK(daemon);
    server_ = std::move(daemon->server);
    client_ = std::move(daemon->client);
    auto registered = client_->RegisterProfile(testing::TinyProfile());
    ASSERT_OK(registered);
    ASSERT_EQ(registered->block_size_bytes(), kBlockBytes);
    profile_id_ = registered->profile_id();
    channel_ =
        grpc::CreateChannel("unix:" + server_->socket_path(), grpc::InsecureChannelCredentials());
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
  }

  std::string PutMessage(const std::string& id) const {
    v1::PutBlocksRequest req;
    req.set_profile_id(profile_id_);
    v1::BlockPut* b = req.add_blocks();
    b->set_block_id(id);
    b->set_data(std::string(kBlockBytes, id[0]));
    return req.SerializeAsString();
  }
  // With every core saturated, about 4% of streams whose message gRPC
  // failed to parse never got their status: the client's Finish waited out
  // its deadline (gRPC 1.51 from Debian 12, docs/RELIABILITY.md). Since the
  // daemon parses PutBlocks itself this was not seen in 400 runs; a run
  // that still times out is retried, at most 3 times; any other outcome
  // counts.
  v1::PutBlocksResponse Put(const std::vector<std::string>& messages, grpc::Status* status) {
    RawReply reply;
    for (int attempt = 0; attempt < 3; ++attempt) {
      reply = RawStream(channel_, "/kvtier.v1.KvTier/PutBlocks", messages);
      if (reply.status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) break;
    }
    *status = reply.status;
    v1::PutBlocksResponse response;
    if (reply.messages.size() == 1) EXPECT_TRUE(response.ParseFromString(reply.messages[0]));
    return response;
  }
  bool Present(const std::string& id) {
    v1::LookupRequest lookup;
    lookup.set_profile_id(profile_id_);
    lookup.add_block_ids(id);
    auto found = client_->Lookup(lookup);
    EXPECT_OK(found);
    return found.ok() && found->entries(0).present();
  }

  ::kvtier::testing::ScopedTempDir tmp_{"pst"};
  const std::string dir_ = tmp_.path();
  std::unique_ptr<daemon::Server> server_;
  std::unique_ptr<Client> client_;
  std::shared_ptr<grpc::Channel> channel_;
  uint64_t profile_id_ = 0;
};

// Not a valid PutBlocksRequest encoding: field 1 (profile_id, varint)
// announced with a truncated varint.
const std::string kGarbage("\x08\xff\xff\xff", 4);

TEST_F(PutStreamTest, CountsEveryMessageOfACompleteStream) {
  grpc::Status status;
  v1::PutBlocksResponse r = Put({PutMessage("a1"), PutMessage("b1"), PutMessage("c1")}, &status);
  ASSERT_OK(status) << status.error_message();
  EXPECT_EQ(r.messages_received(), 3u);
  EXPECT_EQ(r.blocks_stored(), 3u);
  EXPECT_EQ(r.results_size(), 3);
  EXPECT_TRUE(Present("c1"));
}

TEST_F(PutStreamTest, UnparseableMessageFailsTheCallNamingIt) {
  grpc::Status status;
  Put({PutMessage("a2"), kGarbage, PutMessage("c2")}, &status);
  // The daemon parses each message itself: the call fails at the bad
  // message, naming it, the field and the byte; what came before it was
  // stored, nothing after it.
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("message 2 of the stream"), std::string::npos)
      << status.error_message();
  EXPECT_NE(status.error_message().find("truncated varint"), std::string::npos)
      << status.error_message();
  EXPECT_TRUE(Present("a2"));
  EXPECT_FALSE(Present("c2")) << "a message after the bad one was stored";
}

TEST_F(PutStreamTest, GarbageFirstMessageStoresNothing) {
  grpc::Status status;
  Put({kGarbage, PutMessage("b3")}, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("message 1 of the stream"), std::string::npos)
      << status.error_message();
  EXPECT_FALSE(Present("b3"));
}

// A known field with the wrong wire type is refused by name, not skipped.
TEST_F(PutStreamTest, DataOfTheWrongWireTypeIsNamed) {
  std::string block;
  wire::AppendBytesField(1, "z", &block);  // block_id
  wire::AppendVarintField(2, 5, &block);   // data, as a varint
  std::string message;
  wire::AppendVarintField(1, profile_id_, &message);
  wire::AppendBytesField(2, block, &message);
  grpc::Status status;
  Put({message}, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("blocks[0].data: wire type 0"), std::string::npos)
      << status.error_message();
  EXPECT_FALSE(Present("z"));
}

}  // namespace
}  // namespace kvtier
