#include "storage/common/random_id.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kvtier {

uint64_t RandomId() {
  for (;;) {
    uint64_t id = 0;
    const ssize_t n = ::getrandom(&id, sizeof(id), 0);
    if (n == static_cast<ssize_t>(sizeof(id))) {
      if (id != 0) return id;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    std::fprintf(stderr, "kvtier: getrandom failed: %s\n", n < 0 ? std::strerror(errno) : "short");
    std::abort();
  }
}

}  // namespace kvtier
