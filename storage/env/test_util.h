// Helpers for tests that need real files: a scratch directory and a probe
// for O_DIRECT support. Test-only; not thread-safe.
#ifndef KVTIER_STORAGE_ENV_TEST_UTIL_H_
#define KVTIER_STORAGE_ENV_TEST_UTIL_H_

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include "storage/env/env.h"

namespace kvtier::testing {

// A fresh directory under $TEST_TMPDIR, else $TMPDIR, else /tmp; removed
// with its contents on destruction. Aborts if it cannot be created.
class ScopedTempDir {
 public:
  ScopedTempDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    if (base == nullptr || *base == '\0') base = std::getenv("TMPDIR");
    if (base == nullptr || *base == '\0') base = "/tmp";
    std::string pattern = std::string(base) + "/kvtier-test-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    path_ = pattern;
  }
  ~ScopedTempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// True when `dir`'s file system accepts O_DIRECT block files (probed with a
// small file that is removed again).
inline bool DirectIoSupported(Env* env, const std::string& dir) {
  const std::string probe = dir + "/.odirect-probe";
  BlockFileOptions options;
  options.size_bytes = kDirectIoAlignmentBytes;
  options.direct_io = true;
  const bool supported = env->OpenBlockFile(probe, options).ok();
  env->DeleteFile(probe).IgnoreError();
  return supported;
}

}  // namespace kvtier::testing

#endif  // KVTIER_STORAGE_ENV_TEST_UTIL_H_
