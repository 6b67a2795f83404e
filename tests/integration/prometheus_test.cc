// /metrics scraped by a real Prometheus: kvtierd in-process with its
// metrics endpoint on a loopback port, Debian's prometheus started as a
// child process with a scrape config pointing at it, and the values read
// back through Prometheus's HTTP query API.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "bench/quality/json.h"
#include "client/client.h"
#include "daemon/config.h"
#include "daemon/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/subprocess.h"
#include "tests/integration/test_daemon.h"
#include "tests/integration/tiny_profile.h"
#include "tests/testutil/http_get.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

namespace kvtier {
namespace {

using ::testing::HasSubstr;

constexpr char kPrometheus[] = "/usr/bin/prometheus";

// A loopback port nobody listens on right now (bound, read, closed).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ADD_FAILURE() << "no loopback port: " << std::strerror(errno);
  }
  if (fd >= 0) ::close(fd);
  return ntohs(addr.sin_port);
}

// The value of the first sample of an instant-vector /api/v1/query answer
// ({"data":{"result":[{"value":[<time>,"<v>"]}]}}), or "" when it has none.
std::string QueryValue(const std::string& json) {
  auto answer = quality::ParseJson(json);
  if (!answer.ok()) return "";
  const quality::JsonValue* data = answer->Find("data");
  const quality::JsonValue* result = data != nullptr ? data->Find("result") : nullptr;
  if (result == nullptr || result->array.empty()) return "";
  const quality::JsonValue* value = result->array[0].Find("value");
  if (value == nullptr || value->array.size() != 2) return "";
  return value->array[1].string;
}

std::string UrlEncode(const std::string& s) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// The metric families a /metrics page declares ("# TYPE name type").
std::vector<std::string> Families(const std::string& page) {
  std::vector<std::string> names;
  size_t at = 0;
  while ((at = page.find("# TYPE ", at)) != std::string::npos) {
    at += 7;
    names.push_back(page.substr(at, page.find(' ', at) - at));
  }
  return names;
}

// Checks deploy/grafana/kvtier.json: its structure, that every metric its
// queries name is one the daemon exports (page = a /metrics scrape), and
// that Prometheus accepts every query.
void CheckDashboard(const std::string& page, int prom_port) {
  const std::string text = testing::ReadFile(KVTIER_SOURCE_DIR "/deploy/grafana/kvtier.json");
  auto json = quality::ParseJson(text);
  ASSERT_OK(json);
  ASSERT_NE(json->Find("title"), nullptr);
  ASSERT_NE(json->Find("uid"), nullptr);
  EXPECT_FALSE(json->Find("uid")->string.empty());
  const quality::JsonValue* panels = json->Find("panels");
  ASSERT_NE(panels, nullptr);
  ASSERT_GE(panels->array.size(), 8u);
  const std::vector<std::string> families = Families(page);
  std::set<int64_t> ids;
  int queries = 0;
  for (const quality::JsonValue& panel : panels->array) {
    const quality::JsonValue* title = panel.Find("title");
    ASSERT_NE(title, nullptr);
    SCOPED_TRACE(title->string);
    EXPECT_TRUE(ids.insert(panel.Find("id")->integer).second) << "duplicate panel id";
    const quality::JsonValue* grid = panel.Find("gridPos");
    ASSERT_NE(grid, nullptr);
    EXPECT_GT(grid->Find("w")->integer, 0);
    EXPECT_GT(grid->Find("h")->integer, 0);
    EXPECT_LE(grid->Find("x")->integer + grid->Find("w")->integer, 24);
    const quality::JsonValue* targets = panel.Find("targets");
    ASSERT_NE(targets, nullptr);
    ASSERT_FALSE(targets->array.empty());
    for (const quality::JsonValue& target : targets->array) {
      const std::string expr = target.Find("expr")->string;
      // Every kvtier_ name is an exported family (histograms by their base name).
      for (size_t at = expr.find("kvtier_"); at != std::string::npos;
           at = expr.find("kvtier_", at + 1)) {
        size_t end = at;
        while (end < expr.size() &&
               (std::isalnum(static_cast<unsigned char>(expr[end])) || expr[end] == '_')) {
          ++end;
        }
        std::string name = expr.substr(at, end - at);
        for (const char* suffix : {"_bucket", "_sum", "_count"}) {
          const std::string base = name.substr(0, name.size() - std::strlen(suffix));
          if (name.size() > std::strlen(suffix) && absl::EndsWith(name, suffix) &&
              std::find(families.begin(), families.end(), base) != families.end()) {
            name = base;
          }
        }
        // The remote tier's families exist only with tiers.remote on:
        // kvtier_remote_tier_test checks those against a daemon that has one.
        if (!absl::StartsWith(name, "kvtier_remote_")) {
          EXPECT_NE(std::find(families.begin(), families.end(), name), families.end())
              << name << " is not exported by kvtierd";
        }
        at = end;
      }
      // Prometheus parses and runs it (Grafana's variables filled in).
      const std::string q =
          absl::StrReplaceAll(expr, {{"$instance", ".*"}, {"$__rate_interval", "1m"}});
      const testing::HttpResponse r =
          testing::HttpGet(prom_port, "/api/v1/query?query=" + UrlEncode(q));
      EXPECT_EQ(r.status, 200) << q << "\n" << r.body;
      EXPECT_THAT(r.body, HasSubstr("\"status\":\"success\"")) << q;
      ++queries;
    }
  }
  EXPECT_GE(queries, 10);
}

