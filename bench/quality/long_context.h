// Long contexts built from the shared dumps' real keys, for judging and
// timing selection at 32K-1M tokens where no real dump exists.
//
// A LongContext of N tokens is laid out as
//   [0, N - 512)          windows of the model's other dumps, one after the
//                         other (cycling), each re-rotated to its new
//                         position
//   [far, far + 256)      overwrites the above: the recall dump's passage
//                         (its positions [0, 256)), far back
//   [N - 512, N)          the recall dump's positions [512, 1024): filler,
//                         then the passage read again
// and its queries are the recall dump's queries at positions 768 + stride s
// (the re-reading), placed at N - 256 + stride s. Keys and queries are moved to
// their new positions by the dumps' rotary embedding (rope_theta, half-split
// pairs (i, i + D/2)): q . k then depends on the new relative position as it
// would in the model. The copy heads' targets are therefore real and far
// back; everything else is real text of the same model.
//
// With pair_heads, a "head" is the concatenation of both KV heads of a layer
// (keys: kv 0 then kv 1; queries: a query head of group 0 then the one of
// group 1), so the small models' dumps give head_dim 2 D (128 for the shared
// models: a 7B-class head dimension with real structure).
//
// Thread safety: immutable after Build; Keys and Query are const.
#ifndef KVTIER_BENCH_QUALITY_LONG_CONTEXT_H_
#define KVTIER_BENCH_QUALITY_LONG_CONTEXT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/quality/kv_dump.h"
#include "index/select/calibration.h"
#include "index/summary/summary.h"

namespace kvtier::quality {

struct LongContextOptions {
  int64_t tokens = 131072;  // >= 2048, a multiple of 16
  // Queries query_stride tokens apart (1: consecutive decode steps), at
  // most 256 / query_stride of them.
  int32_t query_steps = 16;   // in [1, 256 / query_stride]
  int32_t query_stride = 16;  // in [1, 256]
  bool pair_heads = false;
  int64_t far_position = -1;  // -1: tokens / 7 rounded down to 256
  // Multiplies the far passage's keys: > 1 sharpens the copy heads'
  // attention on it (a "needle" a long context's other text cannot drown).
  float passage_key_scale = 1.0f;
};

class LongContext {
 public:
  // dumps: one model's 1,024-token dumps (at least one "-recall-" dump and
  // one other). InvalidArgument naming what is missing or mismatched.
  static absl::StatusOr<LongContext> Build(const std::vector<const KvDump*>& dumps,
                                           const LongContextOptions& options);

  int64_t tokens() const { return options_.tokens; }
  int32_t dim() const { return dim_; }
  int32_t num_layers() const { return layers_; }
  // KV heads per layer (1 with pair_heads).
  int32_t num_kv_heads() const { return kv_heads_; }
  int32_t num_q_heads() const { return q_heads_; }
  int32_t query_steps() const { return options_.query_steps; }
  // Token position of query step s.
  int64_t QueryPosition(int32_t s) const {
    return tokens() - 256 + int64_t{options_.query_stride} * s;
  }

  // Keys of (layer, kv_head) at positions [p0, p0 + n): out[n][dim].
  void Keys(int32_t layer, int32_t kv_head, int64_t p0, int64_t n, float* out) const;
  // Query of (layer, q_head) at query step s: out[dim].
  void Query(int32_t s, int32_t layer, int32_t q_head, float* out) const;
  // The retrieval heads' queries of step s in calibration order: [R][dim].
  std::vector<float> HeadQueries(int32_t s, const index::SelectionCalibration& c) const;

  // The summary a store would keep for block `page` (16 tokens) of a
  // calibrated profile: the pooled mean key (the tree's vector) and the int8
  // keys of KeyHeadsOf(c, num_kv_heads()).
  index::BlockSummary PageSummary(int64_t page, const index::SelectionCalibration& c) const;

 private:
  struct Segment {
    int64_t start, length;
    const KvDump* dump;
    int64_t source;  // first position in the dump
    // The rotation by start - source positions, per pair i: cos, sin.
    std::vector<double> cos, sin;
    double scale = 1.0;  // multiplies the keys
  };
  void AddSegment(int64_t start, int64_t length, const KvDump* dump, int64_t source,
                  double scale = 1.0);
  // x moved by the segment's rotation, times `scale`.
  void Rotated(const Segment& seg, const float* x, double scale, float* out) const;
  void SourceKey(const Segment& seg, int64_t p, int32_t layer, int32_t kv_head, float* out) const;

  LongContextOptions options_;
  int32_t dim_ = 0, src_dim_ = 0, layers_ = 0, kv_heads_ = 0, q_heads_ = 0, group_ = 0;
  double theta_ = 10000.0;
  std::vector<Segment> segments_;  // later ones overwrite earlier ones
  const KvDump* recall_ = nullptr;
};

}  // namespace kvtier::quality

#endif  // KVTIER_BENCH_QUALITY_LONG_CONTEXT_H_
