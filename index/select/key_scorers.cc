#include "index/select/key_scorers.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "index/kernels/simd.h"
#include "index/kernels/unit_vector.h"

namespace kvtier::index {

absl::Status LayerKeyKeyScores(const KeyTable& table, absl::Span<const float> anchor, bool centered,
                               KeyScorerScratch* s, absl::Span<float> out) {
  const int32_t L = table.options().num_layers;
  const size_t D = static_cast<size_t>(table.options().dim);
  const int64_t n = table.size();
  if (L < 1 || anchor.size() != L * D || static_cast<int64_t>(out.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("per-layer key-key needs an anchor of ", L,
                                                   " x ", D, " values (got ", anchor.size(),
                                                   ") and ", n, " outputs (got ", out.size(), ")"));
  }
  s->unit.resize(L * D);
  s->centre.resize(L * D);
  std::vector<double> au(L, 0.0), anorm(L, 1.0);
  for (int32_t l = 0; l < L; ++l) {
    float* a = &s->unit[l * D];
    if (!UnitVector(&anchor[l * D], D, a)) {
      return absl::InvalidArgumentError(
          absl::StrCat("anchor row ", l, " (layer ", l, ") is all zero"));
    }
    if (!centered) continue;
    s->row.resize(D);
    const double* sum = table.LayerSum(l);
    for (size_t d = 0; d < D; ++d) s->row[d] = static_cast<float>(sum[d] / n);
    float* u = &s->centre[l * D];
    UnitVector(s->row.data(), D, u);
    double dot = 0;
    for (size_t d = 0; d < D; ++d) dot += double{a[d]} * u[d];
    au[l] = dot;
    anorm[l] = std::sqrt(std::max(0.0, 1.0 - dot * dot));
  }
  const double inv_layers = 1.0 / L;
  // One strided pass over the context per layer (and per vector).
  s->total.assign(n, 0.0);
  s->ra.resize(n);
  s->ru.resize(n);
  const size_t stride = static_cast<size_t>(L) * D;
  for (int32_t l = 0; l < L; ++l) {
    simd::DotRowsInt8(table.LayerRow(0, l), n, stride, D, &s->unit[l * D], s->ra.data());
    if (centered) {
      simd::DotRowsInt8(table.LayerRow(0, l), n, stride, D, &s->centre[l * D], s->ru.data());
    }
    for (int64_t b = 0; b < n; ++b) {
      const double scale = table.LayerScale(b, l);
      double ra = scale * s->ra[b];
      double r2 = table.LayerNorm2(b, l);
      double an = 1.0;
      if (centered) {
        const double ru = scale * s->ru[b];
        ra -= ru * au[l];
        r2 -= ru * ru;
        an = anorm[l];
      }
      double cos = 0;
      if (r2 > 0 && an > 0) cos = ra / (std::sqrt(r2) * an);
      s->total[b] += 0.5 * (1.0 + std::clamp(cos, -1.0, 1.0));
    }
  }
  for (int64_t b = 0; b < n; ++b) {
    out[b] = static_cast<float>(s->total[b] * inv_layers);
  }
  return absl::OkStatus();
}

// One head's softmax over the stored keys: its logit scale (before the
// table's per-block scale) and the largest block log-sum-exp.
struct HeadSoftmax {
  double scale = 0;
  double lse_top = 0;
};

// A copying head's attention `lead` tokens on (ObserveCopy): the last
// `lead` tokens' share of each block (exp(logit - lse_top), as s->lse)
// moves to the block after it; the last block's goes past the stored
// blocks (the engine's partial block).
void ShiftForward(const KeyTable& table, int32_t slot, const HeadSoftmax& softmax, int32_t lead,
                  KeyScorerScratch* s) {
  const int64_t n = static_cast<int64_t>(s->lse.size());
  const int32_t T = table.options().key_tokens;
  const double scale = softmax.scale, lse_top = softmax.lse_top;
  double carry = 0;
  for (int64_t b = 0; b < n; ++b) {
    double tail = 0;
    if (s->lse[b] > 0) {
      const double f = scale * table.HeadScale(b, slot);
      const float* l = &s->logits[b * T];
      for (int32_t t = T - std::min(lead, T); t < T; ++t) tail += std::exp(f * l[t] - lse_top);
    }
    s->lse[b] = std::max(0.0, s->lse[b] - tail) + carry;
    carry = tail;
  }
}

float StepMinHeadMass(const SelectionCalibration& c, const MassMemory* memory, int32_t head) {
  if (c.copy_run == 0 || memory == nullptr ||
      static_cast<size_t>(head) >= memory->tracks_before.size()) {
    return MinHeadMass(c);
  }
  const CopyTrack& before = memory->tracks_before[head];
  const bool held = before.confirmed >= 0 && memory->step - before.confirmed <= c.copy_hold;
  return held || before.run + 1 >= c.copy_run ? MinHeadMass(c) : c.head_min_mass;
}

HeadGate ObserveCopy(const SelectionCalibration& c, MassMemory* memory, int32_t head,
                     KeyPosition key) {
  const int64_t token = key.token;
  if (c.copy_run == 0 || memory == nullptr) return {c.head_min_mass, 1.0f, 0};
  const size_t heads = c.retrieval_heads.size();
  if (memory->tracks.size() != heads) memory->tracks.resize(heads);
  if (memory->tracks_before.size() != heads) memory->tracks_before.resize(heads);
  const CopyTrack& before = memory->tracks_before[head];
  CopyTrack& now = memory->tracks[head];
  const int64_t step = memory->step;
  now = before;
  if (token >= 0) {
    const bool forward = before.step >= 0 && step > before.step && before.token >= 0 &&
                         token - before.token == step - before.step;
    now.run = forward ? std::min(before.run, INT32_MAX - 1) + 1 : 0;
    now.token = token;
    now.step = step;
    if (now.run >= c.copy_run && key.pages_back >= c.copy_min_blocks) now.confirmed = step;
  }
  const bool copying = now.confirmed >= 0 && step - now.confirmed <= c.copy_hold;
  if (copying) {
    return {c.copy_min_mass >= 0 ? c.copy_min_mass : c.head_min_mass, c.copy_weight, c.copy_lead};
  }
  return {c.head_min_mass, c.uncopied_weight, 0};
}

absl::Status MassScores(const MassScoreInput& in, KeyScorerScratch* s, absl::Span<float> out) {
  const KeyTable* table = in.table;
  const SelectionCalibration& c = *in.calibration;
  const absl::Span<const int32_t> slots = in.slots;
  const int32_t dim = in.dim;
  const int64_t n = in.n;
  const absl::Span<const float> head_queries = in.head_queries;
  MassMemory* memory = in.memory;
  if (static_cast<int64_t>(out.size()) != n || n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("out has ", out.size(), " values for ", n, " pages"));
  }
  if (!c.calibrated()) {
    for (int64_t b = 0; b < n; ++b) {
      out[b] = static_cast<float>(b + 1) / static_cast<float>(n);
    }
    return absl::OkStatus();
  }
  const bool with_queries = !head_queries.empty();
  for (int64_t b = 0; b < n; ++b) out[b] = PriorOf(c, with_queries, n, b);
  if (!with_queries) return absl::OkStatus();
  const size_t D = static_cast<size_t>(dim);
  const size_t R = c.retrieval_heads.size();
  if (table == nullptr || table->size() != n || slots.size() != R || head_queries.size() != R * D) {
    return absl::InvalidArgumentError(absl::StrCat("head_queries has ", head_queries.size(),
                                                   " values; expected ", R, " retrieval heads x ",
                                                   D, " (and a context with their keys)"));
  }
  const int32_t T = table->options().key_tokens;
  const double softmax_scale =
      c.softmax_scale > 0 ? c.softmax_scale : 1.0 / std::sqrt(static_cast<double>(dim));
  s->lse.resize(n);
  s->row.resize(D);
  for (size_t i = 0; i < R; ++i) {
    const float* q = &head_queries[i * D];
    float qmax = 0.0f;
    for (size_t d = 0; d < D; ++d) qmax = std::max(qmax, std::fabs(q[d]));
    if (!(qmax > 0)) {
      return absl::InvalidArgumentError(absl::StrCat("head_queries row ", i, " is all zero"));
    }
    // Scaled to [-1, 1] so that the float dot cannot overflow; the scale
    // comes back in double.
    for (size_t d = 0; d < D; ++d) s->row[d] = q[d] / qmax;
    const int32_t slot = slots[i];
    // Pass 1: every token's dot and each block's largest logit; the
    // strongest key of all (copy tracking).
    s->logits.resize(static_cast<size_t>(n) * T);
    s->top.resize(n);
    double top = -INFINITY;
    int64_t strongest = -1;
    for (int64_t b = 0; b < n; ++b) {
      float* l = &s->logits[b * T];
      simd::DotRowsInt8(table->HeadKeys(b, slot), T, D, D, s->row.data(), l);
      int32_t arg = 0;
      for (int32_t t = 1; t < T; ++t) {
        if (l[t] > l[arg]) arg = t;
      }
      const double f = softmax_scale * qmax * table->HeadScale(b, slot);
      s->top[b] = f * l[arg];
      if (s->top[b] > top) {
        top = s->top[b];
        strongest = b * T + arg;
      }
    }
    const HeadGate gate =
        ObserveCopy(c, memory, static_cast<int32_t>(i), PositionOf(strongest, n, T));
    if (!(gate.weight > 0)) continue;
    // Pass 2: lse = f * max + log sum exp(f * (dot - max)) (exponents <= 0,
    // so exp cannot overflow whatever the query's scale). A block whose
    // largest logit is kSkip below the best one weighs under e^-kSkip * T
    // in the softmax: its largest logit stands for it.
    constexpr double kSkip = 30.0;
    double z = 0;
    for (int64_t b = 0; b < n; ++b) {
      double lse = s->top[b];
      if (s->top[b] > top - kSkip) {
        const double f = softmax_scale * qmax * table->HeadScale(b, slot);
        const float* l = &s->logits[b * T];
        float top_dot = l[0];
        for (int32_t t = 1; t < T; ++t) top_dot = std::max(top_dot, l[t]);
        lse += std::log(static_cast<double>(
            simd::SumExpBelow(l, T, static_cast<float>(std::min(f, 1e30)), top_dot)));
      }
      s->lse[b] = lse;
    }
    double lse_top = -INFINITY;
    for (int64_t b = 0; b < n; ++b) lse_top = std::max(lse_top, s->lse[b]);
    for (int64_t b = 0; b < n; ++b) {
      s->lse[b] = s->lse[b] > lse_top - 80 ? std::exp(s->lse[b] - lse_top) : 0.0;
      z += s->lse[b];
    }
    if (gate.lead > 0) ShiftForward(*table, slot, {softmax_scale * qmax, lse_top}, gate.lead, s);
    const double w = c.head_weights.empty() ? 1.0 : c.head_weights[i];
    for (int64_t b = 0; b < n; ++b) {
      const double p = s->lse[b] / z;
      if (!(p >= gate.min_mass)) continue;  // NaN never counts
      out[b] += static_cast<float>(w * (p * gate.weight));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvtier::index
