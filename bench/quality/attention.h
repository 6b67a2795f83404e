// Exact causal attention of one query position of a dump, aggregated per
// block: the ground truth every scorer is judged against.
//
// For query position t, layer l and query head h (KV head h / group):
//   p_j   = softmax_j(q[l,h,t] . k[l,kvh,j] / sqrt(D)),  j in [0, t]
//   m_b   = sum_{j in block b} p_j                     (block mass)
//   u_b   = sum_{j in block b} p_j v[l,kvh,j]          (block partial output)
//   o     = sum_b u_b                                  (full output)
// Blocks are [b * block_size, (b + 1) * block_size); the last visible block
// (the one holding t) may be partial. Sums are accumulated in double.
//
// Thread safety: pure functions; a StepAttention is a plain value.
#ifndef KVTIER_BENCH_QUALITY_ATTENTION_H_
#define KVTIER_BENCH_QUALITY_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "bench/quality/kv_dump.h"

namespace kvtier::quality {

struct StepAttention {
  int64_t t = 0;
  int32_t block_size = 0;
  int32_t num_heads = 0;  // layers * q_heads; index lh = l * q_heads + h
  int32_t head_dim = 0;
  int64_t num_blocks = 0;      // ceil((t + 1) / block_size)
  std::vector<float> mass;     // [lh][num_blocks]
  std::vector<float> partial;  // [lh][num_blocks][D]; empty unless outputs
  std::vector<float> output;   // [lh][D]; empty unless outputs
  std::vector<float> probs;    // [lh][t + 1]; empty unless probs

  const float* Mass(int32_t lh) const { return &mass[lh * num_blocks]; }
  const float* Partial(int32_t lh, int64_t b) const {
    return &partial[(lh * num_blocks + b) * head_dim];
  }
  const float* Output(int32_t lh) const { return &output[lh * head_dim]; }
  const float* Probs(int32_t lh) const { return &probs[lh * (t + 1)]; }
};

struct AttentionOptions {
  bool outputs = true;  // fill partial and output
  bool probs = false;   // fill probs (token level)
};

// Fills *out for query position t (0 <= t < dump.seq_len, block_size >= 1;
// callers check). Reuses out's capacity.
void ComputeStepAttention(const KvDump& dump, int64_t t, int32_t block_size,
                          const AttentionOptions& options, StepAttention* out);

// Sum of mass over every (layer, head): out[b] for b < num_blocks.
void TotalMass(const StepAttention& a, std::vector<double>* out);

}  // namespace kvtier::quality

#endif  // KVTIER_BENCH_QUALITY_ATTENTION_H_
