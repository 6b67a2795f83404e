// Connects a Unix stream socket to `path` for tests that open raw
// connections (floods, accept loops).
//
// Thread safety: thread-safe (no shared state).
#ifndef KVTIER_TESTS_TESTUTIL_UNIX_CONNECT_H_
#define KVTIER_TESTS_TESTUTIL_UNIX_CONNECT_H_

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>

namespace kvtier::testing {

// The connected descriptor (blocking, close-on-exec), or -1.
inline int ConnectUnix(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTUTIL_UNIX_CONNECT_H_
