// The metrics registry's text format and the HTTP endpoint over a real
// loopback socket.
#include <string>
#include <thread>
#include <vector>

#include "daemon/metrics/http_listener.h"
#include "daemon/metrics/registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testutil/http_get.h"
#include "tests/testutil/status_matchers.h"

using ::kvtier::testing::StatusIs;

namespace kvtier::daemon::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(RegistryTest, RendersCountersHistogramsAndCollectedSeriesInTheTextFormat) {
  Registry r;
  CounterFamily* rpcs = r.AddCounter("kvtier_rpc_total", "RPCs\nfinished", {"method", "code"});
  ASSERT_NE(rpcs, nullptr);
  rpcs->With({"Select", "OK"})->Add(2);
  rpcs->With({"Select", "OK"})->Add(1);
  rpcs->With({"Put \"x\"\\y", "NOT_FOUND"})->Add(1);
  HistogramFamily* h = r.AddHistogram("kvtier_t_seconds", "time", {"phase"}, {0.1, 1});
  ASSERT_NE(h, nullptr);
  Histogram* pin = h->With({"pin"});
  pin->Observe(0.05);
  pin->Observe(0.1);  // on the bound: counted in le="0.1"
  pin->Observe(0.5);
  pin->Observe(7);
  r.AddCollector([](Writer& w) {
    w.Gauge("kvtier_tier_used_bytes", "used", {{"tier", "host"}}, 4096);
    w.Gauge("kvtier_tier_used_bytes", "used", {{"tier", "nvme"}}, 0.5);
    w.Counter("kvtier_rpc_total", "a collected series never shadows a registered one", {}, 9);
  });
  const std::string text = r.Render();
  EXPECT_THAT(text, HasSubstr("# HELP kvtier_rpc_total RPCs\\nfinished\n"
                              "# TYPE kvtier_rpc_total counter\n"));
  EXPECT_THAT(text, HasSubstr("kvtier_rpc_total{method=\"Select\",code=\"OK\"} 3\n"));
  EXPECT_THAT(text,
              HasSubstr("kvtier_rpc_total{method=\"Put \\\"x\\\"\\\\y\",code=\"NOT_FOUND\"} 1\n"));
  EXPECT_THAT(text, Not(HasSubstr("kvtier_rpc_total 9")));
  EXPECT_THAT(text, HasSubstr("# TYPE kvtier_t_seconds histogram\n"
                              "kvtier_t_seconds_bucket{phase=\"pin\",le=\"0.1\"} 2\n"
                              "kvtier_t_seconds_bucket{phase=\"pin\",le=\"1\"} 3\n"
                              "kvtier_t_seconds_bucket{phase=\"pin\",le=\"+Inf\"} 4\n"
                              "kvtier_t_seconds_sum{phase=\"pin\"} 7.65\n"
                              "kvtier_t_seconds_count{phase=\"pin\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE kvtier_tier_used_bytes gauge\n"
                              "kvtier_tier_used_bytes{tier=\"host\"} 4096\n"
                              "kvtier_tier_used_bytes{tier=\"nvme\"} 0.5\n"));
  // Families in name order.
  EXPECT_LT(text.find("kvtier_rpc_total"), text.find("kvtier_t_seconds"));
  EXPECT_LT(text.find("kvtier_t_seconds"), text.find("kvtier_tier_used_bytes"));
}

TEST(RegistryTest, BadNamesAndRepeatsAreRefused) {
  Registry r;
  EXPECT_EQ(r.AddCounter("1bad", "", {}), nullptr);
  EXPECT_EQ(r.AddCounter("bad-name", "", {}), nullptr);
  EXPECT_EQ(r.AddCounter("ok_total", "", {"le"}), nullptr);  // reserved for buckets
  EXPECT_EQ(r.AddCounter("ok_total", "", {"a", "a"}), nullptr);
  EXPECT_EQ(r.AddCounter("ok_total", "", {"__reserved"}), nullptr);
  ASSERT_NE(r.AddCounter("ok_total", "", {"a"}), nullptr);
  EXPECT_EQ(r.AddCounter("ok_total", "", {"a"}), nullptr);
  EXPECT_EQ(r.AddHistogram("ok_total", "", {}, {1}), nullptr);
  EXPECT_EQ(r.AddHistogram("h", "", {}, {2, 1}), nullptr);
  EXPECT_EQ(r.AddHistogram("h", "", {}, {}), nullptr);
  // Wrong number of label values: no child.
  EXPECT_EQ(r.AddCounter("two_total", "", {"a", "b"})->With({"x"}), nullptr);
}

