#include "daemon/metrics/http_listener.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kvtier::daemon::metrics {
namespace {

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

absl::Status BadAddress(const std::string& address, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("metrics.listen_address: \"", address, "\" ", why,
                   " (expected HOST:PORT with an IPv4 host, or :PORT for the loopback address)"));
}

// Writes all of data, each wait bounded by kIoTimeoutMs.
bool WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, kIoTimeoutMs) <= 0) return false;
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

void Respond(int fd, int code, absl::string_view reason, absl::string_view content_type,
             absl::string_view body) {
  const std::string head =
      absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", content_type,
                   "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n");
  if (WriteAll(fd, head)) WriteAll(fd, body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpListener>> HttpListener::Start(
    const std::string& address, std::function<std::string()> render) {
  std::string host = "127.0.0.1";
  std::string port_text = address;
  if (const size_t colon = address.rfind(':'); colon != std::string::npos) {
    if (colon > 0) host = address.substr(0, colon);
    port_text = address.substr(colon + 1);
  }
  uint32_t port = 0;
  if (!absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return BadAddress(address, "has no valid port");
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return BadAddress(address, "has no valid IPv4 host");
  }
  std::unique_ptr<HttpListener> l(new HttpListener());
  l->render_ = std::move(render);
  l->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l->listen_fd_ < 0) return Errno("metrics: socket");
  const int one = 1;
  ::setsockopt(l->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(l->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno(absl::StrCat("metrics.listen_address: binding ", address));
  }
  if (::listen(l->listen_fd_, 16) != 0) return Errno("metrics: listen");
  socklen_t len = sizeof(addr);
  if (::getsockname(l->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Errno("metrics: getsockname");
  }
  l->port_ = ntohs(addr.sin_port);
  l->address_ = absl::StrCat(host, ":", l->port_);
  if (::pipe2(l->wake_fd_, O_CLOEXEC) != 0) return Errno("metrics: pipe");
  l->thread_ = std::thread([raw = l.get()] {
    pthread_setname_np(pthread_self(), "kvtier-metrics");
    raw->Run();
  });
  return l;
}

HttpListener::~HttpListener() {
  if (thread_.joinable()) {
    const char stop = 1;
    while (::write(wake_fd_[1], &stop, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  for (int fd : {listen_fd_, wake_fd_[0], wake_fd_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

void HttpListener::Run() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    Serve(fd);
    ::close(fd);
  }
}

void HttpListener::Serve(int fd) {
  std::string request;
  while (request.find("\r\n\r\n") == std::string::npos) {
    if (request.size() >= kMaxRequestBytes) {
      Respond(fd, 431, "Request Header Fields Too Large", "text/plain", "request head too large\n");
      return;
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, kIoTimeoutMs) <= 0) return;  // too slow: dropped
    char buf[1024];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;
    request.append(buf, static_cast<size_t>(n));
  }
  requests_.fetch_add(1, std::memory_order_relaxed);
  const absl::string_view line = absl::string_view(request).substr(0, request.find("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == absl::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == absl::string_view::npos) {
    Respond(fd, 400, "Bad Request", "text/plain", "malformed request line\n");
    return;
  }
  const absl::string_view method = line.substr(0, sp1);
  absl::string_view path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  if (method != "GET") {
    Respond(fd, 405, "Method Not Allowed", "text/plain", "only GET\n");
    return;
  }
  if (path == "/metrics") {
    const std::string body = render_();
    Respond(fd, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", body);
  } else if (path == "/") {
    Respond(fd, 200, "OK", "text/plain", "kvtierd: metrics at /metrics\n");
  } else {
    Respond(fd, 404, "Not Found", "text/plain", "not found; metrics are at /metrics\n");
  }
}

}  // namespace kvtier::daemon::metrics
