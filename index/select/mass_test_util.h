// Shared fixtures of the mass scorer's tests (mass_tree_test.cc,
// copy_tracking_test.cc): one retrieval head (layer 1, q head 2) on KV head
// 1 of layer 1, pages of 16 tokens of 64-dim keys, and summaries built from
// a page's keys.
//
// Thread safety: pure functions.
#ifndef KVTIER_INDEX_SELECT_MASS_TEST_UTIL_H_
#define KVTIER_INDEX_SELECT_MASS_TEST_UTIL_H_

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "index/context_index.h"
#include "index/select/calibration.h"
#include "index/summary/summary.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::index::mass_test {

inline constexpr int32_t kD = 64, kT = 16, kLayers = 2, kKv = 2;

// The retrieval head and a prior that falls with distance, flat past 8
// blocks; no gate, no head weights.
inline SelectionCalibration BaseCalibration() {
  SelectionCalibration c;
  c.num_q_heads = 4;
  c.retrieval_heads = {{1, 2}};
  for (int d = 0; d < 9; ++d) {
    c.prior.push_back(d < 8 ? 1.0f / (d + 1) : 0.05f);
    c.prior_all.push_back(d < 8 ? 1.2f / (d + 1) : 0.06f);
  }
  return c;
}

// An empty context of this shape with calibration `c` (null on failure,
// which the test sees as a failed expectation).
inline std::unique_ptr<ContextIndex> NewContext(const SelectionCalibration& c) {
  ContextIndexOptions o;
  o.tree.dim = kD;
  o.num_layers = kLayers;
  o.num_kv_heads = kKv;
  o.block_size_tokens = kT;
  o.calibration = c;
  auto ctx = ContextIndex::Create(o);
  EXPECT_OK(ctx) << ctx.status();
  return ctx.ok() ? std::move(*ctx) : nullptr;
}

// A page's summary from its kT x kD keys: their mean and the retrieval
// head's keys in int8.
inline BlockSummary PageOfKeys(const std::vector<float>& keys) {
  BlockSummary s;
  s.dim = kD;
  s.mean.assign(kD, 0.0f);
  for (int t = 0; t < kT; ++t) {
    for (int d = 0; d < kD; ++d) s.mean[d] += keys[t * kD + d] / kT;
  }
  s.key_heads = KeyHeadsOf(BaseCalibration(), kKv);
  s.key_tokens = kT;
  s.head_keys.resize(kT * kD);
  s.key_scales.push_back(QuantizeInt8(keys.data(), keys.size(), s.head_keys.data()));
  return s;
}

}  // namespace kvtier::index::mass_test

#endif  // KVTIER_INDEX_SELECT_MASS_TEST_UTIL_H_
