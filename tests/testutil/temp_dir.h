// Scratch directories for tests: the one way a test makes a temp dir.
// Header-only; an object is not thread-safe.
#ifndef KVTIER_TESTS_TESTUTIL_TEMP_DIR_H_
#define KVTIER_TESTS_TESTUTIL_TEMP_DIR_H_

#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

namespace kvtier::testing {

// A fresh directory "<base>/kvtier-<tag>-XXXXXX" made by mkdtemp (unique
// across tests and processes), removed with its contents on destruction
// unless Keep() was called. <base> is the one given (e.g. /dev/shm for an
// arena's files); by default $TEST_TMPDIR when set and at most 48
// characters, else /tmp, so that a Unix socket path inside the directory
// stays well under the 108-byte sun_path limit. Aborts if the directory
// cannot be made: a test cannot run without it.
class ScopedTempDir {
 public:
  explicit ScopedTempDir(std::string_view tag = "test", std::string_view base = {}) {
    std::string root(base);
    if (root.empty()) {
      const char* env = std::getenv("TEST_TMPDIR");
      root = env != nullptr && *env != '\0' && std::string_view(env).size() <= 48 ? env : "/tmp";
    }
    std::string pattern = root + "/kvtier-" + std::string(tag) + "-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) std::abort();
    path_ = pattern;
  }
  ~ScopedTempDir() {
    if (keep_) return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + name.
  std::string File(std::string_view name) const { return path_ + "/" + std::string(name); }
  // Leaves the directory in place at destruction (a failed test's logs).
  void Keep() { keep_ = true; }

 private:
  std::string path_;
  bool keep_ = false;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTUTIL_TEMP_DIR_H_
