#include "index/select/scorer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "index/kernels/simd.h"
#include "index/kernels/unit_vector.h"
#include "index/validate.h"

namespace kvtier::index {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A double bound as a float: beyond the float range it saturates (the
// Selector scales queries first, so that it never ranks saturated values).
float Saturate(double v) {
  constexpr double kMax = std::numeric_limits<float>::max();
  return static_cast<float>(std::clamp(v, -kMax, kMax));
}

absl::Status Need(const float* p, const char* field, ScorerKind kind) {
  if (p != nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " is required by scorer ", ScorerName(kind), " but is null"));
}

// out[b] = (1 + cos(x, rows_b)) / 2 (sign = +1) or (1 - cos) / 2 (sign = -1).
void CosineScores(const float* rows, int64_t n, size_t dim, const float* x, float sign,
                  float* out) {
  std::vector<float> ux(dim), ur(dim);
  const bool x_nonzero = UnitVector(x, dim, ux.data());
  for (int64_t b = 0; b < n; ++b) {
    float cos = 0.0f;
    if (x_nonzero && UnitVector(rows + b * dim, dim, ur.data())) {
      cos = simd::Dot(ux.data(), ur.data(), dim);
    }
    cos = std::clamp(cos, -1.0f, 1.0f);
    out[b] = 0.5f * (1.0f + sign * cos);
  }
}

}  // namespace

absl::string_view ScorerName(ScorerKind kind) {
  switch (kind) {
    case ScorerKind::kKeyKey:
      return "keykey";
    case ScorerKind::kKeyKeyWeighted:
      return "keykey_weighted";
    case ScorerKind::kQuest:
      return "quest";
    case ScorerKind::kArkVale:
      return "arkvale";
    case ScorerKind::kKeyDiff:
      return "keydiff";
    case ScorerKind::kRecency:
      return "recency";
    case ScorerKind::kRandom:
      return "random";
    case ScorerKind::kMass:
      return "mass";
  }
  return "unknown";
}

absl::StatusOr<ScorerKind> ParseScorerKind(absl::string_view name) {
  for (int k = 0; k <= static_cast<int>(ScorerKind::kMass); ++k) {
    if (ScorerName(static_cast<ScorerKind>(k)) == name) {
      return static_cast<ScorerKind>(k);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("scorer \"", name, "\" is not a known scorer"));
}

bool ScoresInUnitInterval(ScorerKind kind) {
  return kind != ScorerKind::kQuest && kind != ScorerKind::kArkVale && kind != ScorerKind::kMass;
}

absl::Status ScoreBlocks(ScorerKind kind, const SummaryView& view, const ScoreInput& input,
                         absl::Span<float> out) {
  if (view.dim < 1 || view.dim > kMaxHeadDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("view.dim (", view.dim, ") must be in [1, ", kMaxHeadDim, "]"));
  }
  if (view.num_blocks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("context is empty (view.num_blocks ", view.num_blocks, ")"));
  }
  if (static_cast<int64_t>(out.size()) != view.num_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "out has ", out.size(), " elements, expected view.num_blocks ", view.num_blocks));
  }
  const size_t D = static_cast<size_t>(view.dim);
  const int64_t N = view.num_blocks;
  switch (kind) {
    case ScorerKind::kKeyKey:
    case ScorerKind::kKeyKeyWeighted: {
      const bool weighted = kind == ScorerKind::kKeyKeyWeighted;
      const float* rows = weighted ? view.weighted_mean : view.mean;
      if (absl::Status s = Need(rows, weighted ? "view.weighted_mean" : "view.mean", kind);
          !s.ok()) {
        return s;
      }
      if (absl::Status s = CheckVector("anchor", input.anchor, view.dim, true); !s.ok()) {
        return s;
      }
      CosineScores(rows, N, D, input.anchor.data(), 1.0f, out.data());
      return absl::OkStatus();
    }
    case ScorerKind::kQuest: {
      if (absl::Status s = Need(view.min, "view.min", kind); !s.ok()) return s;
      if (absl::Status s = Need(view.max, "view.max", kind); !s.ok()) return s;
      if (absl::Status s = CheckVector("query", input.query, view.dim, false); !s.ok()) {
        return s;
      }
      const float* q = input.query.data();
      for (int64_t b = 0; b < N; ++b) {
        const float* lo = view.min + b * D;
        const float* hi = view.max + b * D;
        double acc = 0;
        for (size_t i = 0; i < D; ++i) {
          acc += std::max(double{q[i]} * hi[i], double{q[i]} * lo[i]);
        }
        out[b] = Saturate(acc);
      }
      return absl::OkStatus();
    }
    case ScorerKind::kArkVale: {
      if (absl::Status s = Need(view.mean, "view.mean", kind); !s.ok()) {
        return s;
      }
      if (absl::Status s = Need(view.radius, "view.radius", kind); !s.ok()) {
        return s;
      }
      if (absl::Status s = CheckVector("query", input.query, view.dim, false); !s.ok()) {
        return s;
      }
      const float* q = input.query.data();
      const double qn = StableNorm(q, D);
      for (int64_t b = 0; b < N; ++b) {
        double dot = 0;
        for (size_t i = 0; i < D; ++i) dot += double{q[i]} * view.mean[b * D + i];
        out[b] = Saturate(dot + qn * view.radius[b]);
      }
      return absl::OkStatus();
    }
    case ScorerKind::kKeyDiff: {
      if (absl::Status s = Need(view.mean, "view.mean", kind); !s.ok()) {
        return s;
      }
      std::vector<float> m(D, 0.0f), u(D);
      for (int64_t b = 0; b < N; ++b) {
        if (!UnitVector(view.mean + b * D, D, u.data())) continue;
        for (size_t i = 0; i < D; ++i) m[i] += u[i];
      }
      CosineScores(view.mean, N, D, m.data(), -1.0f, out.data());
      return absl::OkStatus();
    }
    case ScorerKind::kRecency:
      for (int64_t b = 0; b < N; ++b) {
        out[b] = static_cast<float>(b + 1) / static_cast<float>(N);
      }
      return absl::OkStatus();
    case ScorerKind::kRandom: {
      const uint64_t base = SplitMix64(input.seed ^ SplitMix64(static_cast<uint64_t>(input.step)));
      for (int64_t b = 0; b < N; ++b) {
        const uint64_t r = SplitMix64(base + static_cast<uint64_t>(b));
        out[b] = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
      }
      return absl::OkStatus();
    }
    case ScorerKind::kMass:
      return absl::InvalidArgumentError(
          "scorer mass needs a context's KeyTable: run it through the "
          "Selector");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("scorer kind ", static_cast<int>(kind), " is unknown"));
}

