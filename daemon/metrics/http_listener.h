// HttpListener: the daemon's metrics endpoint, a minimal HTTP/1.1 server
// for Prometheus scrapes.
//
//   auto listener = HttpListener::Start("127.0.0.1:9464", [&] { return registry.Render(); });
//   ... listener->port() ...   // the bound port (useful with port 0)
//   listener.reset();          // stops: closes the socket, joins the thread
//
// One thread accepts and answers connections one at a time (a scrape every
// few seconds is the load it is built for): GET /metrics answers 200 with
// the text exposition format (Content-Type text/plain; version=0.0.4),
// GET / a one-line index, any other path 404, any other method 405. Each
// connection gets one response and is closed. Limits: a request head of at
// most kMaxRequestBytes (431 beyond it) read within kIoTimeoutMs (the
// connection is dropped after it), so a stuck client cannot hold the
// endpoint for longer than that.
//
// Address forms: "HOST:PORT" with an IPv4 host ("127.0.0.1:9464",
// "0.0.0.0:9464"), or ":PORT" / "PORT" for the loopback address.
//
// Thread safety: Start and the destructor from one thread; `render` runs
// on the listener's thread.
#ifndef KVTIER_DAEMON_METRICS_HTTP_LISTENER_H_
#define KVTIER_DAEMON_METRICS_HTTP_LISTENER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace kvtier::daemon::metrics {

inline constexpr size_t kMaxRequestBytes = 8192;
inline constexpr int kIoTimeoutMs = 2000;

class HttpListener {
 public:
  // INVALID_ARGUMENT naming metrics.listen_address for a malformed address;
  // the bind error (e.g. address in use) otherwise.
  static absl::StatusOr<std::unique_ptr<HttpListener>> Start(const std::string& address,
                                                             std::function<std::string()> render);
  ~HttpListener();

  int port() const { return port_; }
  const std::string& address() const { return address_; }
  uint64_t requests() const { return requests_.load(std::memory_order_relaxed); }

 private:
  HttpListener() = default;
  void Run();
  void Serve(int fd);

  int listen_fd_ = -1;
  int wake_fd_[2] = {-1, -1};  // a pipe: the destructor writes to stop Run
  int port_ = 0;
  std::string address_;
  std::function<std::string()> render_;
  std::atomic<uint64_t> requests_{0};
  std::thread thread_;
};

}  // namespace kvtier::daemon::metrics

#endif  // KVTIER_DAEMON_METRICS_HTTP_LISTENER_H_
