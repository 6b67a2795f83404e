#include "bench/quality/long_context.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvtier::quality {

absl::StatusOr<LongContext> LongContext::Build(const std::vector<const KvDump*>& dumps,
                                               const LongContextOptions& o) {
  if (o.tokens < 2048 || o.tokens % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("long context: tokens (", o.tokens, ") must be >= 2048, a multiple of 16"));
  }
  if (o.query_stride < 1 || o.query_stride > 256 || o.query_steps < 1 ||
      o.query_steps > 256 / o.query_stride) {
    return absl::InvalidArgumentError(absl::StrCat("long context: query_stride (", o.query_stride,
                                                   ") must be in [1, 256] and ", "query_steps (",
                                                   o.query_steps, ") in [1, 256 / query_stride]"));
  }
  LongContext c;
  c.options_ = o;
  std::vector<const KvDump*> fillers;
  for (const KvDump* d : dumps) {
    if (d->seq_len < 1024) {
      return absl::InvalidArgumentError(
          absl::StrCat("long context: dump ", d->name, " has ", d->seq_len, " tokens, needs 1024"));
    }
    if (c.recall_ == nullptr && absl::StrContains(d->name, "-recall-")) {
      c.recall_ = d;
    } else {
      fillers.push_back(d);
    }
  }
  if (c.recall_ == nullptr || fillers.empty()) {
    return absl::InvalidArgumentError("long context: needs a recall dump and another dump");
  }
  const KvDump& r = *c.recall_;
  for (const KvDump* d : dumps) {
    if (d->num_layers != r.num_layers || d->num_kv_heads != r.num_kv_heads ||
        d->num_q_heads != r.num_q_heads || d->head_dim != r.head_dim ||
        d->metadata.at("model") != r.metadata.at("model")) {
      return absl::InvalidArgumentError(
          absl::StrCat("long context: dump ", d->name, " is not of ", r.name, "'s model"));
    }
  }
  auto theta = r.metadata.find("rope_theta");
  if (theta == r.metadata.end() || !absl::SimpleAtod(theta->second, &c.theta_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("long context: dump ", r.name, " has no rope_theta"));
  }
  c.src_dim_ = r.head_dim;
  c.layers_ = r.num_layers;
  c.group_ = r.group_size();
  if (o.pair_heads) {
    c.dim_ = 2 * r.head_dim;
    c.kv_heads_ = 1;
    c.q_heads_ = c.group_;
  } else {
    c.dim_ = r.head_dim;
    c.kv_heads_ = r.num_kv_heads;
    c.q_heads_ = r.num_q_heads;
  }
  const int64_t N = o.tokens;
  const int64_t filler_end = N - 512;
  for (int64_t p = 0, i = 0; p < filler_end; p += 1024, ++i) {
    c.AddSegment(p, std::min<int64_t>(1024, filler_end - p), fillers[i % fillers.size()], 0);
  }
  int64_t far = o.far_position >= 0 ? o.far_position : N / 7 / 256 * 256;
  far = std::min(far, filler_end - 256);
  c.AddSegment(far, 256, c.recall_, 0, o.passage_key_scale);
  c.AddSegment(filler_end, 512, c.recall_, 512);
  return c;
}

void LongContext::AddSegment(int64_t start, int64_t length, const KvDump* dump, int64_t source,
                             double scale) {
  Segment seg{start, length, dump, source, {}, {}, scale};
  const int32_t half = src_dim_ / 2;
  for (int32_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(start - source) *
                         std::pow(theta_, -2.0 * i / static_cast<double>(src_dim_));
    seg.cos.push_back(std::cos(angle));
    seg.sin.push_back(std::sin(angle));
  }
  segments_.push_back(std::move(seg));
}

void LongContext::Rotated(const Segment& seg, const float* x, double scale, float* out) const {
  const int32_t half = src_dim_ / 2;
  for (int32_t i = 0; i < half; ++i) {
    const double a = scale * x[i], b = scale * x[i + half];
    out[i] = static_cast<float>(a * seg.cos[i] - b * seg.sin[i]);
    out[i + half] = static_cast<float>(a * seg.sin[i] + b * seg.cos[i]);
  }
}

void LongContext::SourceKey(const Segment& seg, int64_t p, int32_t layer, int32_t kv_head,
                            float* out) const {
  Rotated(seg, seg.dump->K(layer, kv_head, seg.source + (p - seg.start)), seg.scale, out);
}

void LongContext::Keys(int32_t layer, int32_t kv_head, int64_t p0, int64_t n, float* out) const {
  const size_t far = segments_.size() - 2;  // then the tail
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = p0 + i;
    const Segment* seg = &segments_[p / 1024 < static_cast<int64_t>(far) ? p / 1024 : far - 1];
    if (p >= segments_[far + 1].start) {
      seg = &segments_[far + 1];
    } else if (p >= segments_[far].start && p < segments_[far].start + segments_[far].length) {
      seg = &segments_[far];
    }
    float* dst = out + i * dim_;
    if (options_.pair_heads) {
      SourceKey(*seg, p, layer, 0, dst);
      SourceKey(*seg, p, layer, 1, dst + src_dim_);
    } else {
      SourceKey(*seg, p, layer, kv_head, dst);
    }
  }
}

void LongContext::Query(int32_t s, int32_t layer, int32_t q_head, float* out) const {
  // The tail segment moves the recall dump by the same N - 1024 positions.
  const Segment& tail = segments_.back();
  const int64_t src = 768 + int64_t{options_.query_stride} * s;
  Rotated(tail, recall_->Q(layer, q_head, src), 1.0, out);
  if (options_.pair_heads) {
    Rotated(tail, recall_->Q(layer, q_head + group_, src), 1.0, out + src_dim_);
  }
}

std::vector<float> LongContext::HeadQueries(int32_t s, const index::SelectionCalibration& c) const {
  std::vector<float> q(c.retrieval_heads.size() * dim_);
  for (size_t i = 0; i < c.retrieval_heads.size(); ++i) {
    Query(s, c.retrieval_heads[i].layer, c.retrieval_heads[i].q_head, &q[i * dim_]);
  }
  return q;
}

index::BlockSummary LongContext::PageSummary(int64_t page,
                                             const index::SelectionCalibration& c) const {
  constexpr int32_t kT = 16;
  index::BlockSummary s;
  s.dim = dim_;
  s.mean.assign(dim_, 0.0f);
  s.key_heads = index::KeyHeadsOf(c, kv_heads_);
  s.key_tokens = kT;
  s.head_keys.resize(s.key_heads.size() * kT * dim_);
  std::vector<float> keys(static_cast<size_t>(kT) * dim_);
  for (size_t j = 0; j < s.key_heads.size(); ++j) {
    const int32_t layer = s.key_heads[j] / kv_heads_, kv = s.key_heads[j] % kv_heads_;
    Keys(layer, kv, page * kT, kT, keys.data());
    for (int32_t t = 0; t < kT; ++t) {
      for (int32_t d = 0; d < dim_; ++d) s.mean[d] += keys[t * dim_ + d];
    }
    s.key_scales.push_back(
        index::QuantizeInt8(keys.data(), keys.size(), &s.head_keys[j * kT * dim_]));
  }
  const float inv = 1.0f / static_cast<float>(kT * std::max<size_t>(1, s.key_heads.size()));
  for (float& v : s.mean) v *= inv;
  return s;
}

}  // namespace kvtier::quality
