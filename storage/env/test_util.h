// Helpers for tests that need real files: the scratch directory
// (tests/testutil/temp_dir.h) and a probe for O_DIRECT support. Test-only;
// not thread-safe.
#ifndef KVTIER_STORAGE_ENV_TEST_UTIL_H_
#define KVTIER_STORAGE_ENV_TEST_UTIL_H_

#include <string>

#include "storage/env/env.h"
#include "tests/testutil/temp_dir.h"

namespace kvtier::testing {

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
