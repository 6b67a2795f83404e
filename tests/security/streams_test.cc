// Findings 3, 4 and 8 of the tenant-abuse review: open streams per tenant
// are capped and cost no thread each; a client that stops reading holds a
// bounded number of bytes and is cancelled after a deadline; a reload
// that revokes a token ends that token's open streams.
#include <google/protobuf/descriptor.pb.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/health_service.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "gtest/gtest.h"
#include "kvtier/v1/kvtier.grpc.pb.h"
#include "tests/security/security_fixture.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::security {
namespace {

using ::testing::HasSubstr;
using SelectStream = grpc::ClientReaderWriter<v1::SelectRequest, v1::SelectResponse>;

int ThreadsOfThisProcess() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

// A raw stub on its own channel, so that the test controls flow control
// (small windows, no BDP growth: a client that does not read stalls the
// daemon's writes quickly).
class StreamsTest : public SecurityTest {
 protected:
  std::unique_ptr<v1::KvTier::Stub> Stub() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 10);
    args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 << 20);
    return v1::KvTier::NewStub(grpc::CreateCustomChannel("unix:" + server_->socket_path(),
                                                         grpc::InsecureChannelCredentials(), args));
  }

  std::unique_ptr<grpc::ClientContext> Ctx(const std::string& tenant) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata("authorization", "Bearer " + tokens_[tenant]);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return ctx;
  }

  // A Select stream that answered one (empty) request.
  struct OpenSelect {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<SelectStream> stream;
  };
  bool RoundTrip(SelectStream* s, uint64_t id) {
    v1::SelectRequest req;
    req.set_request_id(id);
    v1::SelectResponse resp;
    return s->Write(req) && s->Read(&resp) && resp.request_id() == id;
  }
  OpenSelect Select(v1::KvTier::Stub* stub, const std::string& tenant) {
    OpenSelect o;
    o.ctx = Ctx(tenant);
    o.stream = stub->Select(o.ctx.get());
    return o;
  }

  // Waits (polling, bounded) until `pred` holds; false on timeout.
  template <class Pred>
  static bool WaitFor(Pred pred, std::chrono::milliseconds within = std::chrono::seconds(20)) {
    const auto until = std::chrono::steady_clock::now() + within;
    while (!pred()) {
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
  }
};

TEST_F(StreamsTest, SelectStreamsPerTenantAreCappedAndCostNoThreadEach) {
  StartDaemon({"server.max_streams_per_tenant=64"});
  auto stub = Stub();
  OpenSelect warm = Select(stub.get(), "b");
  ASSERT_TRUE(RoundTrip(warm.stream.get(), 1));
  const int threads_before = ThreadsOfThisProcess();
  std::vector<OpenSelect> open;
  for (int i = 0; i < 64; ++i) {
    open.push_back(Select(stub.get(), "a"));
    ASSERT_TRUE(RoundTrip(open.back().stream.get(), i + 1)) << "stream " << i;
  }
  // 64 open streams (65 with b's) add no thread each.
  EXPECT_LE(ThreadsOfThisProcess() - threads_before, 8);
  EXPECT_EQ(server_->runtime()->streams()->OpenOf("a"), 64u);

  OpenSelect refused = Select(stub.get(), "a");
  EXPECT_FALSE(RoundTrip(refused.stream.get(), 100));
  grpc::Status st = refused.stream->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("server.max_streams_per_tenant"));

  // Another tenant is not affected.
  OpenSelect other = Select(stub.get(), "b");
  EXPECT_TRUE(RoundTrip(other.stream.get(), 7));

  // A stream that ends gives its place back.
  open.back().stream->WritesDone();
  EXPECT_OK(open.back().stream->Finish());
  open.pop_back();
  ASSERT_TRUE(WaitFor([&] { return server_->runtime()->streams()->OpenOf("a") == 63; }));
  OpenSelect again = Select(stub.get(), "a");
  EXPECT_TRUE(RoundTrip(again.stream.get(), 8));

  // Stopping with every stream open returns (the grace period, then the
  // calls are cancelled): nothing waits on a stream's thread.
  const auto t0 = std::chrono::steady_clock::now();
  server_.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  for (OpenSelect& o : open) EXPECT_FALSE(o.stream->Finish().ok());
}

