// Deterministic synthetic data for the index's tests and benchmarks.
//
// Contexts: block vectors v_b = common * c + topic * t_k(b) + noise * n_b,
// where c is a direction every key shares (real keys have a large mean
// component), t_k is the topic of a run of consecutive blocks (documents
// are locally coherent), and n_b is isotropic noise; c, t_k and n_b are
// random vectors of unit expected norm. The anchor is
// normalise(common * c + topic * a) for a query topic a. Planted blocks
// (runs of planted_run consecutive blocks) take topic a with noise scaled
// by planted_noise, so they are the most relevant blocks. Optional sink
// outliers (the first blocks) get a large vector in a direction of their
// own, like attention sinks.
//
// Payloads: a raw block in the layout of block_layout.h whose keys of head
// (l, h) are offset_lh + head_scale[l * H + h] * N(0, 1), rounded to the
// dtype; `keys` holds the values exactly as stored so that tests can compute
// reference means.
//
// Thread safety: pure functions of their options (same seed, same data).
#ifndef KVTIER_TESTS_TESTUTIL_SYNTHETIC_H_
#define KVTIER_TESTS_TESTUTIL_SYNTHETIC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "index/summary/block_layout.h"

namespace kvtier::testing {

struct SyntheticContextOptions {
  int64_t num_blocks = 1024;
  int32_t dim = 128;
  int32_t num_planted = 8;
  int32_t planted_run = 1;     // consecutive planted blocks per run
  float planted_noise = 0.3f;  // noise scale of planted blocks (x noise)
  float common = 1.0f;
  float topic = 1.0f;
  float noise = 0.5f;
  int32_t num_topics = 64;
  int32_t topic_run_min = 16;  // blocks per topic run
  int32_t topic_run_max = 256;
  // The anchor's topic: -1 = a fresh direction `a` shared only with the
  // planted blocks; k >= 0 = topic k of the context (no planting needed).
  int32_t anchor_topic = -1;
  int32_t num_sink_outliers = 0;
  float sink_scale = 8.0f;
  uint64_t seed = 1;
};

struct SyntheticContext {
  int32_t dim = 0;
  int64_t num_blocks = 0;
  std::vector<float> vectors;     // [num_blocks][dim]
  std::vector<float> anchor;      // [dim], unit norm
  std::vector<int64_t> planted;   // ascending block indices
  std::vector<int32_t> topic_of;  // [num_blocks]; -1 planted, -2 sink
};

SyntheticContext MakeSyntheticContext(const SyntheticContextOptions& options);

struct SyntheticPayload {
  std::string bytes;         // PayloadSizeBytes(layout) bytes
  std::vector<float> keys;   // [L][H][T][D], values as stored
  std::vector<double> mean;  // [D], exact mean of keys
};

// head_scale: L * H entries or empty (all 1).
SyntheticPayload MakeBlockPayload(const index::BlockLayout& layout, uint64_t seed,
                                  const std::vector<float>& head_scale);

// Exact top-k block indices by cosine to `anchor` (ties to lower index),
// ascending: the reference for recall measurements.
std::vector<int64_t> ExactTopK(const std::vector<float>& vectors, int32_t dim,
                               const std::vector<float>& anchor, int64_t k);

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTUTIL_SYNTHETIC_H_