SummaryTable::SummaryTable(int32_t dim, int32_t layer) : dim_(dim), layer_(layer) {}

absl::Status SummaryTable::Add(const BlockSummary& s) {
  const size_t D = static_cast<size_t>(dim_);
  if (s.dim != dim_) {
    return absl::InvalidArgumentError(
        absl::StrCat("summary.dim (", s.dim, ") does not match the table's dim (", dim_, ")"));
  }
  const float* mean = nullptr;
  const float* lo = nullptr;
  const float* hi = nullptr;
  bool weighted = false;
  if (layer_ < 0) {
    if (s.mean.size() != D) {
      return absl::InvalidArgumentError("summary.mean is missing");
    }
    mean = s.mean.data();
    if (s.min.size() == D && s.max.size() == D) {
      lo = s.min.data();
      hi = s.max.data();
    }
    weighted = s.weighted_mean.size() == D;
  } else {
    const size_t off = static_cast<size_t>(layer_) * D;
    if (layer_ >= s.num_layers || s.layer_mean.size() < off + D) {
      return absl::InvalidArgumentError(absl::StrCat("summary.layer_mean has no layer ", layer_,
                                                     " (num_layers ", s.num_layers, ")"));
    }
    mean = s.layer_mean.data() + off;
    if (s.layer_min.size() >= off + D && s.layer_max.size() >= off + D) {
      lo = s.layer_min.data() + off;
      hi = s.layer_max.data() + off;
    }
  }
  const bool bounds = lo != nullptr;
  if (num_blocks_ == 0) {
    has_weighted_ = weighted;
    has_bounds_ = bounds;
  } else if (has_weighted_ != weighted || has_bounds_ != bounds) {
    return absl::InvalidArgumentError(
        "summary has a different set of optional arrays than earlier blocks");
  }
  if (absl::Status st = CheckFinite("summary.mean", mean, D); !st.ok()) {
    return st;
  }
  mean_.insert(mean_.end(), mean, mean + D);
  if (weighted) {
    weighted_mean_.insert(weighted_mean_.end(), s.weighted_mean.begin(), s.weighted_mean.end());
  }
  if (bounds) {
    min_.insert(min_.end(), lo, lo + D);
    max_.insert(max_.end(), hi, hi + D);
    radius_.push_back(layer_ < 0 ? s.radius : 0.0f);
  }
  ++num_blocks_;
  return absl::OkStatus();
}

SummaryView SummaryTable::view() const {
  SummaryView v;
  v.dim = dim_;
  v.num_blocks = num_blocks_;
  v.mean = mean_.empty() ? nullptr : mean_.data();
  v.weighted_mean = has_weighted_ ? weighted_mean_.data() : nullptr;
  v.min = has_bounds_ ? min_.data() : nullptr;
  v.max = has_bounds_ ? max_.data() : nullptr;
  v.radius = has_bounds_ && layer_ < 0 ? radius_.data() : nullptr;
  return v;
}

}  // namespace kvtier::index