// Finding 6 of issue 46: Health.Watch streams are authenticated, counted
// against the stream caps like every stream, and end at shutdown.
TEST_F(StreamsTest, HealthWatchStreamsAreCountedAndEndAtShutdown) {
  using grpc::health::v1::Health;
  using grpc::health::v1::HealthCheckRequest;
  using grpc::health::v1::HealthCheckResponse;
  StartDaemon({"server.max_streams_per_tenant=8"});
  auto stub = Health::NewStub(
      grpc::CreateChannel("unix:" + server_->socket_path(), grpc::InsecureChannelCredentials()));
  // No token: refused before any stream is opened.
  {
    grpc::ClientContext ctx;
    auto watch = stub->Watch(&ctx, HealthCheckRequest());
    HealthCheckResponse r;
    EXPECT_FALSE(watch->Read(&r));
    EXPECT_EQ(watch->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  struct OpenWatch {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> reader;
  };
  std::vector<OpenWatch> open;
  for (int i = 0; i < 8; ++i) {
    OpenWatch w{Ctx("a"), nullptr};
    w.reader = stub->Watch(w.ctx.get(), HealthCheckRequest());
    HealthCheckResponse r;
    ASSERT_TRUE(w.reader->Read(&r)) << i;
    EXPECT_EQ(r.status(), HealthCheckResponse::SERVING);
    open.push_back(std::move(w));
  }
  EXPECT_EQ(server_->health()->watchers(), 8u);
  EXPECT_EQ(server_->runtime()->streams()->OpenOf("a"), 8u);
  {
    auto ctx = Ctx("a");
    auto refused = stub->Watch(ctx.get(), HealthCheckRequest());
    HealthCheckResponse r;
    EXPECT_FALSE(refused->Read(&r));
    grpc::Status st = refused->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
    EXPECT_THAT(st.error_message(), HasSubstr("server.max_streams_per_tenant"));
  }
  // An unknown service is answered SERVICE_UNKNOWN (by tenant b: a's share is full).
  {
    auto ctx = Ctx("b");
    HealthCheckRequest unknown;
    unknown.set_service("no.such.Service");
    auto w = stub->Watch(ctx.get(), unknown);
    HealthCheckResponse r;
    ASSERT_TRUE(w->Read(&r));
    EXPECT_EQ(r.status(), HealthCheckResponse::SERVICE_UNKNOWN);
    ctx->TryCancel();
    (void)w->Finish();
  }
  // Shutdown tells every watcher NOT_SERVING and ends the streams within
  // the grace period, not at its end.
  std::thread stop([this] { server_->Shutdown(); });
  for (OpenWatch& w : open) {
    HealthCheckResponse r;
    ASSERT_TRUE(w.reader->Read(&r));
    EXPECT_EQ(r.status(), HealthCheckResponse::NOT_SERVING);
    EXPECT_FALSE(w.reader->Read(&r));
    EXPECT_EQ(w.reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  }
  stop.join();
}

// Finding 3 of issue 46: reflection (server.reflection) streams resolve
// their caller, count against the stream caps and cost no thread each; the
// answers describe the daemon's services.
TEST_F(StreamsTest, ReflectionIsAuthenticatedCountedAndAnswers) {
  using grpc::reflection::v1alpha::ServerReflection;
  using grpc::reflection::v1alpha::ServerReflectionRequest;
  using grpc::reflection::v1alpha::ServerReflectionResponse;
  using Info = grpc::ClientReaderWriter<ServerReflectionRequest, ServerReflectionResponse>;
  StartDaemon({"server.reflection=true", "server.max_streams_per_tenant=32"});
  auto stub = ServerReflection::NewStub(
      grpc::CreateChannel("unix:" + server_->socket_path(), grpc::InsecureChannelCredentials()));
  auto ask = [](Info* s, const ServerReflectionRequest& req, ServerReflectionResponse* resp) {
    return s->Write(req) && s->Read(resp);
  };
  ServerReflectionRequest list;
  list.set_list_services("*");
  ServerReflectionResponse resp;
  {
    grpc::ClientContext ctx;  // no token
    auto s = stub->ServerReflectionInfo(&ctx);
    EXPECT_FALSE(ask(s.get(), list, &resp));
    EXPECT_EQ(s->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  auto ctx = Ctx("a");
  auto s = stub->ServerReflectionInfo(ctx.get());
  ASSERT_TRUE(ask(s.get(), list, &resp));
  std::vector<std::string> names;
  for (const auto& service : resp.list_services_response().service()) {
    names.push_back(service.name());
  }
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("kvtier.v1.KvTier", "kvtier.v1.Admin",
                                                     "grpc.health.v1.Health",
                                                     "grpc.reflection.v1alpha.ServerReflection"));
  // A symbol's file comes with its imports, each sent once per stream.
  ServerReflectionRequest symbol;
  symbol.set_file_containing_symbol("kvtier.v1.KvTier.Select");
  ASSERT_TRUE(ask(s.get(), symbol, &resp));
  ASSERT_GE(resp.file_descriptor_response().file_descriptor_proto_size(), 2);
  google::protobuf::FileDescriptorProto file;
  ASSERT_TRUE(file.ParseFromString(resp.file_descriptor_response().file_descriptor_proto(0)));
  EXPECT_EQ(file.name(), "kvtier/v1/kvtier.proto");
  ASSERT_EQ(file.service_size(), 1);
  EXPECT_EQ(file.service(0).name(), "KvTier");
  ServerReflectionRequest types;
  types.set_file_by_filename("kvtier/v1/types.proto");
  ASSERT_TRUE(ask(s.get(), types, &resp));
  EXPECT_EQ(resp.file_descriptor_response().file_descriptor_proto_size(), 1);
  ServerReflectionRequest unknown;
  unknown.set_file_containing_symbol("kvtier.v1.NoSuchThing");
  ASSERT_TRUE(ask(s.get(), unknown, &resp));
  EXPECT_EQ(resp.error_response().error_code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(resp.error_response().error_message(), HasSubstr("kvtier.v1.NoSuchThing"));

  // 31 more streams of a: the cap holds, and they cost no thread each.
  const int threads_before = ThreadsOfThisProcess();
  struct Open {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<Info> stream;
  };
  std::vector<Open> open;
  for (int i = 0; i < 31; ++i) {
    Open o{Ctx("a"), nullptr};
    o.stream = stub->ServerReflectionInfo(o.ctx.get());
    ASSERT_TRUE(ask(o.stream.get(), list, &resp)) << "stream " << i;
    open.push_back(std::move(o));
  }
  EXPECT_LE(ThreadsOfThisProcess() - threads_before, 8);
  EXPECT_EQ(server_->runtime()->streams()->OpenOf("a"), 32u);
  auto over_ctx = Ctx("a");
  auto over = stub->ServerReflectionInfo(over_ctx.get());
  EXPECT_FALSE(ask(over.get(), list, &resp));
  grpc::Status st = over->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("server.max_streams_per_tenant"));
  // Another tenant is served; a closed stream gives its place back.
  auto b_ctx = Ctx("b");
  auto b = stub->ServerReflectionInfo(b_ctx.get());
  EXPECT_TRUE(ask(b.get(), list, &resp));
  s->WritesDone();
  EXPECT_OK(s->Finish());
  ASSERT_TRUE(WaitFor([&] { return server_->runtime()->streams()->OpenOf("a") == 31; }));
  for (Open& o : open) {
    o.stream->WritesDone();
    EXPECT_OK(o.stream->Finish());
  }
  b->WritesDone();
  EXPECT_OK(b->Finish());
}

TEST_F(StreamsTest, ARevokedTokenEndsItsOpenStreams) {
  StartDaemon();
  auto stub = Stub();
  auto a = As("a");
  const uint64_t profile = Register(a.get());
  OpenSelect sel = Select(stub.get(), "a");
  ASSERT_TRUE(RoundTrip(sel.stream.get(), 1));
  OpenSelect kept = Select(stub.get(), "b");
  ASSERT_TRUE(RoundTrip(kept.stream.get(), 1));

  auto put_ctx = Ctx("a");
  v1::PutBlocksResponse put_response;
  auto put = stub->PutBlocks(put_ctx.get(), &put_response);
  v1::PutBlocksRequest req;
  req.set_profile_id(profile);
  v1::BlockPut* b = req.add_blocks();
  b->set_block_id(BlockIdOf("before", 0));
  b->set_data(Payload(1));
  ASSERT_TRUE(put->Write(req));
  ASSERT_TRUE(WaitFor([&] { return server_->runtime()->streams()->OpenOf("a") == 2; }));

  tokens_["a"] = auth::NewToken();  // the old token is gone from the file
  WriteTenants();
  ASSERT_OK(server_->runtime()->ReloadTenants());

  v1::SelectResponse resp;
  EXPECT_FALSE(sel.stream->Read(&resp));
  grpc::Status st = sel.stream->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("revoked"));

  // The put stream is over: what is written after the reload is not stored.
  b->set_block_id(BlockIdOf("after", 0));
  put->Write(req);
  st = put->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  auto fresh = As("a");
  v1::LookupRequest lookup;
  lookup.set_profile_id(profile);
  lookup.add_block_ids(BlockIdOf("after", 0));
  auto found = fresh->Lookup(lookup);
  ASSERT_OK(found);
  ASSERT_EQ(found->entries_size(), 1);
  EXPECT_FALSE(found->entries(0).present()) << "a block sent after the revocation was stored";

  // The other tenant's stream goes on.
  EXPECT_TRUE(RoundTrip(kept.stream.get(), 2));
  EXPECT_EQ(server_->runtime()->streams()->stats().revoked, 2u);
}

TEST_F(StreamsTest, ReadersThatStopHoldBoundedBytesAndAreCancelled) {
  StartDaemon({"server.max_message_bytes=128KiB", "server.max_queued_bytes_per_tenant=256KiB",
               "server.max_queued_bytes=512KiB", "server.stream_write_timeout_ms=1500",
               "tiers.host.capacity_bytes=32MiB"});
  auto a = As("a");
  const uint64_t pa = Register(a.get());
  const std::vector<std::string> ids = Ids("slow", 256);  // 2 MiB
  for (size_t i = 0; i < ids.size(); i += 4) {
    std::vector<std::string> part(ids.begin() + i, ids.begin() + i + 4);
    ASSERT_EQ(Put(a.get(), pa, part, 1000 + i), std::vector<int>(4, 0));
  }
  auto stub = Stub();
  v1::GetBlocksRequest get;
  get.set_profile_id(pa);
  for (const auto& id : ids) get.add_block_ids(id);
  get.set_mode(v1::RETURN_MODE_BYTES);
  constexpr int kSlow = 16;
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::GetBlocksResponse>>> slow;
  for (int i = 0; i < kSlow; ++i) {
    ctxs.push_back(Ctx("a"));
    slow.push_back(stub->GetBlocks(ctxs.back().get(), get));
  }
  daemon::StreamTable* streams = server_->runtime()->streams();
  // The slow readers fill their windows, then wait on the tenant's bound.
  uint64_t peak = 0;
  ASSERT_TRUE(WaitFor([&] {
    const daemon::StreamStats s = streams->stats();
    peak = std::max(peak, s.queued_bytes);
    return s.waiting > 0;
  })) << "no stream ever waited for queued bytes";
  EXPECT_LE(peak, 256u << 10);

  // Meanwhile another tenant reads its blocks in full, byte for byte.
  auto b = As("b");
  const uint64_t pb = Register(b.get());
  const std::vector<std::string> bids = Ids("quick", 8);
  ASSERT_EQ(Put(b.get(), pb, bids, 7), std::vector<int>(8, 0));
  v1::GetBlocksRequest bget;
  bget.set_profile_id(pb);
  for (const auto& id : bids) bget.add_block_ids(id);
  auto got = b->GetBlocks(bget);
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ((*got)[i].data(), Payload(7 + i)) << i;
  EXPECT_GT(streams->stats().waiting, 0u) << "a's readers were released before b was served";

  // The stalled writes pass server.stream_write_timeout_ms: cancelled.
  ASSERT_TRUE(WaitFor([&] {
    peak = std::max(peak, streams->stats().queued_bytes);
    return streams->stats().stalled > 0;
  }));
  EXPECT_LE(peak, 256u << 10);
  // Each slow stream either was cancelled or, read now, delivers every
  // block intact (the ones still waiting go on once read).
  int cancelled = 0;
  for (int i = 0; i < kSlow; ++i) {
    v1::GetBlocksResponse r;
    size_t results = 0;
    bool intact = true;
    while (slow[i]->Read(&r)) {
      for (const v1::BlockResult& br : r.results()) {
        intact = intact && br.data() == Payload(1000 + results);
        ++results;
      }
    }
    grpc::Status st = slow[i]->Finish();
    if (st.ok()) {
      EXPECT_EQ(results, ids.size()) << "slow reader " << i;
      EXPECT_TRUE(intact) << "slow reader " << i;
    } else {
      EXPECT_EQ(st.error_code(), grpc::StatusCode::CANCELLED) << st.error_message();
      ++cancelled;
    }
  }
  EXPECT_GT(cancelled, 0);
  ASSERT_TRUE(WaitFor([&] { return streams->stats().open == 0; }));
  EXPECT_EQ(streams->stats().queued_bytes, 0u);
}

}  // namespace
}  // namespace kvtier::security