TEST(RegistryTest, ConcurrentUpdatesAreAllCounted) {
  Registry r;
  CounterFamily* c = r.AddCounter("c_total", "", {"t"});
  HistogramFamily* h = r.AddHistogram("h_seconds", "", {}, LatencyBuckets());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c->With({"x"})->Add(1);
        h->With({})->Observe(1e-4);
      }
    });
  }
  std::thread scraper([&] {
    for (int i = 0; i < 20; ++i) EXPECT_THAT(r.Render(), HasSubstr("# TYPE c_total counter"));
  });
  for (auto& t : threads) t.join();
  scraper.join();
  EXPECT_EQ(c->With({"x"})->value(), 40000);
  EXPECT_THAT(r.Render(), HasSubstr("h_seconds_count 40000\n"));
}

TEST(HttpListenerTest, ServesMetricsAndRefusesEverythingElse) {
  int renders = 0;
  auto listener = HttpListener::Start("127.0.0.1:0", [&] {
    ++renders;
    return std::string("kvtier_up 1\n");
  });
  ASSERT_OK(listener) << listener.status();
  const int port = (*listener)->port();
  ASSERT_GT(port, 0);

  testing::HttpResponse ok = testing::HttpGet(port, "/metrics");
  EXPECT_EQ(ok.status, 200);
  EXPECT_THAT(ok.head, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(ok.head, HasSubstr("Content-Length: 12"));
  EXPECT_EQ(ok.body, "kvtier_up 1\n");
  EXPECT_EQ(testing::HttpGet(port, "/metrics?x=1").status, 200);
  EXPECT_EQ(testing::HttpGet(port, "/").status, 200);
  EXPECT_EQ(testing::HttpGet(port, "/other").status, 404);
  EXPECT_EQ(testing::HttpRaw(port, "POST /metrics HTTP/1.1\r\n\r\n").status, 405);
  EXPECT_EQ(testing::HttpRaw(port, "nonsense\r\n\r\n").status, 400);
  const std::string huge = "GET /metrics HTTP/1.1\r\nX: " + std::string(kMaxRequestBytes, 'a');
  EXPECT_EQ(testing::HttpRaw(port, huge + "\r\n\r\n").status, 431);
  // Still serving after all that.
  EXPECT_EQ(testing::HttpGet(port, "/metrics").status, 200);
  EXPECT_EQ(renders, 3);
  listener->reset();  // stops and joins
  EXPECT_EQ(testing::HttpGet(port, "/metrics").status, 0);
}

TEST(HttpListenerTest, BadAddressesNameTheSetting) {
  for (const char* bad : {"", "nonsense", "127.0.0.1:99999", "999.1.1.1:80", "host:80"}) {
    auto listener = HttpListener::Start(bad, [] { return std::string(); });
    ASSERT_FALSE(listener.ok()) << bad;
    EXPECT_THAT(listener.status(), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
    EXPECT_THAT(listener.status().message(), HasSubstr("metrics.listen_address")) << bad;
  }
  // A port in use is refused with the bind error, naming the setting.
  auto first = HttpListener::Start("127.0.0.1:0", [] { return std::string(); });
  ASSERT_OK(first);
  auto second = HttpListener::Start("127.0.0.1:" + std::to_string((*first)->port()),
                                    [] { return std::string(); });
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("metrics.listen_address"));
}

}  // namespace
}  // namespace kvtier::daemon::metrics
