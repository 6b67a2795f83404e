// StreamTable's byte budgets between tenants: one tenant's waiting streams
// never hold up another's request that fits, and released bytes go to the
// waiting tenants in turn, not in one queue across tenants.
#include "daemon/streams.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::daemon {
namespace {

class NoStream final : public StreamTable::Stream {
 public:
  void Abort(const grpc::Status& /*status*/, bool /*wait_dropped*/) override {}
};

struct Waiter {
  std::unique_ptr<StreamTable::Ticket> ticket;
  bool granted = false;
};

class StreamBytesTest : public ::testing::Test {
 protected:
  void Init(uint64_t per_tenant, uint64_t total) {
    StreamLimits limits;
    limits.max_queued_bytes_per_tenant = per_tenant;
    limits.max_queued_bytes = total;
    table_ = std::make_unique<StreamTable>(limits);
  }
  std::unique_ptr<Waiter> Open(const std::string& tenant) {
    auto w = std::make_unique<Waiter>();
    auto t = table_->Open("GetBlocks", tenant, CallCredentials{}, &stream_);
    EXPECT_OK(t);
    w->ticket = std::move(*t);
    return w;
  }
  // True when granted at once; else w->granted turns true when granted.
  bool Acquire(Waiter* w, uint64_t bytes) {
    const bool now = w->ticket->AcquireBytes(bytes, [w] { w->granted = true; });
    if (now) w->granted = true;
    return now;
  }

  NoStream stream_;
  std::unique_ptr<StreamTable> table_;
};

TEST_F(StreamBytesTest, AnotherTenantsWaitingStreamsDoNotHoldUpARequestThatFits) {
  Init(/*per_tenant=*/100, /*total=*/1000);
  auto a1 = Open("a"), a2 = Open("a"), a3 = Open("a"), b = Open("b");
  ASSERT_TRUE(Acquire(a1.get(), 100));
  EXPECT_FALSE(Acquire(a2.get(), 50)) << "a is at its cap";
  EXPECT_FALSE(Acquire(a3.get(), 50));
  EXPECT_EQ(table_->stats().waiting, 2u);
  EXPECT_TRUE(Acquire(b.get(), 10)) << "b fits and has nothing waiting: granted at once";
  // a's own order holds: a3 never passes a2.
  a1->ticket->ReleaseBytes(100);
  EXPECT_TRUE(a2->granted);
  EXPECT_TRUE(a3->granted);
  EXPECT_EQ(table_->stats().waiting, 0u);
}

TEST_F(StreamBytesTest, ReleasedBytesGoToTheWaitingTenantsInTurn) {
  Init(/*per_tenant=*/100, /*total=*/100);
  auto c = Open("c");
  ASSERT_TRUE(Acquire(c.get(), 100));  // the daemon is full
  auto a1 = Open("a"), a2 = Open("a"), a3 = Open("a"), b1 = Open("b");
  for (auto* w : {a1.get(), a2.get(), a3.get()}) EXPECT_FALSE(Acquire(w, 40));
  EXPECT_FALSE(Acquire(b1.get(), 40)) << "queued after all of a's";
  c->ticket->ReleaseBytes(100);
  // One queue across tenants would grant a1 and a2 (80 of 100) and leave
  // b waiting; in turn, a1 then b1.
  EXPECT_TRUE(a1->granted);
  EXPECT_TRUE(b1->granted);
  EXPECT_FALSE(a2->granted);
  EXPECT_FALSE(a3->granted);
  a1->ticket->ReleaseBytes(40);
  EXPECT_TRUE(a2->granted);
  EXPECT_FALSE(a3->granted);
  // A stream that ends drops its wait.
  a3.reset();
  EXPECT_EQ(table_->stats().waiting, 0u);
}

}  // namespace
}  // namespace kvtier::daemon