TEST(PrometheusTest, ScrapesKvtierdAndReadsCountersBack) {
  if (!std::filesystem::exists(kPrometheus)) {
    GTEST_SKIP() << kPrometheus << " is not installed (deploy/install-deps.sh installs it)";
  }
  const testing::ScopedTempDir tmp("prom");
  const std::string& dir = tmp.path();
  std::filesystem::create_directories(dir + "/prom");
  auto daemon = testing::StartTestDaemon(
      dir + "/kvtier", {"metrics.listen_address=127.0.0.1:0", "tiers.device.capacity_bytes=256KiB",
                        "tiers.host.capacity_bytes=512KiB", "tiers.nvme.file_count=2",
                        "tiers.nvme.file_size_bytes=4MiB"});
  ASSERT_OK(daemon);
  auto& server = daemon->server;
  auto& client = daemon->client;
  const int metrics_port = server->metrics_port();
  ASSERT_GT(metrics_port, 0);

  // Some work for the counters: a profile, 5 blocks put, one bad request.
  auto profile = client->RegisterProfile(testing::TinyProfile());
  ASSERT_OK(profile);
  v1::PutBlocksRequest put;
  put.set_profile_id(profile->profile_id());
  std::mt19937_64 rng(7);
  for (int i = 0; i < 5; ++i) {
    v1::BlockPut* b = put.add_blocks();
    b->set_block_id(absl::StrCat("prom-block-", i));
    std::string bytes(testing::kTinyBlockBytes, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    b->set_data(bytes);
  }
  ASSERT_OK(client->PutBlocks({put}));
  v1::PutBlocksRequest bad;  // no profile_id: INVALID_ARGUMENT
  bad.add_blocks()->set_block_id("x");
  EXPECT_FALSE(client->PutBlocks({bad}).ok());

  // The endpoint itself answers before Prometheus is involved.
  const testing::HttpResponse direct = testing::HttpGet(metrics_port, "/metrics");
  ASSERT_EQ(direct.status, 200);
  EXPECT_THAT(direct.body, HasSubstr("kvtier_put_blocks_total 5\n"));
  for (const char* name :
       {"kvtier_summaries_deferred_total ", "kvtier_summaries_pending ",
        "kvtier_deferred_promotions_done_total ", "kvtier_select_promotions_deferred_total ",
        "kvtier_get_in_flight_bytes 0\n", "kvtier_get_copied_over_cap_total "}) {
    EXPECT_THAT(direct.body, HasSubstr(name));
  }
  EXPECT_THAT(direct.body,
              HasSubstr("kvtier_rpc_total{method=\"kvtier.v1.KvTier/PutBlocks\",code=\"OK\"} 1\n"));
  EXPECT_THAT(direct.body, HasSubstr("kvtier_rpc_total{method=\"kvtier.v1.KvTier/PutBlocks\","
                                     "code=\"INVALID_ARGUMENT\"} 1\n"));

  const int prom_port = FreePort();
  {
    std::ofstream yml(dir + "/prometheus.yml");
    yml << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        << "scrape_configs:\n  - job_name: kvtierd\n    static_configs:\n"
        << "      - targets: ['127.0.0.1:" << metrics_port << "']\n";
  }
  testing::ChildProcess prometheus({kPrometheus, "--config.file=" + dir + "/prometheus.yml",
                                    "--storage.tsdb.path=" + dir + "/prom",
                                    "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)},
                                   {}, dir + "/prometheus.log");

  // Polls Prometheus (an outside process: nothing to wait on but its API)
  // until it has scraped the daemon, within a bound.
  const std::string query = "/api/v1/query?query=kvtier_put_blocks_total%7Bjob%3D%22kvtierd%22%7D";
  std::string value, last;
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  while (absl::Now() < deadline) {
    const testing::HttpResponse r = testing::HttpGet(prom_port, query);
    last = r.body;
    value = QueryValue(r.body);
    if (!value.empty()) break;
    absl::SleepFor(absl::Milliseconds(250));
  }
  ASSERT_EQ(value, "5") << "last answer: " << last << "\nprometheus log:\n"
                        << testing::ReadFile(dir + "/prometheus.log");

  // Errors by RPC and code, and a gauge read at scrape time.
  const testing::HttpResponse errors = testing::HttpGet(
      prom_port,
      "/api/v1/query?query=kvtier_rpc_total%7Bmethod%3D%22kvtier.v1.KvTier%2FPutBlocks%22%2C"
      "code%3D%22INVALID_ARGUMENT%22%7D");
  EXPECT_EQ(QueryValue(errors.body), "1") << errors.body;
  const testing::HttpResponse blocks =
      testing::HttpGet(prom_port, "/api/v1/query?query=kvtier_blocks");
  EXPECT_EQ(QueryValue(blocks.body), "5") << blocks.body;
  const testing::HttpResponse up = testing::HttpGet(prom_port, "/api/v1/query?query=up");
  EXPECT_EQ(QueryValue(up.body), "1") << up.body;

  // The shipped Grafana dashboard queries what is exported, and Prometheus
  // accepts every one of its queries.
  CheckDashboard(testing::HttpGet(metrics_port, "/metrics").body, prom_port);

  prometheus.Signal(SIGTERM);
  EXPECT_TRUE(prometheus.Wait(std::chrono::seconds(30)).has_value());
  client.reset();
  server.reset();
}

}  // namespace
}  // namespace kvtier
