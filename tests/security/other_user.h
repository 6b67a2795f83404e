// Acting as another local user in security tests. Header-only.
#ifndef KVTIER_TESTS_SECURITY_OTHER_USER_H_
#define KVTIER_TESTS_SECURITY_OTHER_USER_H_

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "gtest/gtest.h"

namespace kvtier::security {

// Expects that user and group 65534 (nobody) cannot open `path` for reading
// (EACCES), tried in a forked child that drops to them. The caller runs as
// root (tests GTEST_SKIP otherwise).
inline void ExpectNobodyCannotOpen(const std::string& path) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    const int fd = ::open(path.c_str(), O_RDONLY);
    ::_exit(fd < 0 && errno == EACCES ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "user 65534 could open " << path;
}

}  // namespace kvtier::security

#endif  // KVTIER_TESTS_SECURITY_OTHER_USER_H_
