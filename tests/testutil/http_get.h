// A minimal blocking HTTP/1.1 client for tests: one request per connection
// to 127.0.0.1, the whole response read until the server closes.
//
// Thread safety: the functions are thread-safe (no shared state).
#ifndef KVTIER_TESTS_TESTUTIL_HTTP_GET_H_
#define KVTIER_TESTS_TESTUTIL_HTTP_GET_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>

namespace kvtier::testing {

struct HttpResponse {
  int status = 0;  // 0: no answer (connect or read failed)
  std::string head;
  std::string body;
};

// Sends `request` as is (it must end with an empty line) to 127.0.0.1:port.
inline HttpResponse HttpRaw(int port, const std::string& request, int timeout_s = 10) {
  HttpResponse r;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return r;
  timeval tv{timeout_s, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return r;
  }
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string all;
  char buf[4096];
  while (true) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    all.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  const size_t split = all.find("\r\n\r\n");
  if (all.rfind("HTTP/1.", 0) != 0 || split == std::string::npos) return r;
  r.status = std::stoi(all.substr(9, 3));
  r.head = all.substr(0, split);
  r.body = all.substr(split + 4);
  return r;
}

inline HttpResponse HttpGet(int port, const std::string& path) {
  return HttpRaw(port, "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTUTIL_HTTP_GET_H_
