// Helpers shared by the selector's tests: a context holding one segment of
// vectors, and a selector, failing the test on error.
#ifndef KVTIER_INDEX_SELECT_SELECTOR_TEST_UTIL_H_
#define KVTIER_INDEX_SELECT_SELECTOR_TEST_UTIL_H_

#include <memory>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "index/context_index.h"
#include "index/select/selector.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::index {

inline std::unique_ptr<ContextIndex> MakeTestContext(const std::vector<float>& vectors,
                                                     const TreeOptions& options) {
  auto ctx = ContextIndex::Create(options);
  EXPECT_OK(ctx) << ctx.status();
  if (!ctx.ok()) return nullptr;
  EXPECT_OK((*ctx)->tree().AddSegment(vectors));
  return std::move(*ctx);
}

inline std::unique_ptr<Selector> MakeTestSelector(const SelectorOptions& options) {
  auto s = Selector::Create(options);
  EXPECT_OK(s) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_SELECT_SELECTOR_TEST_UTIL_H_
