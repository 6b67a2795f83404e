// kvtier_tcp_relay_bench: what the daemon's TCP front (daemon/net/tcp_front.h)
// costs. The anchor is a bare gRPC echo with TLS on gRPC's own TCP
// listener; against it, the same echo with TLS on a Unix socket behind a
// TcpFront, as kvtierd serves TCP. Both in one run, same certificates,
// channel settings and messages: Select-shaped round trips on one stream,
// small (a response of 64 blocks) and large (1 MiB of payload bytes).
//
//   kvtier_tcp_relay_bench [--small N] [--large N] [--out FILE.md]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "daemon/net/tcp_front.h"
#include "echo.grpc.pb.h"
#include "echo_server.h"
#include "tests/testutil/tls_certs.h"

namespace kvtier::bench {
namespace {

using Clock = std::chrono::steady_clock;
using Stream = grpc::ClientReaderWriter<v1::SelectRequest, v1::SelectResponse>;

struct Figures {
  double p50_us = 0, p99_us = 0, mb_per_s = 0;
};

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

// Round trips of `rounds` requests on one stream; each response carries
// `payload` bytes.
Figures RoundTrips(Stream* s, int rounds, size_t payload) {
  std::vector<double> us;
  us.reserve(rounds);
  v1::SelectRequest req;
  v1::SelectResponse resp;
  const auto t0 = Clock::now();
  for (int i = 0; i < rounds; ++i) {
    req.set_request_id(static_cast<uint64_t>(i) + 1);
    const auto a = Clock::now();
    if (!s->Write(req) || !s->Read(&resp)) {
      std::fprintf(stderr, "tcp_relay_bench: the stream broke at round %d\n", i);
      std::exit(1);
    }
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return {Percentile(us, 0.5), Percentile(us, 0.99),
          static_cast<double>(payload) * rounds / seconds / 1e6};
}

v1::SelectResponse Response(size_t blocks, size_t bytes_per_handle_key) {
  v1::SelectResponse r;
  auto* c = r.add_contexts();
  for (size_t b = 0; b < blocks; ++b) {
    auto* h = c->add_blocks();
    h->set_position(static_cast<uint32_t>(b));
    h->set_block_id(std::string(bytes_per_handle_key, static_cast<char>('a' + b % 26)));
    h->mutable_handle()->set_offset_bytes(b * 8192);
    h->mutable_handle()->set_size_bytes(8192);
  }
  return r;
}

}  // namespace
}  // namespace kvtier::bench

static int Run(int argc, char** argv) {
  using namespace kvtier;  // NOLINT(google-build-using-namespace): a main
  int small = 4000, large = 200;
  std::string out;
  CLI::App app{"TLS round trips through the TCP front against gRPC's own TCP listener"};
  app.add_option("--small", small, "round trips with a 64-block response");
  app.add_option("--large", large, "round trips with a 1 MiB response");
  app.add_option("--out", out, "also write the table to this Markdown file");
  CLI11_PARSE(app, argc, argv);

  const testing::PemPair ca = testing::MakeCa("relay bench CA");
  const testing::PemPair cert = testing::IssueCert(ca, "localhost");
  grpc::SslServerCredentialsOptions tls;
  tls.pem_key_cert_pairs.push_back({cert.key, cert.cert});
  const auto server_creds = grpc::SslServerCredentials(tls);
  constexpr uint64_t kMaxMessage = uint64_t{64} << 20;

  int direct_port = 0, unused = 0;
  auto direct =
      bench::EchoServer::StartAt("127.0.0.1:0", server_creds, kMaxMessage, 1024, &direct_port);
  const std::string dir = "/tmp/kvtier-relay-bench-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  auto behind = bench::EchoServer::StartAt("unix:" + dir + "/tls.sock", server_creds, kMaxMessage,
                                           1024, &unused);
  auto listen = daemon::ListenTcp("bench", "127.0.0.1:0");
  if (!direct.ok() || !behind.ok() || !listen.ok()) {
    std::fprintf(stderr, "tcp_relay_bench: cannot start the servers\n");
    return 1;
  }
  const int relay_port = daemon::BoundPort(listen->get());
  daemon::TcpFrontOptions fo;
  fo.listen_fd = std::move(*listen);
  fo.upstream_path = dir + "/tls.sock";
  auto front = daemon::TcpFront::Start(std::move(fo));
  if (!front.ok()) {
    std::fprintf(stderr, "tcp_relay_bench: %s\n", front.status().ToString().c_str());
    return 1;
  }

  struct Row {
    const char* what;
    bench::Figures direct, relay;
  };
  std::vector<Row> rows;
  for (const auto& [what, rounds, response, payload] :
       {std::tuple{"64-block response", small, bench::Response(64, 16), size_t{64 * 40}},
        std::tuple{"1 MiB response", large, bench::Response(1024, 1024), size_t{1} << 20}}) {
    (*direct)->SetResponse(response);
    (*behind)->SetResponse(response);
    Row row{what, {}, {}};
    for (int relayed = 0; relayed < 2; ++relayed) {
      grpc::SslCredentialsOptions client;
      client.pem_root_certs = ca.cert;
      grpc::ChannelArguments args;
      args.SetSslTargetNameOverride("localhost");
      args.SetMaxReceiveMessageSize(static_cast<int>(kMaxMessage));
      const int port = relayed != 0 ? relay_port : direct_port;
      auto stub = bench::Echo::NewStub(grpc::CreateCustomChannel(
          "127.0.0.1:" + std::to_string(port), grpc::SslCredentials(client), args));
      grpc::ClientContext ctx;
      auto stream = stub->Select(&ctx);
      bench::RoundTrips(stream.get(), std::max(1, rounds / 10), payload);  // warm up
      (relayed != 0 ? row.relay : row.direct) = bench::RoundTrips(stream.get(), rounds, payload);
      stream->WritesDone();
      (void)stream->Finish();
    }
    rows.push_back(row);
  }
  std::string md =
      "| round trip (TLS, one stream) | direct p50 / p99 | through the TCP front p50 / p99 | "
      "p50 ratio | direct MB/s | relayed MB/s |\n|---|---:|---:|---:|---:|---:|\n";
  for (const Row& r : rows) {
    md += absl::StrFormat("| %s | %.0f / %.0f us | %.0f / %.0f us | %.2f | %.0f | %.0f |\n", r.what,
                          r.direct.p50_us, r.direct.p99_us, r.relay.p50_us, r.relay.p99_us,
                          r.relay.p50_us / r.direct.p50_us, r.direct.mb_per_s, r.relay.mb_per_s);
  }
  std::fputs(md.c_str(), stdout);
  if (!out.empty()) {
    if (FILE* f = std::fopen(out.c_str(), "w")) {
      std::fputs(md.c_str(), f);
      std::fclose(f);
    }
  }
  (*front)->Stop();
  std::filesystem::remove_all(dir);
  return 0;
}

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tcp_relay_bench: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "tcp_relay_bench: unknown exception\n");
  }
  return 1;
}
