// Connects a TCP socket to 127.0.0.1:port from a chosen loopback address,
// for tests that open raw connections (floods, accept loops): every
// address of 127.0.0.0/8 is another peer to a listener that counts per
// address.
//
// Thread safety: thread-safe (no shared state).
#ifndef KVTIER_TESTS_TESTUTIL_TCP_CONNECT_H_
#define KVTIER_TESTS_TESTUTIL_TCP_CONNECT_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>

namespace kvtier::testing {

// The connected descriptor (blocking, close-on-exec), or -1.
inline int ConnectTcpFrom(int port, const char* source = "127.0.0.1") {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in from{};
  from.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTUTIL_TCP_CONNECT_H_
